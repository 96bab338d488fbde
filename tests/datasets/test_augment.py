"""RandAugment ops against PIL and numpy, random erasing's statistics, and
the training pipeline with both on."""

import math

import numpy as np
from PIL import Image, ImageEnhance, ImageOps
import pytest
import tensorflow as tf

from vit_jax.data import augment
from vit_jax.data import pipeline

FILL = 128


def _image(h=24, w=20, seed=0):
  """Skewed random uint8 pixels, without the fill value (128)."""
  rng = np.random.default_rng(seed)
  image = (rng.random((h, w, 3))**2 * 200 + 30).astype(np.uint8)
  image[image == FILL] = 127
  return image


def _seed(i):
  return tf.constant([i, 0], tf.int64)


@pytest.mark.parametrize('op, arg', [
    (augment.rotate, 0.), (augment.shear_x, 0.), (augment.shear_y, 0.),
    (augment.translate_x, 0.), (augment.translate_y, 0.),
    (augment.brightness, 1.), (augment.color, 1.), (augment.contrast, 1.),
    (augment.sharpness, 1.), (augment.posterize, 8), (augment.solarize, 256),
    (augment.solarize_add, 0)])
def test_neutral_argument_keeps_image(op, arg):
  image = _image()
  np.testing.assert_array_equal(op(image, arg), image)


def test_rotate_90_is_rot90():
  image = _image(16, 16)
  np.testing.assert_array_equal(augment.rotate(image, 90.),
                                np.rot90(image, 1, axes=(0, 1)))
  np.testing.assert_array_equal(augment.rotate(image, -90.),
                                np.rot90(image, -1, axes=(0, 1)))


@pytest.mark.parametrize('k', [3, -5])
def test_translate_is_a_shift_with_gray_fill(k):
  image = _image()
  expected_x = np.full_like(image, FILL)
  expected_y = np.full_like(image, FILL)
  if k > 0:  # content moves by -k
    expected_x[:, :-k], expected_y[:-k] = image[:, k:], image[k:]
  else:
    expected_x[:, -k:], expected_y[-k:] = image[:, :k], image[:k]
  np.testing.assert_array_equal(augment.translate_x(image, float(k)),
                                expected_x)
  np.testing.assert_array_equal(augment.translate_y(image, float(k)),
                                expected_y)


def test_shear_x_from_its_matrix():
  """Output (x, y) reads input (x + level * y, y), nearest, else gray."""
  image, level = _image(16, 16), 0.23  # level * y never ends in .5
  expected = np.full_like(image, FILL)
  for y in range(16):
    for x in range(16):
      source = int(np.floor(x + level * y + 0.5))
      if source < 16:
        expected[y, x] = image[y, source]
  np.testing.assert_array_equal(augment.shear_x(image, level), expected)
  np.testing.assert_array_equal(
      augment.shear_y(image.transpose(1, 0, 2), level),
      expected.transpose(1, 0, 2))


def test_pixel_ops_match_pil():
  image = _image()
  flat = image.copy()
  flat[..., 1] = 77  # a one-valued channel: autocontrast/equalize keep it
  for im in (image, flat):
    pil = Image.fromarray(im)
    np.testing.assert_array_equal(augment.autocontrast(im),
                                  ImageOps.autocontrast(pil))
    np.testing.assert_array_equal(augment.equalize(im), ImageOps.equalize(pil))
    np.testing.assert_array_equal(augment.invert(im), ImageOps.invert(pil))
    for bits in range(1, 9):
      np.testing.assert_array_equal(augment.posterize(im, bits),
                                    ImageOps.posterize(pil, bits))
    for threshold in (0, 50, 128, 200, 256):
      np.testing.assert_array_equal(augment.solarize(im, threshold),
                                    ImageOps.solarize(pil, threshold))


@pytest.mark.parametrize('factor', [0.1, 0.5, 1.5, 1.9])
def test_enhance_ops_match_pil(factor):
  """Equal up to rounding (PIL rounds where big_vision's blend truncates)."""
  image = _image()
  pil = Image.fromarray(image)
  for op, enhancer in ((augment.brightness, ImageEnhance.Brightness),
                       (augment.color, ImageEnhance.Color),
                       (augment.contrast, ImageEnhance.Contrast),
                       (augment.sharpness, ImageEnhance.Sharpness)):
    ours = op(image, factor).numpy().astype(int)
    np.testing.assert_allclose(ours, np.asarray(enhancer(pil).enhance(factor)),
                               atol=1)


def test_posterize_0_bits_is_big_visions_1_bit():
  image = _image()
  np.testing.assert_array_equal(augment.posterize(image, 0), image & 128)


def test_solarize_add():
  image = _image()
  added = np.minimum(image.astype(int) + 100, 255)
  np.testing.assert_array_equal(augment.solarize_add(image, 100),
                                np.where(image < 128, added, image))


def test_cutout_is_a_gray_square():
  image = _image(64, 64)
  for i in range(10):
    out = augment.cutout(image, 6, _seed(i)).numpy()
    rows, cols = np.nonzero((out != image).any(-1))
    assert (out[rows, cols] == FILL).all()
    top, bottom, left, right = rows.min(), rows.max(), cols.min(), cols.max()
    assert len(rows) == (bottom - top + 1) * (right - left + 1)  # a rectangle
    for lo, hi in ((top, bottom), (left, right)):  # side 12, clipped
      assert hi - lo + 1 == 12 or (lo == 0 or hi == 63) and hi - lo + 1 <= 12


def test_level_to_arg_follows_big_visions_formulas():
  assert list(augment.OPS) == [
      'AutoContrast', 'Equalize', 'Invert', 'Rotate', 'Posterize', 'Solarize',
      'Color', 'Contrast', 'Brightness', 'Sharpness', 'ShearX', 'ShearY',
      'TranslateX', 'TranslateY', 'Cutout', 'SolarizeAdd']
  arg = augment.LEVEL_TO_ARG
  assert arg['Rotate'](5) == pytest.approx(15.)  # 30 degrees * level / 10
  assert arg['Rotate'](15) == pytest.approx(45.)
  for name in ('Color', 'Contrast', 'Brightness', 'Sharpness'):
    assert arg[name](0) == pytest.approx(0.1)  # level 0 is not neutral
    assert arg[name](10) == pytest.approx(1.9)
    assert arg[name](5) == pytest.approx(1.0)
  assert arg['ShearX'](10) == pytest.approx(0.3)
  assert arg['TranslateY'](10) == pytest.approx(100.)
  assert (arg['Posterize'](10), arg['Posterize'](15)) == (4, 6)
  assert (arg['Solarize'](5), arg['Solarize'](10)) == (128, 256)
  assert (arg['SolarizeAdd'](10), arg['Cutout'](10)) == (110, 40)


def test_randaugment_seeded():
  image = _image(128, 128)  # wider than a translation at magnitude 10
  a = augment.randaugment(image, 2, 10, _seed(0))
  np.testing.assert_array_equal(a, augment.randaugment(image, 2, 10, _seed(0)))
  outputs = {augment.randaugment(image, 2, 10, _seed(i)).numpy().tobytes()
             for i in range(12)}
  assert len(outputs) >= 10
  np.testing.assert_array_equal(augment.randaugment(image, 0, 10, _seed(0)),
                                image)


def test_randaugment_layer_is_one_op():
  """One layer gives one op's output at the magnitude (either sign), or a
  cutout (gray pixels only)."""
  image, magnitude = _image(32, 32), 7
  candidates = []
  for name, op in augment.OPS.items():
    arg = augment.LEVEL_TO_ARG[name](magnitude)
    for sign in (1, -1):
      if name != 'Cutout':
        signed = sign * arg if isinstance(arg, float) else arg
        candidates.append(op(image, signed, None).numpy())
  for i in range(20):
    out = augment.randaugment(image, 1, magnitude, _seed(i)).numpy()
    changed = out != image
    assert (any((out == c).all() for c in candidates) or
            changed.any() and (out[changed] == FILL).all())


@pytest.mark.parametrize('randaug', [(2,), (2.5, 10), (-1, 10), (2, -3), 5])
def test_bad_randaug_is_refused(randaug):
  with pytest.raises(ValueError, match='pp.randaug'):
    augment.check_randaug(randaug)
  with pytest.raises(ValueError, match='pp.erasing'):
    augment.check_erasing(1.5)


def _erased(image, out):
  return (out != image).any(-1)


def test_random_erasing_area_and_untouched_pixels():
  h, w = 96, 80
  image = np.full((h, w, 3), 7.0, np.float32)  # no normal draw equals 7
  # h, w = round(sqrt(area * ratio)), round(sqrt(area / ratio)): rounding
  # moves the area by at most (h + w) / 2 + 1/4 pixels.
  slack = ((h + w) / 2 + 0.25) / (h * w)
  noise = []
  for i in range(30):
    out = augment.random_erasing(image, 1.0, _seed(i)).numpy()
    mask = _erased(image, out)
    rows, cols = np.nonzero(mask)
    eh, ew = np.ptp(rows) + 1, np.ptp(cols) + 1
    assert mask.sum() == eh * ew  # a rectangle, all else untouched
    assert eh < h and ew < w
    assert 0.02 - slack <= mask.mean() <= 1 / 3 + slack
    assert 0.3 / 2 < eh / ew < 1 / 0.3 * 2  # aspect ratio, after rounding
    noise.append(out[mask].ravel())
  noise = np.concatenate(noise)
  assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02


def test_random_erasing_probability():
  image = np.zeros((32, 32, 3), np.float32) + 7
  n, p = 400, 0.25
  erase = tf.function(lambda seeds: tf.map_fn(
      lambda seed: augment.random_erasing(image, p, seed), seeds,
      fn_output_signature=tf.float32))
  seeds = tf.stack([tf.range(n, dtype=tf.int64), tf.zeros(n, tf.int64)], 1)
  applied = _erased(image, erase(seeds).numpy()).any((1, 2)).sum()
  assert abs(applied / n - p) < 4 * math.sqrt(p * (1 - p) / n)
  out = augment.random_erasing(image, 0.0, _seed(0))
  np.testing.assert_array_equal(out, image)
  np.testing.assert_array_equal(augment.random_erasing(image, p, _seed(3)),
                                augment.random_erasing(image, p, _seed(3)))


def _info(config):
  return pipeline.dataset_info(
      pipeline.get_builder(config), config)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_preprocess_train_unchanged_when_off(tiny_config):
  """Both off: the original transform (crop, resize, flip, clip), op by op."""
  pp = tiny_config.pp
  assert pp.randaug is None and pp.erasing == 0
  image = tf.constant(_image(28, 28))
  for i in range(3):
    seed = _seed(i)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros([0, 0, 4], tf.float32), seed=seed,
        area_range=(pp.area_min, 1.0), aspect_ratio_range=(3 / 4, 4 / 3),
        min_object_covered=0.0, use_image_if_no_bounding_boxes=True)
    expected = tf.image.resize(
        tf.cast(tf.slice(image, begin, size), tf.float32) / 127.5 - 1.0,
        [pp.crop, pp.crop])
    expected = tf.image.stateless_random_flip_left_right(
        expected, tf.random.experimental.stateless_fold_in(seed, 1))
    np.testing.assert_array_equal(
        pipeline.preprocess_train(image, seed, pp),
        tf.clip_by_value(expected, -1.0, 1.0))


def test_pipeline_with_augmentation_deterministic(tiny_config):
  """Batch 1 of a stream equals batch 0 of a stream resumed at step 1."""
  info = _info(tiny_config)
  plain = next(pipeline.train_iterator(info, tiny_config, batch_size=8))
  tiny_config.pp.randaug = (2, 10)
  tiny_config.pp.erasing = 0.5
  a = _take(pipeline.train_iterator(info, tiny_config, batch_size=8), 2)
  resumed = next(pipeline.train_iterator(info, tiny_config,
                                               batch_size=8, start_step=1))
  np.testing.assert_array_equal(a[1]['image'], resumed['image'])
  assert a[0]['image'].shape == (8, 32, 32, 3)
  assert not np.allclose(a[0]['image'], plain['image'])
  tiny_config.pp.randaug = (2, 'ten')
  with pytest.raises(ValueError, match='pp.randaug'):
    pipeline.train_iterator(info, tiny_config, batch_size=8)
