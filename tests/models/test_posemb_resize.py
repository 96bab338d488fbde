"""Position-embedding tables resized to another grid (`posemb_resize`,
also `checkpoint.interpolate_posembed` and `resize_posemb_grid`, where the
original has them): against smooth functions sampled at the new patch
centers, and the original's linear zoom."""

import numpy as np
import pytest
import scipy.ndimage

from tests.helpers import cubic_taps_inside as _inside
from tests.helpers import smooth_1d as _smooth_1d
from vit_jax import checkpoint  # the original's helpers: interpolate_posembed, resize_posemb_grid


def _quadratic(h, w, channels=3):
  """Known smooth channels on patch centers ((i + .5) / h, (j + .5) / w)."""
  u, v = np.meshgrid((np.arange(h) + .5) / h, (np.arange(w) + .5) / w,
                     indexing='ij')
  return np.stack([1 + 2 * u - 3 * v, u * u - .5 * u * v + 2 * v * v,
                   np.sin(2 * u) * np.cos(v)][:channels], -1)


def _posemb(grid, cls=True):
  g = grid.reshape(1, -1, grid.shape[-1]).astype(np.float32)
  if not cls:
    return g
  return np.concatenate([np.full((1, 1, g.shape[-1]), 7., np.float32), g], 1)


@pytest.mark.parametrize('old,new', [((14, 14), (24, 16)), ((14, 14), (7, 10)),
                                     ((8, 8), (12, 12)), ((10, 6), (5, 9))])
def test_bicubic_samples_the_function_at_new_centers(old, new):
  out = checkpoint.resize_posemb_grid(
      _posemb(_quadratic(*old)), old_grid=None if old[0] == old[1] else old,
      new_grid=new, has_class_token=True)
  assert out.shape == (1, 1 + new[0] * new[1], 3) and out.dtype == np.float32
  np.testing.assert_array_equal(out[:, 0], np.full((1, 3), 7.))
  got, want = out[0, 1:].reshape(*new, 3), _quadratic(*new)
  # Keys' cubic reproduces quadratics exactly away from the borders.
  mask = _inside(old[0], new[0])[:, None] & _inside(old[1], new[1])[None, :]
  assert mask.sum() >= 4
  np.testing.assert_allclose(got[mask][:, :2], want[mask][:, :2], atol=1e-4)
  np.testing.assert_allclose(got[mask][:, 2], want[mask][:, 2], atol=5e-3)
  np.testing.assert_allclose(got, want, atol=0.1)


def test_same_size_is_identity():
  pe = np.random.default_rng(0).normal(size=(1, 17, 5)).astype(np.float32)
  for method in ('bicubic', 'linear_zoom'):
    np.testing.assert_array_equal(
        checkpoint.interpolate_posembed(pe, 17, True, method=method), pe)
    np.testing.assert_array_equal(checkpoint.resize_posemb_grid(
        pe[:, 1:], old_grid=(4, 4), new_grid=(4, 4), has_class_token=False,
        method=method), pe[:, 1:])


@pytest.mark.parametrize('old,new,cls', [((14, 14), (24, 16), True),
                                         ((6, 6), (4, 4), False),
                                         ((5, 5), (9, 9), True)])
def test_linear_zoom_is_the_original(old, new, cls):
  grid = np.random.default_rng(1).normal(size=(*old, 4)).astype(np.float32)
  pe = _posemb(grid, cls)
  out = checkpoint.resize_posemb_grid(pe, new_grid=new, has_class_token=cls,
                                      method='linear_zoom')
  ref = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
  np.testing.assert_array_equal(out[0, int(cls):].reshape(*new, 4), ref)
  if cls:
    np.testing.assert_array_equal(out[:, 0], pe[:, 0])
  if new[0] == new[1]:
    np.testing.assert_array_equal(checkpoint.interpolate_posembed(
        pe, int(cls) + new[0] * new[1], cls, method='linear_zoom'), out)


def test_interpolate_posembed_square():
  """The original's default: scipy's linear zoom of the grid."""
  grid = _quadratic(7, 7)
  out = checkpoint.interpolate_posembed(_posemb(grid), 1 + 144,
                                        has_class_token=True)
  ref = scipy.ndimage.zoom(grid, (12 / 7, 12 / 7, 1), order=1)
  np.testing.assert_allclose(out[0, 1:].reshape(12, 12, 3), ref, rtol=1e-6)
  assert out.shape == (1, 145, 3)


@pytest.mark.parametrize('args,match', [
    (((1, 1 + 48, 3), 1 + 49, True), '48 tokens are not a square'),
    (((1, 1 + 49, 3), 1 + 50, True), '50 tokens are not a square'),
    (((1, 49, 3), 64, False, 'nearest'), "Unknown resize method 'nearest'"),
    (((49, 3), 64, False), r'Expected a \(1, tokens, width\)'),
])
def test_resize_errors(args, match):
  shape, *rest = args
  with pytest.raises(ValueError, match=match):
    checkpoint.interpolate_posembed(np.zeros(shape, np.float32), *rest)


def test_resize_grid_must_match_tokens():
  with pytest.raises(ValueError, match=r'old_grid \(3, 5\) does not match'):
    checkpoint.resize_posemb_grid(np.zeros((1, 14, 2)), old_grid=(3, 5),
                                  new_grid=(2, 2), has_class_token=False)


def test_resize_posemb_1d_samples_the_function_at_new_centers():
  for old, new in ((8, 12), (8, 6), (14, 24), (10, 5)):
    out = checkpoint.resize_posemb_grid(
        _smooth_1d(old)[None].astype(np.float32), new_grid=(new,),
        has_class_token=False)
    assert out.shape == (1, new, 5) and out.dtype == np.float32
    got, want, inside = out[0], _smooth_1d(new), _inside(old, new)
    assert inside.sum() >= 2
    np.testing.assert_allclose(got[inside][:, :2], want[inside][:, :2],
                               atol=1e-5)
    np.testing.assert_allclose(got[inside], want[inside], atol=5e-3)
    np.testing.assert_allclose(got, want, atol=0.1)
    # The 1-D resize is the 2-D one on a grid of one column.
    np.testing.assert_allclose(out, checkpoint.resize_posemb_grid(
        _smooth_1d(old)[None].astype(np.float32), old_grid=(old, 1),
        new_grid=(new, 1), has_class_token=False), atol=1e-6)


def test_resize_posemb_1d_linear_zoom_and_errors():
  resize_1d = lambda table, n, **kw: checkpoint.resize_posemb_grid(
      table, new_grid=(n,), has_class_token=False, **kw)
  table = np.random.default_rng(0).normal(size=(1, 6, 4)).astype(np.float32)
  np.testing.assert_array_equal(
      resize_1d(table, 9, method='linear_zoom')[0],
      scipy.ndimage.zoom(table[0], (9 / 6, 1), order=1))
  for method in ('bicubic', 'linear_zoom'):
    np.testing.assert_array_equal(
        resize_1d(table, 6, method=method), table)
  with pytest.raises(ValueError, match="Unknown resize method 'cubic'"):
    resize_1d(table, 9, method='cubic')
  with pytest.raises(ValueError, match=r'Expected a \(1, tokens, width\)'):
    resize_1d(table[0], 9)
  with pytest.raises(ValueError, match='new_grid must be positive'):
    resize_1d(table, 0)
