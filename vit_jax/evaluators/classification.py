"""Accuracy and loss over every example of a test split.

A prediction is right if its top class is a label: one label, or a set of
them (ImageNet ReaL, `pp.label='imagenet2012_real'`).
"""

import functools

import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.evaluators import common

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


class Evaluator(common.Evaluator):
  """`type='classification'`: settings `dataset` and `split` (default: the
  run's dataset and `pp.test`); metrics `accuracy`, `loss`, `count`."""

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
    self.step = jax.jit(functools.partial(eval_step, apply_fn=model.apply,
                                          loss=config.loss))

  def __call__(self, params):
    return common.masked_means(self.step, params, self.info, self.data,
                               self.mesh)

  def summary(self, metrics):
    return (f'test accuracy {metrics["accuracy"]:.4f}  loss '
            f'{metrics["loss"]:.4f}  ({metrics["count"]} examples)')

  def scalars(self, metrics):
    return {'eval_accuracy': metrics['accuracy'],
            'eval_loss': metrics['loss']}
