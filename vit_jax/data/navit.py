"""NaViT's data (Patch n' Pack, Dehghani et al., 2023): the packed
training stream, resumable from the images' recipes alone, and the test
images at fixed sides, on the mixed stream, or square for a plain ViT."""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

from etils import epy
import numpy as np
import tensorflow_datasets as tfds

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

from vit_jax.data import packing
from vit_jax.data import pipeline

MIXED_STREAM = 1  # the recipes of the mixed test stream (training's: 0)


def sampling(config, drop_rate=None) -> packing.Sampling:
  """The training images' sizes (`drop_rate`: the config's unless given)."""
  s = config.navit
  return packing.Sampling(
      patch=config.model.patches.size[0], side_range=tuple(s.side_range),
      aspect_range=tuple(s.aspect_range), flip=bool(config.pp.flip),
      drop_rate=tuple(s.drop_rate) if drop_rate is None else drop_rate)


def _decoded(info, config, ds):
  """(…, uint8 image, label) of encoded `ds` elements `(…, features)`."""
  label = config.pp.get('label')

  def decode(*args):
    image, target = pipeline.decode(args[-1], info.channels, label)
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
    ds, _ = pipeline.shuffled_stream(
        pipeline.read_encoded(info.builder, info.train_split),
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
  return _decoded(info, config, pipeline.read_encoded(
      info.builder, info.test_split))


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


def image_batches(examples, batch_size):
  """(image, label) pairs -> global batches; padding has label -1."""
  examples = iter(examples)
  while chunk := [ex for _, ex in zip(range(batch_size), examples)]:
    images, labels = zip(*chunk)
    images = np.stack(images + (np.zeros_like(images[0]),) * (
        batch_size - len(chunk)))
    labels = np.full((batch_size,), -1, np.int32)
    labels[:len(chunk)] = [label for _, label in chunk]
    yield {'image': images, 'labels': labels}
