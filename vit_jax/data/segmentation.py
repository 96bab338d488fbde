"""Examples of a dense dataset: an image and its class or depth per pixel.

The labels come from the `segmentation_mask` feature, as 'segmentation'
(int32 classes), or from the `depth` feature, as 'depth' (float32
disparity, 0 where unknown): `pp.label`, a `labels` task. The image is
resized to `pp.crop` and normalized as a classifier's test image; the
labels keep their own size (the loss and the metrics upsample the
predictions to it). Training flips image and labels together.
"""

from __future__ import annotations

from etils import epy

from vit_jax.data import pipeline

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

# pp.label: (the example's key, its dtype).
TARGETS = {'segmentation_mask': ('segmentation', 'int32'),
           'depth': ('depth', 'float32')}


def target_key(label):
  """The example's key of `pp.label`'s per-pixel labels."""
  if label not in TARGETS:
    raise ValueError(f'A dense task reads pp.label in {sorted(TARGETS)}, '
                     f'got {label!r}.')
  return TARGETS[label][0]


def _example(image, labels, pp):
  key, dtype = TARGETS[pp.label]
  return {'image': pipeline.preprocess_eval(image, pp),
          key: tf.cast(labels[..., 0], dtype)}


def train_example(image, labels, seed, *, pp):
  """A training example (`pipeline.train_dataset`'s `example`): image and
  labels flipped left-right together, with probability 1/2 if `pp.flip`."""
  if pp.flip:
    flip = tf.random.stateless_uniform([], seed) < 0.5
    image = tf.cond(flip, lambda: image[:, ::-1], lambda: image)
    labels = tf.cond(flip, lambda: labels[:, ::-1], lambda: labels)
  return _example(image, labels, pp)


def eval_example(features, *, info, pp):
  """A test example (`pipeline.eval_dataset`'s `example`), `mask` 1."""
  image, labels = pipeline.decode(features, info.channels, pp.label)
  return dict(_example(image, labels, pp), mask=tf.constant(1.0))


def train_iterator(info, config, *, batch_size, rows=None, start_step=0):
  """This process's rows of the training batches (`pipeline`'s stream)."""
  return pipeline.train_iterator(
      info, config, batch_size=batch_size, rows=rows, start_step=start_step,
      example=lambda image, labels, seed: train_example(image, labels, seed,
                                                        pp=config.pp))
