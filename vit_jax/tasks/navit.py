"""NaViT (`trainer='navit'`, Dehghani et al., 2023): one model for every
resolution and aspect ratio, trained on packed sequences (`packing`).

Settings under `config.navit`: `max_tokens` (per sequence), `window`
(images the greedy packer looks ahead), `side_range` (px of a training
image's longer side), `aspect_range` (width / height of its random crop),
`drop_rate` (NaViT's token dropping: a (lo, hi) range drawn per
image; (r, r) fixed), `eval_sides` and `eval_every`. `config.batch` counts sequences;
`config.model` is a `models_navit.NaViT`'s (`max_images` per sequence).

`config.navit.packed=False` trains the plain ViT of `config.model` at
`pp.crop` instead (the classification task), as the baseline of NaViT's
comparison: evaluated at the same sides by resizing its position table.

Both write `accuracy_{side}px` per side to `results.json`; NaViT also
`accuracy_mixed` (test images at random sides and crops, packed) and
`packing_efficiency` (real tokens / all tokens of the run's training
batches).
"""


import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax.data import navit as navit_data
from vit_jax.data import packing
from vit_jax.data import pipeline
from vit_jax.evaluators import registry as evaluators
from vit_jax.models import navit as models_navit
from vit_jax.checkpoints import loading
from vit_jax.tasks import base
from vit_jax.tasks import classification
from vit_jax.tasks import registry

SETTINGS = ('packed', 'max_tokens', 'window', 'side_range', 'aspect_range',
            'drop_rate', 'eval_sides', 'eval_every')


def check_settings(config):
  """Fails fast on `config.navit`: present and complete."""
  settings = config.get('navit')
  if settings is None:
    raise ValueError("config.trainer='navit' needs config.navit (see "
                     'configs/navit_fmnist.py).')
  missing = [k for k in SETTINGS if k not in settings]
  if missing:
    raise ValueError(f'config.navit lacks {missing}.')
  return settings


def image_loss(logits, labels):
  """Softmax cross-entropy averaged over the real images (labels >= 0)."""
  real = labels >= 0
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.maximum(labels, 0))
  return jnp.sum(losses * real) / jnp.maximum(jnp.sum(real), 1)


@registry.register
class Task(base.Task):
  """NaViT on packed sequences: its model, step, batches and evaluator."""

  trainers = ('navit',)

  @classmethod
  def evaluates(cls, config):
    return 'navit' in config

  @classmethod
  def create(cls, config, workdir, mesh, **kw):
    """NaViT's task, or with `config.navit.packed=False` the ViT baseline."""
    if check_settings(config).packed:
      return cls(config, workdir, mesh, **kw)
    return BaselineTask(config, workdir, mesh, **kw)

  def __init__(self, config, workdir, mesh, *, training=True):
    del workdir, training
    self.settings = check_settings(config)
    self.config, self.mesh = config, mesh
    model = {k: v for k, v in config.model.to_dict().items()
             if k != 'model_name'}
    self.model = models_navit.NaViT(num_classes=None, **model)
    sizes = navit_data.sampling(config)  # checks the ranges
    self._check_sizes(sizes)
    self.info = pipeline.dataset_info(
        pipeline.get_builder(config), config)
    self.model = self.model.clone(num_classes=self.info.num_classes)
    self.evaluators = [evaluators.build(
        'navit_packed', 'resolutions', {'every': config.navit.eval_every},
        config=config, model=self.model, mesh=mesh)]

  def _check_sizes(self, sizes):
    """Every image, trained or tested, fits a sequence and the model."""
    patch = sizes.patch
    grids = [sizes.grid_range[1]] + [
        s // patch for s in self.config.navit.eval_sides]
    largest = max(grids)
    if largest**2 > self.config.navit.max_tokens:
      raise ValueError(f'An image of {largest}x{largest} patches does not '
                       f'fit config.navit.max_tokens='
                       f'{self.config.navit.max_tokens}.')
    if self.model.posemb == 'factorized' and largest > self.model.max_grid:
      raise ValueError(f'A grid of {largest} patches exceeds '
                       f'config.model.max_grid={self.model.max_grid}.')

  def init_params(self, rng):
    g = navit_data.sampling(self.config).grid_range[1]
    n, dim = self.config.navit.max_tokens, self.config.model.patches.size[0]
    index = np.arange(n)
    real = index < g * g
    batch = {'patches': np.zeros((1, n, dim * dim * 3), np.float32),
             'segment_ids': real[None].astype(np.int32),
             'rows': np.where(real, index // g, 0)[None],
             'cols': np.where(real, index % g, 0)[None],
             'heights': np.where(real, g, 0)[None],
             'widths': np.where(real, g, 0)[None]}
    return self.model.init(rng, batch, train=False)['params']

  def check_initial_files(self):
    pass  # NaViT trains from scratch

  def checkpoint(self, path):
    """(model, params) of the NaViT checkpoint at `path` (an .npz or a
    workdir), for `trainer='evaluate'`."""
    abstract = jax.eval_shape(lambda: self.init_params(jax.random.key(0)))
    model, params, _ = loading.load_model(
        self.config.model, path, model=self.model, abstract_params=abstract)
    return model, params

  def train_step(self, state, batch, *, rng):
    """One micro-batch: cross-entropy over its real images."""
    dropout_rng = jax.random.fold_in(rng, state.step)
    inputs = {k: batch[k] for k in packing.KEYS}

    def compute_loss(params):
      logits = state.apply_fn({'params': params}, inputs, train=True,
                              rngs={'dropout': dropout_rng})
      return image_loss(logits, batch['labels'])

    value, grads = jax.value_and_grad(compute_loss)(state.params)
    return state.apply_gradients(grads=grads), {
        'loss': value,
        'images': jnp.sum(batch['labels'] >= 0),  # the loop's img/s
        'packing_efficiency': jnp.mean(batch['segment_ids'] > 0)}

  def batches(self, *, batch_size, rows, start_step):
    return navit_data.train_batches(self.info, self.config, batch_size=batch_size,
                         start_step=start_step, rows=rows)


class BaselineTask(classification.Task):
  """The plain ViT at `pp.crop`, evaluated at every side as well."""

  def __init__(self, config, workdir, mesh, *, training=True):
    super().__init__(config, workdir, mesh, training=training)
    self.evaluators = [evaluators.build(
        'navit_resized', 'resolutions', {'every': config.navit.eval_every},
        config=config, model=self.model, mesh=mesh)]

