"""InternVL's dynamic tiling (`data/tiling.py`) against transformers'
InternVL image processor (tests/data/internvl_tiles_golden.npz, written by
scripts/make_internvl_tiles_golden.py) and against numpy."""

import os

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from vit_jax.data import pipeline
from vit_jax.data import tiling

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data',
                      'internvl_tiles_golden.npz')
TILE, MIN_TILES, MAX_TILES = 28, 1, 6  # the golden file's


@pytest.fixture(scope='module')
def golden():
  return dict(np.load(GOLDEN))


def test_grids_are_internvls_in_its_order():
  assert tiling.grids(1, 4) == [(1, 1), (1, 2), (2, 1), (1, 3), (3, 1),
                                (1, 4), (2, 2), (4, 1)]
  assert tiling.grids(3, 4) == [(1, 3), (3, 1), (1, 4), (2, 2), (4, 1)]


def test_grid_choice_equals_transformers(golden):
  """Every size of the golden table, in python and in the TF graph."""
  sizes, want = golden['grid_sizes'], golden['grid']
  got = [tiling.closest_grid(h, w, TILE, MIN_TILES, MAX_TILES)
         for h, w in sizes]
  np.testing.assert_array_equal(got, want)
  graph = tf.function(lambda h, w: tf.stack(tiling._closest_grid_tf(
      h, w, TILE, MIN_TILES, MAX_TILES)))
  got_tf = [graph(tf.constant(h), tf.constant(w)).numpy() for h, w in sizes]
  np.testing.assert_array_equal(got_tf, want)
  # A square of 2 x 2 tiles' area: (1, 1) and (2, 2) tie, the larger wins;
  # a quarter of that area keeps (1, 1).
  assert tiling.closest_grid(56, 56, 28, 1, 4) == (2, 2)
  assert tiling.closest_grid(28, 28, 28, 1, 4) == (1, 1)


def test_tiles_equal_the_processors(golden):
  """Each golden image's tiles, thumbnail and NaN padding; pixels within
  3 levels of 255 of PIL's bicubic (PIL rounds to uint8; TF does not)."""
  for i in range(5):
    image, want = golden[f'image_{i}'], golden[f'tiles_{i}']
    got = tiling.tiles(tf.constant(image, tf.float32) / 127.5 - 1, TILE,
                       MIN_TILES, MAX_TILES).numpy()
    assert got.shape == (tiling.slots(MAX_TILES), TILE, TILE, 3)
    n = len(want)
    assert np.isnan(got[n:]).all() and not np.isnan(got[:n]).any()
    np.testing.assert_allclose((got[:n] + 1) / 2, want, atol=3 / 255)
    assert np.abs((got[:n] + 1) / 2 - want).mean() < 0.5 / 255


def test_tiles_are_the_grid_cut_row_by_row():
  """Numpy: an image already at its grid's size is cut without resizing
  (tile k is row k // columns, column k % columns), the thumbnail is its
  2 x 2 (then 3 x 3) box average when the grid is 2 x 1 tiles of 4 px."""
  image = np.random.default_rng(0).uniform(-1, 1, (4, 8, 3)).astype(
      np.float32)
  got = tiling.tiles(tf.constant(image), 4, 1, 3).numpy()
  np.testing.assert_allclose(got[0], image[:, :4], atol=1e-6)
  np.testing.assert_allclose(got[1], image[:, 4:], atol=1e-6)
  assert got.shape == (4, 4, 4, 3) and np.isnan(got[3]).all()
  single = tiling.tiles(tf.constant(image[:, :4]), 4, 1, 1).numpy()
  np.testing.assert_allclose(single, image[None, :, :4], atol=1e-6)


def test_the_pipeline_tiles_train_and_eval_images():
  pp = ml_collections.ConfigDict(dict(crop=28, flip=True, area_min=1.0,
                                      tiles=dict(min=1, max=4)))
  image = tf.constant(np.random.default_rng(1).integers(
      0, 256, (28, 84, 3)), tf.uint8)
  evaluated = pipeline.preprocess_eval(image, pp).numpy()
  want = tiling.tiles(tf.cast(image, tf.float32) / 127.5 - 1, 28, 1,
                      4).numpy()
  np.testing.assert_array_equal(np.isnan(evaluated), np.isnan(want))
  np.testing.assert_allclose(np.nan_to_num(evaluated), np.nan_to_num(want),
                             atol=1e-6)
  assert (~np.isnan(evaluated[:, 0, 0, 0])).sum() == 4  # 3 x 1, thumbnail
  trained = pipeline.preprocess_train(image, tf.constant([0, 1]), pp).numpy()
  assert trained.shape == (5, 28, 28, 3)
  flipped = np.nan_to_num(evaluated[[2, 1, 0]][:, :, ::-1])
  unflipped = np.nan_to_num(evaluated[:3])
  assert any(np.allclose(np.nan_to_num(trained[:3]), x, atol=1e-5)
             for x in (flipped, unflipped))
