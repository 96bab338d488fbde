"""Relative depth: AbsRel and delta1 over a test split, as MiDaS and Depth
Anything score relative (affine-invariant) depth.

The model predicts disparity up to scale and shift; the truth is disparity
(the `depth` label: 0 where unknown). Per image, over its known pixels,
the prediction p is aligned to the true disparity g by least squares,
(s, t) = argmin sum (s p + t - g)^2 (MiDaS, Ranftl et al., 2020, Sec. 5),
then both become depth, 1 / disparity, the aligned disparity first held
above 1 / (the image's largest true depth) (MiDaS caps it at the
benchmark's largest depth; here the image's). On depth d (predicted) and
d* (true): AbsRel = mean |d - d*| / d*, delta1 = the fraction of pixels
with max(d / d*, d* / d) < 1.25. Both are means over the images, of the
images with a known pixel (padding counts for nothing).
"""

import functools

import jax
import jax.numpy as jnp

from vit_jax.data import segmentation as segmentation_data
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.models import segmentation

DELTA = 1.25


def align_scale_shift(prediction, target, valid):
  """(s, t) per image minimizing sum over `valid` of (s p + t - g)^2:
  (batch,) each, of (batch, n) rows; s = 0 and t = mean(g) where p is flat.
  """
  count = jnp.maximum(jnp.sum(valid, -1, keepdims=True), 1)
  mean = lambda x: jnp.sum(x * valid, -1, keepdims=True) / count
  p, g = prediction - mean(prediction), target - mean(target)  # centred:
  # the normal equations without the cancellation of raw moments.
  var = jnp.sum(p * p * valid, -1)
  s = jnp.where(var > 0, jnp.sum(p * g * valid, -1) /
                jnp.where(var > 0, var, 1), 0.)
  t = mean(target)[:, 0] - s * mean(prediction)[:, 0]
  return s, t


def depth_errors(prediction, disparity, valid):
  """(AbsRel, delta1) of each image, (batch,) each, as the module says:
  `prediction` and `disparity` (batch, H, W), `valid` where it is known
  (and > 0)."""
  batch = prediction.shape[0]
  p, g, valid = (x.reshape(batch, -1) for x in (prediction, disparity, valid))
  p, g = p.astype(jnp.float32), g.astype(jnp.float32)
  s, t = align_scale_shift(p, g, valid)
  true = 1 / jnp.where(valid, g, 1.)
  least = jnp.min(jnp.where(valid, g, jnp.inf), -1, keepdims=True)
  aligned = jnp.maximum(s[:, None] * p + t[:, None], least)
  depth = 1 / aligned
  count = jnp.maximum(jnp.sum(valid, -1), 1)
  abs_rel = jnp.sum(jnp.abs(depth - true) / true * valid, -1) / count
  ratio = jnp.maximum(depth / true, true / depth)
  delta1 = jnp.sum((ratio < DELTA) * valid, -1) / count
  return abs_rel, delta1


def eval_step(variables, batch, *, model):
  """Sums over the batch's images of AbsRel and delta1, and their count."""
  disparity = batch['depth']
  out = segmentation.upsample(model.apply(variables, batch['image']),
                              disparity.shape[1:])[..., 0]
  valid = (disparity > 0) & (batch['mask'][:, None, None] > 0)
  abs_rel, delta1 = depth_errors(out, disparity, valid)
  counted = jnp.any(valid, (1, 2))
  return {'abs_rel': jnp.sum(abs_rel * counted),
          'delta1': jnp.sum(delta1 * counted), 'count': jnp.sum(counted)}


@registry.register('depth')
class Evaluator(common.Evaluator):
  """`type='depth'`: settings `dataset` and `split` (default: the run's and
  `pp.test`); metrics `abs_rel`, `delta1`. Its model is a dense one
  (`models.segmentation.DENSE`) of the depth (`pp.label='depth'`)."""

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    if not isinstance(model, segmentation.DENSE) or (
        config.pp.get('label') != 'depth'):
      raise ValueError(f'config.evals.{name}: a depth evaluator needs '
                       "trainer='segmentation' with pp.label='depth'.")
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    self.mesh = mesh
    self.step = jax.jit(functools.partial(eval_step, model=model))

  def __call__(self, variables):
    total = None
    for batch in common.batches(self.info, self.data, self.mesh,
                                segmentation_data.eval_example):
      sums = self.step(variables, batch)
      total = sums if total is None else jax.tree.map(jnp.add, total, sums)
    total = jax.device_get(total)
    count = max(int(total['count']), 1)
    return {'abs_rel': float(total['abs_rel']) / count,
            'delta1': float(total['delta1']) / count}

  def summary(self, metrics):
    return (f'AbsRel {metrics["abs_rel"]:.4f}  delta1 '
            f'{metrics["delta1"]:.4f}')
