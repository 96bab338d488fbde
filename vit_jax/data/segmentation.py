"""Examples of a segmentation dataset: an image and its class per pixel.

The labels come from the `segmentation_mask` feature (`pp.label`, a
`labels` task). The image is resized to `pp.crop` and normalized as a
classifier's test image; the mask keeps its own size (the loss and the
metrics upsample the logits to it). Training flips image and mask together.
"""

from __future__ import annotations

from etils import epy

from vit_jax.data import pipeline

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def _example(image, mask, pp):
  return {'image': pipeline.preprocess_eval(image, pp),
          'segmentation': tf.cast(mask[..., 0], tf.int32)}


def train_example(image, mask, seed, *, pp):
  """A training example (`pipeline.train_dataset`'s `example`): image and
  mask flipped left-right together, with probability 1/2 if `pp.flip`."""
  if pp.flip:
    flip = tf.random.stateless_uniform([], seed) < 0.5
    image = tf.cond(flip, lambda: image[:, ::-1], lambda: image)
    mask = tf.cond(flip, lambda: mask[:, ::-1], lambda: mask)
  return _example(image, mask, pp)


def eval_example(features, *, info, pp):
  """A test example (`pipeline.eval_dataset`'s `example`), `mask` 1."""
  image, mask = pipeline.decode(features, info.channels, pp.label)
  return dict(_example(image, mask, pp), mask=tf.constant(1.0))


def train_iterator(info, config, *, batch_size, rows=None, start_step=0):
  """This process's rows of the training batches (`pipeline`'s stream)."""
  return pipeline.train_iterator(
      info, config, batch_size=batch_size, rows=rows, start_step=start_step,
      example=lambda image, mask, seed: train_example(image, mask, seed,
                                                      pp=config.pp))
