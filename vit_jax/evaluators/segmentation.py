"""Semantic segmentation: mean IoU and pixel accuracy over a test split.

Per class, IoU = TP / (TP + FP + FN) over all the split's pixels (not per
image), from one confusion matrix; the mean is over the classes that occur
in the labels or the predictions (mmsegmentation's). Pixels labelled
`segmentation.ignore_label`, and padding examples, count for nothing.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.data import segmentation as segmentation_data
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.models import segmentation


def confusion(labels, predictions, valid, num_classes: int):
  """(K, K) counts of (label, predicted class) over the `valid` pixels."""
  index = jnp.where(valid, labels * num_classes + predictions, 0)
  return jnp.bincount(index.ravel(), weights=valid.ravel().astype(jnp.int32),
                      length=num_classes**2).reshape(num_classes,
                                                     num_classes)


def scores(counts) -> dict:
  """Mean IoU, pixel accuracy and each class's IoU (NaN where a class
  occurs nowhere) of a confusion matrix."""
  counts = np.asarray(counts, np.float64)
  hits = np.diag(counts)
  union = counts.sum(0) + counts.sum(1) - hits
  iou = np.where(union > 0, hits / np.maximum(union, 1), np.nan)
  return {'miou': float(np.nanmean(iou)),
          'pixel_accuracy': float(hits.sum() / max(counts.sum(), 1)),
          'iou_per_class': [float(x) for x in iou]}


def eval_step(variables, batch, *, model, num_classes, ignore_label):
  """The confusion matrix of a batch."""
  labels = batch['segmentation']
  logits = segmentation.upsample(model.apply(variables, batch['image']),
                                 labels.shape[1:])
  valid = (labels != ignore_label) & (batch['mask'][:, None, None] > 0)
  return confusion(labels, jnp.argmax(logits, -1), valid, num_classes)


@registry.register('segmentation')
class Evaluator(common.Evaluator):
  """`type='segmentation'`: settings `dataset` and `split` (default: the
  run's and `pp.test`); metrics `miou`, `pixel_accuracy`,
  `iou_per_class`. Its model is a dense one (`models.segmentation.DENSE`)
  of the classes."""

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    if not isinstance(model, segmentation.DENSE) or (
        config.pp.get('label') != 'segmentation_mask'):
      raise ValueError(f'config.evals.{name}: a segmentation evaluator needs '
                       "trainer='segmentation' with "
                       "pp.label='segmentation_mask'.")
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    self.mesh = mesh
    self.step = jax.jit(functools.partial(
        eval_step, model=model, num_classes=self.info.num_classes,
        ignore_label=config.segmentation.ignore_label))

  def __call__(self, variables):
    total = None
    for batch in common.batches(self.info, self.data, self.mesh,
                                segmentation_data.eval_example):
      counts = self.step(variables, batch)
      total = counts if total is None else total + counts
    return scores(jax.device_get(total))

  def summary(self, metrics):
    return (f'mean IoU {metrics["miou"]:.4f}  pixel accuracy '
            f'{metrics["pixel_accuracy"]:.4f}')
