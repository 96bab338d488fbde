"""Accuracy and loss over every example of a test split.

A prediction is right if its top class is a label: one label, or a set of
them (ImageNet ReaL, `pp.label='imagenet2012_real'`).
"""

import functools

import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.evaluators import common
from vit_jax.evaluators import registry

def eval_step(params, batch, *, apply_fn, loss: str):
  """Masked clu averages of correctness and loss."""
  logits = apply_fn({'params': params}, batch['image'], train=False)
  labels = batch['label']
  top = jnp.argmax(logits, -1)[:, None]
  correct = jnp.take_along_axis(labels, top, -1)[:, 0] > 0
  if loss == 'softmax_xent':  # a set of k labels: 1/k each
    labels = labels / jnp.maximum(labels.sum(-1, keepdims=True), 1)
  return {'accuracy': common.masked_average(correct, batch['mask']),
          'loss': common.masked_average(losses.classification(logits, labels, loss),
                                        batch['mask'])}


@registry.register('classification')
class Evaluator(common.Evaluator):
  """`type='classification'`: settings `dataset` and `split` (default: the
  run's dataset and `pp.test`); metrics `accuracy`, `loss`, `count`.

  Setting `patch_size` (a ViT's, FlexiViT): evaluates at that patch size,
  metrics `accuracy_patch{p}`, `loss_patch{p}`, `count`.
  """

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    if self.info.num_classes != model.num_classes:
      raise common.HeadMismatch(
          f'config.evals.{name}: the test data has {self.info.num_classes} '
          'classes; the model has ' + (f'a head of {model.num_classes}'
                                       if model.num_classes else 'no head')
          + '.')
    self.mesh = mesh
    self.patch_size = settings.get('patch_size')
    apply_fn = model.apply
    if self.patch_size:
      apply_fn = functools.partial(model.apply, patch_size=self.patch_size)
    # Evaluators at several patch sizes write their metrics side by side.
    self.suffix = f'_patch{self.patch_size}' if self.patch_size else ''
    self.step = jax.jit(functools.partial(eval_step, apply_fn=apply_fn,
                                          loss=config.loss))

  def __call__(self, params):
    metrics = common.masked_means(self.step, params, self.info, self.data,
                                  self.mesh)
    return {k if k == 'count' else k + self.suffix: v
            for k, v in metrics.items()}

  def summary(self, metrics):
    at = f' at patch {self.patch_size}' if self.patch_size else ''
    return (f'test accuracy{at} {metrics["accuracy" + self.suffix]:.4f}  '
            f'loss {metrics["loss" + self.suffix]:.4f}  ({metrics["count"]} '
            'examples)')

  def scalars(self, metrics):
    return {'eval_accuracy' + self.suffix: metrics['accuracy' + self.suffix],
            'eval_loss' + self.suffix: metrics['loss' + self.suffix]}
