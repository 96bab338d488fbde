"""Clips for video classifiers (ViViT): frames sampled in time, then each
frame treated as the image pipeline treats an image.

`config.video` says what the model sees: `frames` frames, `stride` apart in
the stored clip (a window of (frames - 1) * stride + 1 stored frames), and
`test_views` windows per test clip.

- Training: one window at a random offset, uniform in {0..L - window} for a
  clip of L frames, drawn from the example's seed (`pipeline`'s stream:
  stateless, so a run resumes exactly); every frame is augmented by
  `pipeline.preprocess_train` with the same seed, so the crop, the flip
  (and RandAugment's operations, if `pp.randaug`) are the same across the
  frames of a clip. The label is one-hot.
- Test: `test_views` windows whose offsets are spaced evenly from the first
  frame to the last (`test_offsets`; ViViT's multi-view test), each frame
  as `pipeline.preprocess_eval` makes a test image (resized, or a centre
  crop with `pp.resize` or `pp.crop_pct`).

Gray frames get 3 equal channels and are normalized as images are
(`pipeline.normalize`). Only the frames a window uses are decoded.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import jax
import numpy as np
import tensorflow_datasets as tfds
from etils import epy

from vit_jax.data import clips
from vit_jax.data import pipeline

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def dataset_info(builder, config) -> pipeline.DatasetInfo:
  """`pipeline.dataset_info` of a dataset of clips (a 'video' feature)."""
  features = builder.info.features
  if 'video' not in features:
    raise ValueError(f'Dataset {config.dataset!r} has no video feature (it '
                     f'has {sorted(features)}); video models read clips, '
                     "e.g. dataset='moving_fashion_mnist'.")
  if config.pp.get('label'):
    raise ValueError(f'pp.label={config.pp.label!r}: clips are labelled by '
                     "their feature 'label' only; set pp.label=''.")
  sizes = {}
  for mode in ('train', 'test'):
    split = config.pp[mode]
    try:
      sizes[mode] = builder.info.splits[split].num_examples
    except (KeyError, ValueError, AssertionError) as e:
      raise ValueError(f'Split {split!r} not in {config.dataset!r}; it has '
                       f'{sorted(builder.info.splits)}.') from e
  return pipeline.DatasetInfo(
      builder=builder, num_classes=features['label'].num_classes,
      num_train=sizes['train'], num_test=sizes['test'],
      channels=features['video'].shape[-1],
      train_split=config.pp.train, test_split=config.pp.test)


# Pure numpy (vit_jax.predict places its views with them too).
last_offset = clips.last_offset
test_offsets = clips.test_offsets


def clip_length(info) -> int:
  """Frames per stored clip."""
  return info.builder.info.features['video'].shape[0]


def window(info, config):
  """(frames, stride) of `config.video`, checked against the clips."""
  settings = config.get('video')
  if settings is None:
    raise ValueError('A video model needs config.video (frames, stride, '
                     'test_views).')
  last_offset(clip_length(info), settings.frames, settings.stride)
  return settings.frames, settings.stride


def read_encoded(builder, split):
  """All of `split`, frames still encoded, in a fixed order."""
  return builder.as_dataset(
      split=split, shuffle_files=False,
      decoders={'video': tfds.decode.SkipDecoding()},
      read_config=tfds.ReadConfig(add_tfds_id=False))


def _frames(encoded, indices, info):
  """The frames `indices` of a clip's encoded frames, uint8, 3 channels."""
  shape = info.builder.info.features['video'].shape[1:]
  frames = tf.map_fn(
      lambda png: tf.ensure_shape(
          tf.io.decode_png(png, channels=info.channels), shape),
      tf.gather(encoded, indices), fn_output_signature=tf.uint8)
  return tf.image.grayscale_to_rgb(frames) if info.channels == 1 else frames


def _each_frame(fn, frames, crop):
  return tf.map_fn(fn, frames, fn_output_signature=tf.TensorSpec(
      [crop, crop, 3], tf.float32))


def train_example(features, seed, *, info, config):
  """A training example: a window at a random offset, its frames
  augmented alike, and the one-hot label."""
  frames, stride = window(info, config)
  time_seed, space_seed = (tf.random.experimental.stateless_fold_in(seed, i)
                           for i in range(2))
  last = last_offset(clip_length(info), frames, stride)
  offset = tf.random.stateless_uniform([], time_seed, 0, last + 1, tf.int32)
  clip = _frames(features['video'], offset + stride * tf.range(frames), info)
  pp = config.pp
  return {'video': _each_frame(
      lambda frame: pipeline.preprocess_train(frame, space_seed, pp), clip,
      pp.crop),
          'label': tf.one_hot(features['label'], info.num_classes)}


def eval_example(features, *, info, config, views):
  """A test example: `views` windows (`test_offsets`), each (frames,
  crop, crop, 3); the one-hot label; mask 1."""
  frames, stride = window(info, config)
  offsets = test_offsets(clip_length(info), frames, stride, views)
  indices = offsets[:, None] + stride * np.arange(frames)
  clip = _frames(features['video'], indices.ravel(), info)
  pp = config.pp
  clip = _each_frame(lambda frame: pipeline.preprocess_eval(frame, pp), clip,
                     pp.crop)
  return {'video': tf.reshape(clip, [views, frames, pp.crop, pp.crop, 3]),
          'label': tf.one_hot(features['label'], info.num_classes),
          'mask': tf.constant(1.0)}


def train_dataset(info, config, *, batch_size, rows=None, start_step=0):
  """This process's rows of the global training batches of clips
  (`pipeline.shuffled_stream`'s positions seed each clip)."""
  window(info, config)
  ds, augment_seed = pipeline.shuffled_stream(
      read_encoded(info.builder, info.train_split), info.num_train, config,
      batch_size=batch_size, start_step=start_step, rows=rows)
  ds = ds.map(lambda position, features: train_example(
      features, tf.random.experimental.stateless_fold_in(
          augment_seed, position), info=info, config=config),
              num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(batch_size if rows is None else len(rows),
                  drop_remainder=True)


def train_iterator(info, config, *, batch_size, rows=None, start_step=0):
  """This process's rows of the training batches, as numpy: 'video'
  (B, frames, crop, crop, 3) float32 and one-hot 'label' (B, classes)."""
  ds = train_dataset(info, config, batch_size=batch_size, rows=rows,
                     start_step=start_step)
  return iter(tfds.as_numpy(ds.prefetch(config.prefetch)))


def eval_batches(info, config, *, batch_size, views=None):
  """Test batches covering every clip once, `eval_example`'s with `views`
  (default config.video.test_views); padding has mask 0. Every process
  yields the same number of batches (`pipeline.eval_batches`)."""
  views = config.video.test_views if views is None else views
  window(info, config)
  largest_share = -(-info.num_test // jax.process_count())
  num_batches = -(-largest_share // batch_size)
  ds = read_encoded(info.builder, tfds.split_for_jax_process(
      info.test_split, drop_remainder=False)).map(
          lambda features: eval_example(features, info=info, config=config,
                                        views=views),
          num_parallel_calls=tf.data.AUTOTUNE)
  pad = {k: tf.zeros(v.shape, v.dtype) for k, v in ds.element_spec.items()}
  ds = ds.concatenate(tf.data.Dataset.from_tensors(pad).repeat())
  ds = ds.take(num_batches * batch_size).batch(batch_size)
  return iter(tfds.as_numpy(ds.prefetch(config.prefetch)))
