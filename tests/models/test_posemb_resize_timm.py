"""'bicubic_antialias' against tables that timm's `resample_abs_pos_embed`
resized (torch's antialiased bicubic), from scripts/make_ssl_golden.py:
in float32 as timm runs it, and the same torch call in float64."""

import os

import numpy as np
import pytest

from tests import helpers
from vit_jax.models import posemb_resize

GOLDEN = np.load(os.path.join(helpers.DATA, 'timm_posemb_resize.npz'))
# Shrinking (DINOv2's 518 px table at 224 px), growing, and both at once.
CASES = {'37_16': ((37, 37), (16, 16)), '16_24': ((16, 16), (24, 24)),
         '5x7_9x4': ((5, 7), (9, 4))}


def _resize(name, method, dtype=np.float32):
  old, new = CASES[name]
  return posemb_resize.resize_posemb_grid(
      GOLDEN[f'{name}/old'].astype(dtype), old_grid=old, new_grid=new,
      has_class_token=1, method=method)


@pytest.mark.parametrize('name', sorted(CASES))
@pytest.mark.parametrize('dtype,atol', [(np.float64, 1e-12),
                                        (np.float32, 1e-6)])
def test_gives_torchs_table(name, dtype, atol):
  """Against torch's float64 result: the same arithmetic."""
  got = _resize(name, 'bicubic_antialias', dtype)
  assert got.dtype == dtype
  np.testing.assert_allclose(got[:, 1:], GOLDEN[f'{name}/new64'], rtol=0,
                             atol=atol)
  np.testing.assert_array_equal(got[:, 0],
                                GOLDEN[f'{name}/old'][:, 0].astype(dtype))


@pytest.mark.parametrize('name', sorted(CASES))
def test_gives_timms_float32_table(name):
  """timm's own float32 call: torch rounds its weights to float32 (a few
  1e-7 each), which leaves up to about 3e-6 on these N(0, 1) tables."""
  np.testing.assert_allclose(_resize(name, 'bicubic_antialias'),
                             GOLDEN[f'{name}/new'], rtol=0, atol=5e-6)


@pytest.mark.parametrize('name,differs', [('37_16', True), ('16_24', False),
                                          ('5x7_9x4', True)])
def test_plain_bicubic_differs_only_when_shrinking(name, differs):
  """The same kernel and borders (jax's, in float32); antialiasing
  stretches it when shrinking, which the golden values tell apart."""
  diff = np.abs(_resize(name, 'bicubic')[:, 1:] -
                GOLDEN[f'{name}/new64']).max()
  assert (diff > 1e-2) if differs else (diff < 1e-5)


def test_one_axis_grid_as_a_row():
  """A 1-D table (posemb='learn2d') resizes as a one-row 2-D grid does."""
  table = np.random.default_rng(0).normal(size=(1, 9, 4)).astype(np.float32)
  row = posemb_resize.resize_posemb_grid(
      table, new_grid=(5,), has_class_token=False, method='bicubic_antialias')
  grid = posemb_resize.resize_posemb_grid(
      table, old_grid=(1, 9), new_grid=(1, 5), has_class_token=False,
      method='bicubic_antialias')
  np.testing.assert_allclose(row, grid, rtol=1e-6)
