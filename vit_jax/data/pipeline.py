"""tf.data input pipelines: tfds datasets and image folders.

Training data is a pure function of (seed, example position): every epoch is
shuffled with its own seed and every example is augmented with stateless ops
seeded by its position in the stream. Resuming at step s therefore continues
exactly where step s left off, with no re-seen batches.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import contextlib
import dataclasses
import functools
import os
import socket
from typing import Iterator

from absl import logging
from etils import epath
from etils import epy
import filelock
import flax
import jax
import numpy as np
import tensorflow_datasets as tfds

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

from vit_jax import cli
from vit_jax.data import augment
from vit_jax.data import folders
from vit_jax.data import labels as task_labels
from vit_jax.data import local_datasets  # registers the offline builders
from vit_jax.data import tiling


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  builder: tfds.core.DatasetBuilder
  num_classes: int
  num_train: int
  num_test: int
  channels: int  # of the stored images: 1 (gray) or 3
  # The splits read (`split_spec`): config.pp.train and pp.test, or a
  # folder's train/ and test/.
  train_split: str = 'train'
  test_split: str = 'test'


def _online(host: str = 'storage.googleapis.com', timeout: float = 3.):
  """Whether `host` answers within seconds; tfds' own retries take minutes."""
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
    return True
  except OSError:
    return False


def get_builder(config) -> tfds.core.DatasetBuilder:
  """A prepared tfds builder for `config.dataset` (a name or an image folder).

  A tfds dataset that is not prepared yet is downloaded and prepared once,
  as the original release does, when `config.tfds_download` is set and the
  network answers; otherwise this fails within seconds, with instructions.
  """
  if epath.Path(config.dataset).is_dir():  # local, or in a bucket
    builder = tfds.ImageFolder(config.dataset)
    if config.get('skip_bad_images'):
      return folders.without_bad_files(builder)
    return builder
  try:
    builder = tfds.builder(config.dataset, data_dir=config.tfds_data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    name = config.dataset.split(':')[0].split('/')[0]
    raise ValueError(
        cli.closest(name, tfds.list_builders(), 'dataset') + ' (a tfds name, '
        'or a folder of {train,test}/<class>/<image> files)') from None
  if builder.is_prepared():
    return builder
  if builder.MANUAL_DOWNLOAD_INSTRUCTIONS is None and not isinstance(
      builder, local_datasets.LOCAL_BUILDERS) and not (
          config.tfds_download and _online()):
    why = ('no network' if config.tfds_download else
           'config.tfds_download is off')
    raise FileNotFoundError(
        f'Dataset {config.dataset!r} is not prepared in {builder.data_dir} '
        f'and this machine cannot download it ({why}). Prepare it where '
        f'there is network (`tfds build {config.dataset} --data_dir=DIR`), '
        'then copy DIR here and set --config.tfds_data_dir=DIR.')
  with _preparation_lock(builder):
    if builder.is_prepared():  # by another run while this one waited
      return tfds.builder(config.dataset, data_dir=config.tfds_data_dir)
    try:
      builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
          manual_dir=config.tfds_manual_dir))
    except AssertionError as e:  # tfds' way to say manual files are missing
      raise FileNotFoundError(
          f'Dataset {config.dataset!r} needs files to be placed by hand: '
          f'{e}') from None
  return builder


@contextlib.contextmanager
def _preparation_lock(builder):
  """One run at a time prepares a dataset; tfds' own temporary folders
  collide when two first runs start together. Local data dirs only."""
  path = str(builder.data_dir)
  if '://' in path:
    yield
    return
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with filelock.FileLock(path + '.lock'):
    yield


FOLDER = 'folder:'  # the prefix of a split spec that cuts an image folder


def split_spec(builder, spec: str, mode: str) -> str:
  """The split that `spec` (config.pp.train or pp.test) reads in `mode`
  ('train' or 'test').

  A tfds dataset reads `spec`. An image folder reads its train/ or test/
  subfolder, as the original release does whatever the split specs say: the
  specs of a tfds dataset (its notebook's 'train[:90%]', 'train[90%:]' for
  tf_flowers) must not carve up a folder that has its own test/. Two
  exceptions: `spec` naming a subfolder ('train', 'val') reads it, and
  'folder:SPEC' reads a tfds split spec over the subfolders
  ('folder:train[:90%]', 'folder:train+test').
  """
  if not isinstance(builder, tfds.ImageFolder):
    return spec
  if spec.startswith(FOLDER):
    return spec[len(FOLDER):]
  if spec in builder.info.splits:
    return spec
  if spec != mode:
    logging.warning("The dataset is a folder: %s reads its %s/, as the "
                    "original release does; the split spec %r is for tfds "
                    "datasets ('%s%s' would cut the folder).", mode, mode,
                    spec, FOLDER, spec)
  return mode


def _num_examples(builder, split: str) -> int:
  """Examples in `split`, a tfds split spec such as 'train[:90%]'."""
  if isinstance(builder, tfds.ImageFolder):
    return sum(stop - start for _, start, stop in _folder_parts(builder, split))
  return builder.info.splits[split].num_examples


def _folder_parts(builder, split: str):
  """[(split name, start, stop)] of a split spec, for an image folder.

  tfds' ImageFolder reads whole splits only; sub-splits ('train[:90%]') and
  unions ('train+test') are cut here, in the folder's fixed file order.
  """
  splits = builder.info.splits
  parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(splits)
  return [(part.splitname, part.from_ or 0,
           splits[part.splitname].num_examples if part.to is None
           else part.to) for part in parts]


def dataset_info(builder, config) -> DatasetInfo:
  """Sizes, classes and channels of `config`'s train and test splits."""
  splits = {mode: split_spec(builder, config.pp[mode], mode)
            for mode in ('train', 'test')}
  num_examples = {}
  for split in splits.values():
    try:
      num_examples[split] = _num_examples(builder, split)
    except (KeyError, ValueError, AssertionError) as e:
      raise ValueError(f'Split {split!r} not in {config.dataset!r}; it has '
                       f'{sorted(builder.info.splits)}.') from e
  return DatasetInfo(
      builder=builder,
      num_classes=task_labels.num_classes(config.pp.get('label'), builder),
      num_train=num_examples[splits['train']],
      num_test=num_examples[splits['test']],
      channels=builder.info.features['image'].shape[-1] or 3,
      train_split=splits['train'], test_split=splits['test'])


def _to_float(image):
  """uint8 -> float32 in [-1, 1]."""
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def preprocess_train(image, seed, pp):
  """Inception crop (area pp.area_min..1), resize to pp.crop, optional flip;
  optional RandAugment (`pp.randaug`) and random erasing (`pp.erasing`)."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed=seed,
      area_range=(pp.area_min, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  image = tf.slice(image, begin, size)
  fold = functools.partial(tf.random.experimental.stateless_fold_in, seed)
  if pp.get('tiles'):  # the crop, flipped, cut into tiles (no resize)
    image = _to_float(image)
    if pp.flip:
      image = tf.image.stateless_random_flip_left_right(image, fold(1))
    return _tiled(image, pp)
  randaug = pp.get('randaug')
  if randaug is None:
    image = tf.image.resize(_to_float(image), [pp.crop, pp.crop])
  else:  # on uint8, as big_vision: crop, flip, randaug, then to [-1, 1]
    num_layers, magnitude = augment.check_randaug(randaug)
    image = tf.image.resize(image, [pp.crop, pp.crop])
    image = tf.cast(tf.clip_by_value(image, 0.0, 255.0), tf.uint8)
  if pp.flip:
    image = tf.image.stateless_random_flip_left_right(image, fold(1))
  if randaug is not None:
    image = _to_float(augment.randaugment(image, num_layers, magnitude,
                                          fold(2)))
  image = normalize(tf.clip_by_value(image, -1.0, 1.0), pp)
  if pp.get('erasing'):  # after normalization, as timm (DeiT)
    image = augment.random_erasing(image, pp.erasing, fold(3))
  return image


def normalize(image, pp):
  """[-1, 1] (the original's, mean = std = 0.5), or `pp.mean`/`pp.std` of
  pixels in [0, 1] (timm's weights: ImageNet's)."""
  if pp.get('mean') is None and pp.get('std') is None:
    return image
  mean = tf.constant(pp.get('mean') or (0.5,) * 3, tf.float32)
  std = tf.constant(pp.get('std') or (0.5,) * 3, tf.float32)
  return ((image + 1.0) / 2.0 - mean) / std


def _short_side_then_crop(image, pp):
  """timm's eval transform: the short side to crop / pp.crop_pct (floor),
  antialiased `pp.interpolation`, then a central pp.crop."""
  scale = int(pp.crop / pp.crop_pct)
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  ratio = scale / tf.reduce_min(shape)
  # The long side as torchvision's Resize computes it (truncated).
  hw = tf.maximum(tf.cast(shape * ratio, tf.int32), scale)
  image = tf.image.resize(image, hw, method=pp.get('interpolation') or
                          'bilinear', antialias=True)
  top = tf.cast(tf.round(tf.cast(hw[0] - pp.crop, tf.float32) / 2), tf.int32)
  left = tf.cast(tf.round(tf.cast(hw[1] - pp.crop, tf.float32) / 2), tf.int32)
  return image[top:top + pp.crop, left:left + pp.crop]


def _tiled(image, pp):
  """InternVL's tiles of pp.crop px (`tiling.tiles`, `pp.tiles`' min and
  max tile counts), normalized."""
  t = pp.tiles
  return normalize(tiling.tiles(image, pp.crop, t.get('min', 1), t['max']),
                   pp)


def preprocess_eval(image, pp):
  """Resize to pp.crop; or to pp.resize then a central pp.crop; or, with
  pp.crop_pct, the short side to pp.crop / pp.crop_pct then a central crop
  (timm's meaning); or, with pp.tiles, InternVL's tiles of pp.crop px
  (`_tiled`). Then normalized (`normalize`)."""
  image = _to_float(image)
  if pp.get('tiles'):
    return _tiled(image, pp)
  if pp.get('crop_pct'):
    image = _short_side_then_crop(image, pp)
  elif pp.get('resize'):
    image = tf.image.resize(image, [pp.resize, pp.resize])
    off = (pp.resize - pp.crop) // 2
    image = image[off:off + pp.crop, off:off + pp.crop]
  else:
    image = tf.image.resize(image, [pp.crop, pp.crop])
  return normalize(tf.clip_by_value(image, -1.0, 1.0), pp)


def decode(features, channels, label=''):
  """Encoded image -> uint8 RGB (gray images get 3 equal channels), and the
  label: the feature 'label', or a `task_labels` task's."""
  image = tf.io.decode_image(features['image'], channels=channels,
                             expand_animations=False)
  image, label = task_labels.apply(label, image, features)
  if channels == 1:
    image = tf.image.grayscale_to_rgb(image)
  return image, label


def _stream_seeds(seed: int):
  """(shuffle, augmentation) seeds of the run's training stream.

  Stateless fold-ins keep the random streams of epochs (the shuffles) and of
  examples (the augmentations) apart.
  """
  stream_seed = tf.random.experimental.stateless_fold_in(  # (0: as before)
      tf.constant([seed, 0], tf.int64), 0)
  return tuple(tf.random.experimental.stateless_fold_in(stream_seed, i)
               for i in range(2))


def read_encoded(builder, split):
  """All of `split`, images still encoded (cheap buffers), in a fixed order."""
  read = lambda split: builder.as_dataset(
      split=split, shuffle_files=False,
      decoders={'image': tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(add_tfds_id=False))
  if not isinstance(builder, tfds.ImageFolder):
    return read(split)
  parts = [read(name).skip(start).take(stop - start)
           for name, start, stop in _folder_parts(builder, split)]
  return functools.reduce(lambda a, b: a.concatenate(b), parts)


def _read_process_share(builder, split):
  """This process's share of `split` (for evaluation), images encoded."""
  if not isinstance(builder, tfds.ImageFolder):
    return read_encoded(
        builder, tfds.split_for_jax_process(split, drop_remainder=False))
  ds = read_encoded(builder, split)
  nproc = jax.process_count()
  return ds.shard(nproc, jax.process_index()) if nproc > 1 else ds


def shuffled_stream(base, n: int, config, *, batch_size: int,
                    start_step: int = 0, rows=None):
  """(position, example) of this process's rows of the global batches.

  Every process reads the same global stream (each epoch of `base`, its `n`
  examples, shuffled with its own seed) and keeps only its rows, before any
  decoding: the stream does not depend on the number of processes, so a run
  resumes exactly on another topology. Returns the stream and the seed of
  the examples' augmentations (fold in the position).
  """
  if n < batch_size:
    raise ValueError(f'The training split has {n} examples, fewer '
                     f'than the batch of {batch_size}.')
  first_epoch, offset = divmod(start_step * batch_size, n)
  shuffle_seed, augment_seed = _stream_seeds(config.seed)

  def epoch(e):
    seed = tf.random.stateless_uniform(  # shuffle takes a scalar seed
        [], tf.random.experimental.stateless_fold_in(shuffle_seed, e),
        minval=None, maxval=None, dtype=tf.int64)
    return base.shuffle(min(config.shuffle_buffer, n), seed=seed,
                        reshuffle_each_iteration=False)

  ds = tf.data.Dataset.range(first_epoch, 1 << 40).flat_map(epoch)
  ds = ds.enumerate(start=first_epoch * n).skip(offset)
  if rows is not None and len(rows) < batch_size:  # one of several processes
    mine = tf.constant(np.isin(np.arange(batch_size), rows))
    # Batches start at multiples of batch_size: the row is position % batch.
    ds = ds.filter(lambda position, _: mine[position % batch_size])
  return ds, augment_seed


def train_iterator(info: DatasetInfo, config, *, batch_size: int,
                   start_step: int = 0, rows=None,
                   example=None) -> Iterator[dict]:
  """Yields this process's rows of the global training batches, as numpy
  (`train_dataset`'s)."""
  ds = train_dataset(info, config, batch_size=batch_size,
                     start_step=start_step, rows=rows, example=example)
  return _naming_bad_files(tfds.as_numpy(ds.prefetch(config.prefetch)),
                           info.builder)


def _naming_bad_files(batches, builder):
  """`batches`; where a folder's file is no image, the error names it
  (TensorFlow's names no file)."""
  try:
    yield from batches
  except tf.errors.OpError as e:
    error = (folders.bad_file_error(builder)
             if isinstance(builder, tfds.ImageFolder) else None)
    if error is None:
      raise
    raise error from e


def train_dataset(info: DatasetInfo, config, *, batch_size: int,
                  start_step: int = 0, rows=None,
                  example=None) -> tf.data.Dataset:
  """This process's rows of the global training batches.

  Args:
    info: from `dataset_info`.
    config: the experiment config (pp, shuffle_buffer, seed, prefetch).
    batch_size: examples per global batch.
    start_step: batches already consumed (when resuming).
    rows: this process's rows of each global batch, increasing (default all).
    example: (uint8 image, label, seed) -> the example's dict; default the
      classifier's augmented image and one-hot label (DINO: its views).
  """
  ds, augment_seed = shuffled_stream(
      read_encoded(info.builder, info.train_split), info.num_train, config,
      batch_size=batch_size, start_step=start_step, rows=rows)
  if example is None:
    example = lambda image, label, seed: {  # pylint: disable=g-long-lambda
        'image': preprocess_train(image, seed, config.pp),
        'label': tf.one_hot(label, info.num_classes)}

  def process(position, features):
    image, label = decode(features, info.channels, config.pp.get('label'))
    return example(image, label, tf.random.experimental.stateless_fold_in(
        augment_seed, position))

  ds = ds.map(process, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size if rows is None else len(rows),
                  drop_remainder=True)


def eval_example(features, *, info: DatasetInfo, pp):
  """A test example: image, (multi-)hot label and mask.

  A label may be a set (ImageNet ReaL): multi-hot, and an image without any
  right answer has mask 0, as the ReaL paper scores it.
  """
  image, label = decode(features, info.channels, pp.get('label'))
  target, mask = tf.one_hot(label, info.num_classes), tf.constant(1.0)
  if label.shape.rank == 1:  # a set of right answers
    target = tf.minimum(tf.reduce_sum(target, 0), 1.0)
    mask = tf.cast(tf.size(label) > 0, tf.float32)
  return {'image': preprocess_eval(image, pp), 'label': target, 'mask': mask}


def label_counts(info: DatasetInfo, config):
  """Examples per class in the test split (`info.test_split`), from its labels
  alone (no image decoded); None where labels are sets (ImageNet ReaL)."""
  name, blank = config.pp.get('label'), tf.zeros([1, 1, 1], tf.uint8)
  labels = read_encoded(info.builder, info.test_split).map(
      lambda features: task_labels.apply(name, blank, features)[1],
      num_parallel_calls=tf.data.AUTOTUNE)
  if labels.element_spec.shape.rank != 0:
    return None
  counts = labels.batch(4096).reduce(
      tf.zeros([info.num_classes], tf.int64),
      lambda total, y: total + tf.math.bincount(
          y, minlength=info.num_classes, maxlength=info.num_classes,
          dtype=tf.int64))
  return counts.numpy()


def eval_dataset(info: DatasetInfo, config, example=None) -> tf.data.Dataset:
  """This process's share of the test split, as `example(features, info=,
  pp=)` makes them (default `eval_example`)."""
  return _read_process_share(info.builder, info.test_split).map(
      functools.partial(example or eval_example, info=info, pp=config.pp),
      num_parallel_calls=tf.data.AUTOTUNE)


def eval_batches(info: DatasetInfo, config, *, batch_size: int,
                 example=None):
  """Test batches covering every example once; padding has mask 0.

  Every process yields the same number of batches (needed by the collective
  eval step), padding its share of the split as needed. `example` as
  `eval_dataset`'s.
  """
  largest_share = -(-info.num_test // jax.process_count())
  num_batches = -(-largest_share // batch_size)

  ds = eval_dataset(info, config, example)
  pad = {k: tf.zeros(v.shape, v.dtype) for k, v in ds.element_spec.items()}
  ds = ds.concatenate(tf.data.Dataset.from_tensors(pad).repeat())
  ds = ds.take(num_batches * batch_size).batch(batch_size)
  return _naming_bad_files(tfds.as_numpy(ds.prefetch(config.prefetch)),
                           info.builder)


def host_batch_size(global_batch: int) -> int:
  if global_batch % jax.process_count():
    raise ValueError(f'Batch {global_batch} is not divisible by the '
                     f'{jax.process_count()} processes.')
  return global_batch // jax.process_count()


# The original release's functions, over the pipelines above.


def get_dataset_info(dataset: str, split: str) -> dict:
  """The original's: `num_examples`, `num_classes`, `int2str` and
  `examples_glob` of `split` of a tfds name (its default data_dir) or of a
  folder holding `{split}/<class>/<image>`."""
  directory = os.path.join(dataset, split)
  folder = os.path.isdir(directory)
  builder = tfds.ImageFolder(dataset) if folder else tfds.builder(dataset)
  label = builder.info.features['label']
  return dict(num_examples=_num_examples(builder, split),
              num_classes=label.num_classes, int2str=label.int2str,
              examples_glob=f'{directory}/*/*' if folder else None)


def get_data_from_tfds(*, config, mode: str) -> tf.data.Dataset:
  """The original's: `mode` ('train': `pp.train`, repeated; 'test':
  `pp.test` once, the remainder of `batch_eval` dropped) as batches of
  [local devices, batch / devices, crop, crop, 3] images in [-1, 1] and
  one-hot labels. The training stream is the loop's (`train_dataset`)."""
  if mode not in ('train', 'test'):
    raise ValueError(f"mode={mode!r}; expected 'train' or 'test'.")
  info = dataset_info(get_builder(config), config)
  if mode == 'train':
    ds = train_dataset(info, config, batch_size=config.batch)
  else:
    ds = eval_dataset(info, config).batch(config.batch_eval,
                                          drop_remainder=True)
  devices = jax.local_device_count()
  return ds.map(lambda batch: {
      k: tf.reshape(batch[k], tf.concat([[devices, -1],
                                         tf.shape(batch[k])[1:]], 0))
      for k in ('image', 'label')}).prefetch(1)


def get_data_from_directory(*, config, directory: str, mode: str):
  """The original's: as `get_data_from_tfds`, from the images in
  `directory` (`<class>/<image>` files), a split of the folder above it."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.dataset = os.path.dirname(os.path.normpath(directory))
    config.pp[mode] = os.path.basename(os.path.normpath(directory))
  return get_data_from_tfds(config=config, mode=mode)


def get_datasets(config):
  """The original's (ds_train, ds_test) of `config.dataset`."""
  return (get_data_from_tfds(config=config, mode='train'),
          get_data_from_tfds(config=config, mode='test'))


def prefetch(dataset, n_prefetch: int):
  """The original's: numpy batches of `dataset`, `n_prefetch` of them put on
  the local devices ahead (`flax.jax_utils.prefetch_to_device`)."""
  batches = map(lambda x: jax.tree.map(np.asarray, x),
                tfds.as_numpy(dataset))
  if n_prefetch:
    batches = flax.jax_utils.prefetch_to_device(batches, n_prefetch)
  return batches
