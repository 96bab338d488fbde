"""DINO's multi-crop views (Caron et al., 2021, `DataAugmentationDINO`), in
the tf.data training pipeline.

Each image gives two global crops and `num_local` local crops: a random
resized crop (bicubic) at the view's scale, a flip, colour jitter
(brightness 0.4, contrast 0.4, saturation 0.2, hue 0.1; p = 0.8; applied
in that order, where torchvision shuffles it), grayscale (p = 0.2), a
Gaussian blur (p = 1.0, 0.1 and 0.5 for the first global, the second
global and the local crops) and solarization (the second global crop, p =
0.2). All randomness is stateless: a view is a pure function of (seed,
image), so a resumed run sees the crops it would have seen.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import math


from etils import epy
with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

from vit_jax.data import pipeline

# DINO's constants.
JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)
JITTER_P, GRAY_P, SOLARIZE_P = 0.8, 0.2, 0.2
BLUR_P = (1.0, 0.1, 0.5)  # first global, second global, local
ASPECT = (3 / 4, 4 / 3)
KEYS = ('global_scale', 'local_scale', 'local_size', 'num_local',
        'blur_sigma')


def check(crops, image_size: int, patch) -> None:
  """Fails fast on `config.dino.crops`: scales, sizes, local crop count."""
  missing = [k for k in KEYS if k not in crops]
  if missing:
    raise ValueError(f'config.dino.crops lacks {missing}.')
  for key in ('global_scale', 'local_scale', 'blur_sigma'):
    lo, hi = crops[key]
    if not 0 < lo <= hi or (key != 'blur_sigma' and hi > 1):
      raise ValueError(f'config.dino.crops.{key}={tuple(crops[key])}: '
                       'expected 0 < min <= max' +
                       (' <= 1.' if key != 'blur_sigma' else '.'))
  if crops.num_local < 0:
    raise ValueError(f'config.dino.crops.num_local={crops.num_local}: '
                     'expected >= 0.')
  for name, size in (('pp.crop', image_size), ('local_size', crops.local_size)):
    if size % patch[0] or size % patch[1] or size < max(patch):
      raise ValueError(f'config.dino.crops: {name}={size} is not a multiple '
                       f'of the patch size {tuple(patch)}.')


def _uniform(seed, lo=0.0, hi=1.0):
  return tf.random.stateless_uniform([], seed, lo, hi)


def _gray(image):
  return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def color_jitter(image, seed):
  """torchvision's ColorJitter factors on [0, 1] RGB, in a fixed order."""
  fold = lambda i: tf.random.experimental.stateless_fold_in(seed, i)
  b, c, s = (JITTER[k] for k in ('brightness', 'contrast', 'saturation'))
  image = tf.clip_by_value(image * _uniform(fold(0), 1 - b, 1 + b), 0., 1.)
  mean = tf.reduce_mean(tf.image.rgb_to_grayscale(image))
  image = tf.clip_by_value(
      mean + _uniform(fold(1), 1 - c, 1 + c) * (image - mean), 0., 1.)
  gray = _gray(image)
  image = tf.clip_by_value(
      gray + _uniform(fold(2), 1 - s, 1 + s) * (image - gray), 0., 1.)
  hue = JITTER['hue']
  return tf.image.adjust_hue(image, _uniform(fold(3), -hue, hue))


def gaussian_blur(image, sigma, max_sigma: float):
  """A separable Gaussian blur of standard deviation `sigma` pixels, edges
  reflected; the kernel spans 3 `max_sigma` either side (at most the
  image)."""
  radius = max(1, min(math.ceil(3 * max_sigma), min(image.shape[:2]) - 1))
  x = tf.range(-radius, radius + 1, dtype=tf.float32)
  k = tf.exp(-x**2 / (2 * sigma**2))
  k /= tf.reduce_sum(k)
  padded = tf.pad(image[None], [[0, 0], [radius, radius], [radius, radius],
                                [0, 0]], mode='REFLECT')
  channels = 3
  rows = tf.tile(tf.reshape(k, [-1, 1, 1, 1]), [1, 1, channels, 1])
  cols = tf.tile(tf.reshape(k, [1, -1, 1, 1]), [1, 1, channels, 1])
  out = tf.nn.depthwise_conv2d(padded, rows, [1, 1, 1, 1], 'VALID')
  return tf.nn.depthwise_conv2d(out, cols, [1, 1, 1, 1], 'VALID')[0]


def view(image, seed, *, size: int, scale, blur_p: float, solarize_p: float,
         blur_sigma):
  """One crop of a uint8 image -> float [0, 1], (size, size, 3)."""
  fold = lambda i: tf.random.experimental.stateless_fold_in(seed, i)
  begin, extent, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed=fold(0),
      area_range=tuple(scale), aspect_ratio_range=ASPECT,
      min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
  crop = tf.cast(tf.slice(image, begin, extent), tf.float32) / 255.
  x = tf.clip_by_value(tf.image.resize(crop, [size, size], method='bicubic',
                                       antialias=True), 0., 1.)
  x = tf.ensure_shape(x, [size, size, 3])
  x = tf.image.stateless_random_flip_left_right(x, fold(1))
  x = tf.cond(_uniform(fold(2)) < JITTER_P, lambda: color_jitter(x, fold(3)),
              lambda: x)
  x = tf.cond(_uniform(fold(4)) < GRAY_P, lambda: _gray(x), lambda: x)
  x = tf.ensure_shape(x, [size, size, 3])
  sigma = _uniform(fold(5), *blur_sigma)
  x = tf.cond(_uniform(fold(6)) < blur_p,
              lambda: gaussian_blur(x, sigma, blur_sigma[1]), lambda: x)
  x = tf.cond(_uniform(fold(7)) < solarize_p,
              lambda: tf.where(x >= 0.5, 1. - x, x), lambda: x)
  return tf.ensure_shape(x, [size, size, 3])


def views(image, seed, crops, global_size: int):
  """{'global': (2, G, G, 3), 'local': (num_local, L, L, 3)} in [0, 1] of a
  uint8 image; view i uses the seed folded with i."""
  fold = lambda i: tf.random.experimental.stateless_fold_in(seed, i)
  settings = dict(blur_sigma=tuple(crops.blur_sigma))
  globals_ = [view(image, fold(i), size=global_size, scale=crops.global_scale,
                   blur_p=BLUR_P[i], solarize_p=(0., SOLARIZE_P)[i],
                   **settings) for i in range(2)]
  locals_ = [view(image, fold(2 + i), size=crops.local_size,
                  scale=crops.local_scale, blur_p=BLUR_P[2], solarize_p=0.,
                  **settings) for i in range(crops.num_local)]
  out = {'global': tf.stack(globals_)}
  if locals_:
    out['local'] = tf.stack(locals_)
  return out


def example_fn(config):
  """(uint8 image, label, seed) -> its views normalized as `config.pp`
  says, the label dropped: `pipeline.train_dataset`'s `example` for DINO."""
  def example(image, label, seed):
    del label  # pretraining without labels
    out = views(image, seed, config.dino.crops, config.pp.crop)
    # [0, 1] -> [-1, 1] -> the run's normalization.
    return {k: pipeline.normalize(v * 2. - 1., config.pp)
            for k, v in out.items()}
  return example
