"""NaViT's evaluators: accuracy at each of `config.navit.eval_sides`, for
NaViT on packed sequences and for its plain-ViT baseline (position table
resized to each side)."""

import jax
import jax.numpy as jnp

from vit_jax.data import navit as navit_data
from vit_jax.data import packing
from vit_jax.data import pipeline
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.models import posemb_resize
from vit_jax.models import registry as models_registry
from vit_jax.models import vit as models_vit
from vit_jax.platform import sharding


def _count_correct(logits, labels):
  real = labels >= 0
  right = (jnp.argmax(logits, -1) == labels) & real
  return jnp.sum(right), jnp.sum(real)


def _accuracy(step, params, batches, mesh, batch_size):
  """Accuracy of `step(params, batch) -> (right, count)` over global
  host `batches` (this process's rows go to the mesh)."""
  rows = sharding.process_rows(mesh, batch_size)
  local = ({k: v[rows] for k, v in b.items()} for b in batches)
  right = count = 0
  for batch in sharding.global_batches(local, mesh, batch_size):
    r, c = jax.device_get(step(params, batch))
    right, count = right + int(r), count + int(c)
  return right / max(count, 1)


class _PerSide(common.Evaluator):
  """Accuracy at each of `config.navit.eval_sides` (`accuracy_{side}px`),
  on the test split of the run's dataset."""

  in_config = False  # the NaViT task's own: it reads `config.navit`

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    self.config, self.model, self.mesh = config, model, mesh
    self.info = pipeline.dataset_info(pipeline.get_builder(config), config)
    self.sides = tuple(int(s) for s in config.navit.eval_sides)

  def summary(self, metrics):
    parts = [f'{k[len("accuracy_"):]} {v:.4f}' for k, v in metrics.items()
             if k.startswith('accuracy_')]
    line = 'test accuracy at ' + ', '.join(parts)
    if 'packing_efficiency' in metrics:
      line += f'; packing efficiency {metrics["packing_efficiency"]:.3f}'
    return line


@registry.register('navit_packed')
class PackedEvaluator(_PerSide):
  """NaViT's accuracy at fixed sides and on the mixed stream."""

  def __init__(self, name, settings, **kw):
    super().__init__(name, settings, **kw)
    model = self.model
    self.step = jax.jit(lambda params, batch: _count_correct(model.apply(
        {'params': params}, {k: batch[k] for k in packing.KEYS},
        train=False), batch['labels']))
    self.efficiency = None

  def _run(self, params, examples):
    return _accuracy(self.step, params, navit_data.packed_test_batches(
        examples, self.config, self.config.batch_eval), self.mesh,
                     self.config.batch_eval)

  def __call__(self, params):
    config, patch = self.config, self.config.model.patches.size[0]
    out = {}
    for side in self.sides:
      out[f'accuracy_{side}px'] = self._run(params, (
          navit_data.fixed_side(im, lb, side, patch, config.pp)
          for im, lb in navit_data.eval_images(self.info, config)))
    sizes = navit_data.sampling(config, drop_rate=0.0)
    recipes = packing.Recipes(config.seed, sizes, stream=navit_data.MIXED_STREAM)
    out['accuracy_mixed'] = self._run(params, (
        navit_data.mixed(i, im, lb, recipes, sizes, config.pp)
        for i, (im, lb) in enumerate(navit_data.eval_images(self.info, config))))
    if self.efficiency is None:
      self.efficiency = navit_data.training_efficiency(config)
    out['packing_efficiency'] = self.efficiency
    return out


@registry.register('navit_resized')
class ResizedEvaluator(_PerSide):
  """A plain ViT's accuracy at each side, its position table resized (as
  its family resizes) to that side's grid; images as NaViT's
  (`fixed_side`)."""

  def _at_side(self, params, side):
    """`params` with the position table of the grid at `side`."""
    params = jax.device_get(params)
    tables = params['Transformer']['posembed_input']
    grid = (side // self.config.model.patches.size[0],) * 2
    table = posemb_resize.resize_posemb_grid(
        tables['pos_embedding'], new_grid=grid,
        has_class_token=models_vit.posemb_prefix_tokens(self.config.model),
        method=models_registry.posemb_resize_method(self.config.model_name))
    return {**params, 'Transformer': {**params['Transformer'],
                                      'posembed_input': {
                                          **tables, 'pos_embedding': table}}}

  def __call__(self, params):
    config = self.config
    step = jax.jit(lambda p, batch: _count_correct(self.model.apply(
        {'params': p}, batch['image'], train=False), batch['labels']))
    out = {}
    for side in self.sides:
      batches = navit_data.image_batches(((navit_data.square(im, side, config.pp), lb)
                                for im, lb in navit_data.eval_images(self.info, config)),
                               config.batch_eval)
      out[f'accuracy_{side}px'] = _accuracy(
          step, self._at_side(params, side), batches, self.mesh,
          config.batch_eval)
    return out
