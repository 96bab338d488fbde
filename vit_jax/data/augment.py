"""RandAugment and random erasing for the tf.data training pipeline.

RandAugment has big_vision's op set and magnitude scale (big_vision/pp/
autoaugment.py, from TF's official EfficientNet autoaugment): 16 ops on uint8
images, a shared magnitude where 10 is `_MAX_LEVEL`. Random erasing is
DeiT's (timm's RandomErasing, 'pixel' mode) on normalized float images.

All randomness is stateless, derived from a seed with `stateless_fold_in`:
an example's augmentation is a pure function of (seed, image).
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import functools
import math

from etils import epy

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

_MAX_LEVEL = 10.
_FILL = 128  # gray where geometric ops uncover pixels (big_vision's replace)
# big_vision's RandAugment hyper-parameters, in pixels whatever the image size.
_TRANSLATE_CONST = 100
_CUTOUT_CONST = 40


def _fold(seed, i):
  return tf.random.experimental.stateless_fold_in(seed, i)


def blend(image1, image2, factor):
  """image1 + factor * (image2 - image1), clipped and truncated to uint8."""
  image1, image2 = tf.cast(image1, tf.float32), tf.cast(image2, tf.float32)
  mixed = image1 + factor * (image2 - image1)
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _apply_luts(image, luts):
  """Maps each channel c of a uint8 image through `luts[c]` ([3, 256])."""
  index = tf.cast(image, tf.int32) + 256 * tf.range(3)
  return tf.cast(tf.gather(tf.reshape(luts, [-1]), index), tf.uint8)


def autocontrast(image):
  """PIL's: per channel, the lowest value -> 0 and the highest -> 255 (in
  float64, as PIL's Python arithmetic, so truncation agrees)."""
  pixels = tf.reshape(tf.cast(image, tf.float64), [-1, 3])
  lo, hi = tf.reduce_min(pixels, 0), tf.reduce_max(pixels, 0)
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  lut = tf.range(256, dtype=tf.float64)[None] * scale[:, None] + (
      -lo * scale)[:, None]
  lut = tf.clip_by_value(tf.floor(lut), 0, 255)
  identity = tf.range(256, dtype=tf.float64)[None]
  return _apply_luts(image, tf.cast(
      tf.where((hi > lo)[:, None], lut, identity), tf.int32))


def equalize(image):
  """PIL's: per channel, the cumulative histogram over `step` (the pixel
  count less the last present value's, over 255); step 0 keeps the channel."""
  index = tf.reshape(tf.cast(image, tf.int32) + 256 * tf.range(3), [-1])
  hist = tf.reshape(tf.math.unsorted_segment_sum(
      tf.ones_like(index), index, 3 * 256), [3, 256])
  last = tf.reduce_max(tf.where(hist > 0, tf.range(256), -1), 1)
  step = (tf.reduce_sum(hist, 1) - tf.gather(hist, last, batch_dims=1)) // 255
  safe = tf.maximum(step, 1)[:, None]
  lut = (tf.cumsum(hist, axis=1, exclusive=True) + safe // 2) // safe
  lut = tf.where((step > 0)[:, None], tf.clip_by_value(lut, 0, 255),
                 tf.range(256)[None])
  return _apply_luts(image, lut)


def invert(image):
  return 255 - tf.convert_to_tensor(image)


def posterize(image, bits):
  """Keeps the `bits` high bits; 0 bits acts as 1, as big_vision's shifts
  (TF clamps a shift by 8 to 7)."""
  bits = max(1, min(8, int(bits)))
  return tf.bitwise.bitwise_and(image, tf.constant(256 - 2**(8 - bits),
                                                   tf.uint8))


def solarize(image, threshold=128):
  """Pixels at or above `threshold` are inverted (int32: 256 is valid)."""
  return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def solarize_add(image, addition=0, threshold=128):
  """Adds `addition` (clipped to [0, 255]) to pixels below `threshold`."""
  added = tf.clip_by_value(tf.cast(image, tf.int32) + addition, 0, 255)
  return tf.where(tf.cast(image, tf.int32) < threshold,
                  tf.cast(added, tf.uint8), image)


def color(image, factor):
  """PIL's Color: blend with the grayscale image."""
  gray = tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))
  return blend(gray, image, factor)


def contrast(image, factor):
  """PIL's Contrast: blend with the mean gray level (rounded)."""
  gray = tf.cast(tf.image.rgb_to_grayscale(image), tf.float32)
  mean = tf.floor(tf.reduce_mean(gray) + 0.5)
  return blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image, factor):
  """PIL's Brightness: blend with black."""
  return blend(tf.zeros_like(image), image, factor)


def sharpness(image, factor):
  """PIL's Sharpness: blend with the SMOOTH-filtered image (borders kept)."""
  kernel = tf.constant([[1., 1., 1.], [1., 5., 1.], [1., 1., 1.]]) / 13.
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  smooth = tf.nn.depthwise_conv2d(tf.cast(image, tf.float32)[None], kernel,
                                  [1, 1, 1, 1], padding='VALID')[0]
  smooth = tf.cast(tf.clip_by_value(smooth, 0.0, 255.0), tf.uint8)
  inside = tf.pad(tf.ones_like(smooth, tf.bool), [[1, 1], [1, 1], [0, 0]])
  smooth = tf.where(inside, tf.pad(smooth, [[1, 1], [1, 1], [0, 0]]), image)
  return blend(smooth, image, factor)


def _transform(image, matrix):
  """Output pixel (x, y) reads input (a0 x + a1 y + a2, b0 x + b1 y + b2),
  nearest neighbour; outside the input: gray `_FILL`."""
  matrix = tf.cast(tf.stack(list(matrix) + [0., 0.]), tf.float32)
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=matrix[None],
      output_shape=tf.shape(image)[:2], fill_value=float(_FILL),
      interpolation='NEAREST', fill_mode='CONSTANT')[0]


def rotate(image, degrees):
  """Rotates counter-clockwise (as displayed) about the image center."""
  radians = tf.cast(degrees, tf.float32) * (math.pi / 180.0)
  cos, sin = tf.cos(radians), tf.sin(radians)
  hw = tf.cast(tf.shape(image)[:2], tf.float32) - 1.0
  x_offset = (hw[1] - (cos * hw[1] - sin * hw[0])) / 2.0
  y_offset = (hw[0] - (sin * hw[1] + cos * hw[0])) / 2.0
  return _transform(image, [cos, -sin, x_offset, sin, cos, y_offset])


def shear_x(image, level):
  return _transform(image, [1., level, 0., 0., 1., 0.])


def shear_y(image, level):
  return _transform(image, [1., 0., 0., level, 1., 0.])


def translate_x(image, pixels):
  """Moves the content `pixels` to the left (big_vision's sign)."""
  return _transform(image, [1., 0., pixels, 0., 1., 0.])


def translate_y(image, pixels):
  """Moves the content `pixels` up."""
  return _transform(image, [1., 0., 0., 0., 1., pixels])


def cutout(image, pad_size, seed):
  """A gray square of side 2 * pad_size (clipped at the borders), its
  center uniform over the image."""
  shape = tf.shape(image)
  cy = tf.random.stateless_uniform([], _fold(seed, 0), 0, shape[0], tf.int32)
  cx = tf.random.stateless_uniform([], _fold(seed, 1), 0, shape[1], tf.int32)
  rows = tf.range(shape[0])[:, None, None]
  cols = tf.range(shape[1])[None, :, None]
  inside = ((rows >= cy - pad_size) & (rows < cy + pad_size) &
            (cols >= cx - pad_size) & (cols < cx + pad_size))
  return tf.where(inside, tf.constant(_FILL, tf.uint8), image)


def _enhance(level):
  return level / _MAX_LEVEL * 1.8 + 0.1


# big_vision's magnitude -> argument; ops in `_SIGNED` get a random sign.
LEVEL_TO_ARG = {
    'AutoContrast': lambda level: None,
    'Equalize': lambda level: None,
    'Invert': lambda level: None,
    'Rotate': lambda level: level / _MAX_LEVEL * 30.,  # degrees
    'Posterize': lambda level: int(level / _MAX_LEVEL * 4),  # bits kept
    'Solarize': lambda level: int(level / _MAX_LEVEL * 256),  # threshold
    'Color': _enhance,
    'Contrast': _enhance,
    'Brightness': _enhance,
    'Sharpness': _enhance,
    'ShearX': lambda level: level / _MAX_LEVEL * 0.3,
    'ShearY': lambda level: level / _MAX_LEVEL * 0.3,
    'TranslateX': lambda level: level / _MAX_LEVEL * _TRANSLATE_CONST,
    'TranslateY': lambda level: level / _MAX_LEVEL * _TRANSLATE_CONST,
    'Cutout': lambda level: int(level / _MAX_LEVEL * _CUTOUT_CONST),
    'SolarizeAdd': lambda level: int(level / _MAX_LEVEL * 110),  # addition
}
_SIGNED = ('Rotate', 'ShearX', 'ShearY', 'TranslateX', 'TranslateY')

# (image, argument, seed) -> image, in big_vision's order (the op index).
OPS = {
    'AutoContrast': lambda image, arg, seed: autocontrast(image),
    'Equalize': lambda image, arg, seed: equalize(image),
    'Invert': lambda image, arg, seed: invert(image),
    'Rotate': lambda image, arg, seed: rotate(image, arg),
    'Posterize': lambda image, arg, seed: posterize(image, arg),
    'Solarize': lambda image, arg, seed: solarize(image, arg),
    'Color': lambda image, arg, seed: color(image, arg),
    'Contrast': lambda image, arg, seed: contrast(image, arg),
    'Brightness': lambda image, arg, seed: brightness(image, arg),
    'Sharpness': lambda image, arg, seed: sharpness(image, arg),
    'ShearX': lambda image, arg, seed: shear_x(image, arg),
    'ShearY': lambda image, arg, seed: shear_y(image, arg),
    'TranslateX': lambda image, arg, seed: translate_x(image, arg),
    'TranslateY': lambda image, arg, seed: translate_y(image, arg),
    'Cutout': cutout,
    'SolarizeAdd': lambda image, arg, seed: solarize_add(image, arg),
}


def check_randaug(randaug):
  """(num_layers, magnitude) as given in `pp.randaug`, or a ValueError."""
  if (not isinstance(randaug, (tuple, list)) or len(randaug) != 2 or
      not isinstance(randaug[0], int) or randaug[0] < 0 or
      not isinstance(randaug[1], (int, float)) or randaug[1] < 0):
    raise ValueError(
        f'pp.randaug must be (num_layers, magnitude), a non-negative int and '
        f'a non-negative number (e.g. (2, 15)); got {randaug!r}.')
  return int(randaug[0]), float(randaug[1])


@functools.lru_cache
def _layer(magnitude):
  """One RandAugment layer at `magnitude`: (uint8 image, seed) -> image. A
  tf.function traced once, its 16 branches shared by every layer and every
  pipeline of the process (tracing them takes seconds)."""

  def layer(image, seed):
    index = tf.random.stateless_uniform([], _fold(seed, 0), 0, len(OPS),
                                        tf.int32)
    sign = tf.where(tf.random.stateless_uniform([], _fold(seed, 1)) < 0.5,
                    -1.0, 1.0)

    def branch(name):
      arg = LEVEL_TO_ARG[name](magnitude)
      return OPS[name](image, sign * arg if name in _SIGNED else arg,
                       _fold(seed, 2))

    return tf.switch_case(index, [functools.partial(branch, n) for n in OPS])

  return tf.function(layer, autograph=False, input_signature=(
      tf.TensorSpec([None, None, None], tf.uint8),
      tf.TensorSpec([2], tf.int64)))


def randaugment(image, num_layers, magnitude, seed):
  """Applies `num_layers` ops, each drawn uniformly from `OPS`, at
  `magnitude` (0..10 on big_vision's scale; more extrapolates) to a uint8
  [H, W, 3] image."""
  num_layers, magnitude = check_randaug((num_layers, magnitude))
  image = tf.convert_to_tensor(image)
  shape = image.shape
  for layer in range(num_layers):
    image = _layer(magnitude)(image, tf.cast(_fold(seed, layer), tf.int64))
    image.set_shape(shape)
  return image


def check_erasing(probability):
  """`pp.erasing` as a float, or a ValueError."""
  if not isinstance(probability, (int, float)) or not 0 <= probability <= 1:
    raise ValueError(f'pp.erasing is a probability in [0, 1]; got '
                     f'{probability!r}.')
  return float(probability)


def random_erasing(image, probability, seed, **kw):
  """timm's RandomErasing, 'pixel' mode, on a normalized float [H, W, C]
  image: with `probability`, one rectangle of `area` fraction and log-uniform
  aspect ratio in [min_aspect, 1/min_aspect] (the first of `attempts` that
  fits) gets standard normal values. Not converted by autograph (its loop
  over attempts is meant to unroll)."""
  return tf.autograph.experimental.do_not_convert(_random_erasing)(
      image, probability, seed, **kw)


def _random_erasing(image, probability, seed, *, area=(0.02, 1 / 3),
                    min_aspect=0.3, attempts=10):
  probability = check_erasing(probability)
  shape = tf.shape(image)
  h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
  uniform = lambda i, n=(): tf.random.stateless_uniform(n, _fold(seed, i))
  target = h * w * (area[0] + (area[1] - area[0]) * uniform(1, [attempts]))
  log_ratio = math.log(min_aspect) * (1.0 - 2.0 * uniform(2, [attempts]))
  ratio = tf.exp(log_ratio)
  # tf.round and Python's round both round half to even.
  eh, ew = tf.round(tf.sqrt(target * ratio)), tf.round(tf.sqrt(target / ratio))
  fits = (eh < h) & (ew < w)
  first = tf.argmax(tf.cast(fits, tf.int32))  # 0 when none fits
  eh, ew = eh[first], ew[first]
  apply = (uniform(0) < probability) & fits[first]
  # timm's randint(0, h - eh): both ends included.
  top = tf.minimum(tf.floor(uniform(3) * (h - eh + 1)), h - eh)
  left = tf.minimum(tf.floor(uniform(4) * (w - ew + 1)), w - ew)
  rows = tf.range(h)[:, None, None]
  cols = tf.range(w)[None, :, None]
  inside = ((rows >= top) & (rows < top + eh) & (cols >= left) &
            (cols < left + ew) & apply)
  noise = tf.random.stateless_normal(shape, _fold(seed, 5), dtype=image.dtype)
  return tf.where(inside, noise, image)
