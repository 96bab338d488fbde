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
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import models_navit
from vit_jax import packing
from vit_jax import sharding
from vit_jax.evaluators import common
from vit_jax.tasks import base
from vit_jax.tasks import classification

SETTINGS = ('packed', 'max_tokens', 'window', 'side_range', 'aspect_range',
            'drop_rate', 'eval_sides', 'eval_every')
_MIXED_STREAM = 1  # the recipes of the mixed test stream (training's: 0)


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


def sampling(config, drop_rate=None) -> packing.Sampling:
  """The training images' sizes (`drop_rate`: the config's unless given)."""
  s = config.navit
  return packing.Sampling(
      patch=config.model.patches.size[0], side_range=tuple(s.side_range),
      aspect_range=tuple(s.aspect_range), flip=bool(config.pp.flip),
      drop_rate=tuple(s.drop_rate) if drop_rate is None else drop_rate)


def image_loss(logits, labels):
  """Softmax cross-entropy averaged over the real images (labels >= 0)."""
  real = labels >= 0
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.maximum(labels, 0))
  return jnp.sum(losses * real) / jnp.maximum(jnp.sum(real), 1)


def _decoded(info, config, ds):
  """(…, uint8 image, label) of encoded `ds` elements `(…, features)`."""
  label = config.pp.get('label')

  def decode(*args):
    image, target = input_pipeline.decode(args[-1], info.channels, label)
    if target.shape.rank:
      raise ValueError('NaViT trains on one label per image.')
    return (*args[:-1], image, target)

  return iter(tfds.as_numpy(ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
                            .prefetch(config.prefetch)))


class _Images:
  """Training images by stream position, read forward on demand.

  Starts at `first`; positions in `skip` (packed before a resume) are
  passed over, the rest kept until asked for.
  """

  def __init__(self, info, config, first: int, skip):
    ds, _ = input_pipeline.shuffled_stream(
        input_pipeline.read_encoded(info.builder, config.pp.train),
        info.num_train, config, batch_size=1, start_step=first)
    self.stream, self.skip, self.kept = _decoded(info, config, ds), skip, {}

  def pop(self, position: int):
    while position not in self.kept:
      p, image, label = next(self.stream)
      if int(p) not in self.skip:
        self.kept[int(p)] = (image, label)
    return self.kept.pop(position)


def train_batches(info, config, *, batch_size: int, start_step: int = 0,
                  rows=None):
  """Yields this process's rows of the packed training batches.

  The packing plan comes from the images' recipes alone: resuming replays
  it for `start_step` batches (no image read), then reads the stream from
  the oldest image still pending. Every process packs the whole batch.
  """
  sizes = sampling(config)
  recipes = packing.Recipes(config.seed, sizes)
  packer = packing.Packer(recipes.token_counts(), config.navit.max_tokens,
                          config.model.max_images, config.navit.window)
  for _ in range(start_step * batch_size):
    packer.next_sequence()
  pending = {key for key, _ in packer.pending}
  first = min(pending | {packer.pulled})  # positions count from 0
  images = _Images(info, config, first,
                   set(range(first, packer.pulled)) - pending)
  mean, std = config.pp.get('mean'), config.pp.get('std')

  def make(position):
    image, label = images.pop(position)
    return packing.training_example(image, label, recipes[position], sizes,
                                    seed=config.seed, position=position,
                                    mean=mean, std=std)

  patch_dim = sizes.patch**2 * 3
  while True:
    plan = [packer.next_sequence() for _ in range(batch_size)]
    batch = packing.pack([[make(p) for p in keys] for keys in plan],
                         config.navit.max_tokens, config.model.max_images,
                         patch_dim)
    yield batch if rows is None else {k: v[rows] for k, v in batch.items()}


def training_efficiency(config) -> float:
  """Real tokens / all tokens over the run's training batches (from the
  recipes alone)."""
  sizes = sampling(config)
  recipes = packing.Recipes(config.seed, sizes)
  packer = packing.Packer(recipes.token_counts(), config.navit.max_tokens,
                          config.model.max_images, config.navit.window)
  sequences = config.total_steps * config.batch
  used = 0
  for _ in range(sequences):
    used += sum(int(recipes[p]['tokens']) for p in packer.next_sequence())
  return used / (sequences * config.navit.max_tokens)


def eval_images(info, config):
  """(uint8 image, label) of every test example, in order (each process
  reads all: the evaluation batches are global)."""
  return _decoded(info, config, input_pipeline.read_encoded(
      info.builder, config.pp.test))


def fixed_side(image, label, side: int, patch: int, pp) -> dict:
  """A test example with its longer side `side` px, aspect ratio kept."""
  h, w = packing.grid_of(side, image.shape[1] / image.shape[0], patch)
  return packing.example(image, label, int(h), int(w), patch,
                         mean=pp.get('mean'), std=pp.get('std'))


def square(image, side: int, pp):
  """A test image for a plain ViT: `side` x `side`, resized as NaViT's."""
  return packing.normalize(packing.resize(image, side, side),
                           pp.get('mean'), pp.get('std'))


def mixed(index, image, label, recipes, sizes, pp) -> dict:
  """Test example `index` at its random side and crop (no dropping)."""
  return packing.training_example(image, label, recipes[index], sizes,
                                  seed=0, position=index, mean=pp.get('mean'),
                                  std=pp.get('std'))


def packed_test_batches(examples, config, batch_size: int):
  """Global packed batches of all `examples` (an iterator of example
  dicts); the last one padded with empty sequences."""
  stash, counter = {}, iter(range(1 << 62))

  def items():
    for ex in examples:
      key = next(counter)
      stash[key] = ex
      yield key, len(ex['rows'])

  packer = packing.Packer(items(), config.navit.max_tokens,
                          config.model.max_images, config.navit.window)
  patch_dim = config.model.patches.size[0]**2 * 3
  done = False
  while not done:
    plan = []
    while len(plan) < batch_size and not done:
      keys = packer.next_sequence()
      done = keys is None
      if not done:
        plan.append([stash.pop(k) for k in keys])
    if plan:
      plan += [[]] * (batch_size - len(plan))
      yield packing.pack(plan, config.navit.max_tokens,
                         config.model.max_images, patch_dim)


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
  """Accuracy at each of `config.navit.eval_sides` (`accuracy_{side}px`)."""

  def __init__(self, config, info, mesh):
    super().__init__('resolutions', {'every': config.navit.eval_every})
    self.config, self.info, self.mesh = config, info, mesh
    self.sides = tuple(int(s) for s in config.navit.eval_sides)

  def summary(self, metrics):
    parts = [f'{k[len("accuracy_"):]} {v:.4f}' for k, v in metrics.items()
             if k.startswith('accuracy_')]
    line = 'test accuracy at ' + ', '.join(parts)
    if 'packing_efficiency' in metrics:
      line += f'; packing efficiency {metrics["packing_efficiency"]:.3f}'
    return line


class PackedEvaluator(_PerSide):
  """NaViT's accuracy at fixed sides and on the mixed stream."""

  def __init__(self, config, info, mesh, model):
    super().__init__(config, info, mesh)
    self.step = jax.jit(lambda params, batch: _count_correct(model.apply(
        {'params': params}, {k: batch[k] for k in packing.KEYS},
        train=False), batch['labels']))
    self.efficiency = None

  def _run(self, params, examples):
    return _accuracy(self.step, params, packed_test_batches(
        examples, self.config, self.config.batch_eval), self.mesh,
                     self.config.batch_eval)

  def __call__(self, params):
    config, patch = self.config, self.config.model.patches.size[0]
    out = {}
    for side in self.sides:
      out[f'accuracy_{side}px'] = self._run(params, (
          fixed_side(im, lb, side, patch, config.pp)
          for im, lb in eval_images(self.info, config)))
    sizes = sampling(config, drop_rate=0.0)
    recipes = packing.Recipes(config.seed, sizes, stream=_MIXED_STREAM)
    out['accuracy_mixed'] = self._run(params, (
        mixed(i, im, lb, recipes, sizes, config.pp)
        for i, (im, lb) in enumerate(eval_images(self.info, config))))
    if self.efficiency is None:
      self.efficiency = training_efficiency(config)
    out['packing_efficiency'] = self.efficiency
    return out


class ResizedEvaluator(_PerSide):
  """A plain ViT's accuracy at each side, its position table resized
  (bicubic) to that side's grid; images as NaViT's (`fixed_side`)."""

  def __init__(self, config, info, mesh, task):
    super().__init__(config, info, mesh)
    self.task = task

  def _at_side(self, params, side):
    model = self.task.model
    shape = (1, side, side, 3)
    abstract = jax.eval_shape(lambda: model.init(
        jax.random.key(0), jnp.zeros(shape), train=False)['params'])
    grid = (side // self.config.model.patches.size[0],) * 2
    return checkpoint.load_params(
        f'(the ViT at {side} px)', init_params=abstract,
        model_config=self.config.model, new_grid=grid,
        found=jax.device_get(params))

  def __call__(self, params):
    config = self.config
    step = jax.jit(lambda p, batch: _count_correct(self.task.model.apply(
        {'params': p}, batch['image'], train=False), batch['labels']))
    out = {}
    for side in self.sides:
      batches = _image_batches(((square(im, side, config.pp), lb)
                                for im, lb in eval_images(self.info, config)),
                               config.batch_eval)
      out[f'accuracy_{side}px'] = _accuracy(
          step, self._at_side(params, side), batches, self.mesh,
          config.batch_eval)
    return out


def _image_batches(examples, batch_size):
  """(image, label) pairs -> global batches; padding has label -1."""
  examples = iter(examples)
  while chunk := [ex for _, ex in zip(range(batch_size), examples)]:
    images, labels = zip(*chunk)
    images = np.stack(images + (np.zeros_like(images[0]),) * (
        batch_size - len(chunk)))
    labels = np.full((batch_size,), -1, np.int32)
    labels[:len(chunk)] = [label for _, label in chunk]
    yield {'image': images, 'labels': labels}


class Task(base.Task):
  """NaViT on packed sequences: its model, step, batches and evaluator."""

  param_labels = None  # every parameter trains

  def __init__(self, config, workdir, mesh, *, training=True):
    del workdir, training
    self.settings = check_settings(config)
    self.config, self.mesh = config, mesh
    model = {k: v for k, v in config.model.to_dict().items()
             if k != 'model_name'}
    self.model = models_navit.NaViT(num_classes=None, **model)
    sizes = sampling(config)  # checks the ranges
    self._check_sizes(sizes)
    self.info = input_pipeline.dataset_info(
        input_pipeline.get_builder(config), config)
    self.model = self.model.clone(num_classes=self.info.num_classes)
    self.evaluators = [PackedEvaluator(config, self.info, mesh, self.model)]

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
    g = sampling(self.config).grid_range[1]
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
    return self.model, checkpoint.inspect_params(
        params=checkpoint.read_params(path), expected=abstract,
        source=f'Checkpoint {path}')

  def initial_params(self, params):
    del params
    return None

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
    return train_batches(self.info, self.config, batch_size=batch_size,
                         start_step=start_step, rows=rows)


class BaselineTask(classification.Task):
  """The plain ViT at `pp.crop`, evaluated at every side as well."""

  def __init__(self, config, workdir, mesh, *, training=True):
    super().__init__(config, workdir, mesh, training=training)
    self.evaluators = [ResizedEvaluator(config, self.info, mesh, self)]


def make_task(config, workdir, mesh, *, training=True):
  """NaViT's task, or with `config.navit.packed=False` the ViT baseline."""
  if check_settings(config).packed:
    return Task(config, workdir, mesh, training=training)
  return BaselineTask(config, workdir, mesh, training=training)
