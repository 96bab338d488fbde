"""DPT's reassembly and upsampling against numpy from the paper's
equations (Ranftl et al., 2021, Sec. 3), and the head's shapes."""

import jax
import numpy as np
import pytest
import scipy.ndimage
import scipy.special

from vit_jax import models
from vit_jax.models import dpt
from vit_jax.models import posemb_resize

D, C = 6, 5


def _erf_gelu(x):
  return 0.5 * x * (1 + scipy.special.erf(x / np.sqrt(2)))


def _reassemble_numpy(p, x, cls, readout, factor):
  """Read out the class token, project 1x1, resize (numpy, NHWC)."""
  if readout == 'add':
    x = x + cls[:, None, None]
  elif readout == 'project':
    both = np.concatenate([x, np.broadcast_to(cls[:, None, None], x.shape)],
                          -1)
    x = _erf_gelu(both @ p['readout']['kernel'] + p['readout']['bias'])
  x = x @ p['projection']['kernel'][0, 0] + p['projection']['bias']
  if factor > 1:  # each location spreads to a factor x factor patch
    k, f = p['resize']['kernel'], int(factor)
    n, h, w, _ = x.shape
    y = np.zeros((n, h * f, w * f, k.shape[-1]))
    for a in range(f):
      for b in range(f):
        y[:, a::f, b::f] = x @ k[a, b]
    return y + p['resize']['bias']
  if factor < 1:  # 3x3, stride 2, zero padding 1
    k = p['resize']['kernel']
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    h, w = (x.shape[1] - 1) // 2 + 1, (x.shape[2] - 1) // 2 + 1
    y = np.zeros((x.shape[0], h, w, k.shape[-1]))
    for i in range(h):
      for j in range(w):
        patch = xp[:, 2 * i:2 * i + 3, 2 * j:2 * j + 3]
        y[:, i, j] = np.einsum('nabc,abco->no', patch, k)
    return y + p['resize']['bias']
  return x


@pytest.mark.parametrize('readout,factor,grid', [
    ('ignore', 4, 3), ('add', 2, 3), ('project', 1, 3), ('project', 0.5, 5),
    ('add', 0.5, 4)])
def test_reassemble_against_numpy(readout, factor, grid):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, grid, grid, D)).astype(np.float32)
  cls = rng.normal(size=(2, D)).astype(np.float32)
  module = dpt.Reassemble(C, factor, readout)
  params = module.init(jax.random.key(0), x, cls)['params']
  # Biases are zeros at init: give them values the check can see.
  params = jax.tree.map(lambda v: v + 0.1 * rng.normal(size=v.shape), params)
  got = np.asarray(module.apply({'params': params}, x, cls))
  want = _reassemble_numpy(jax.tree.map(np.asarray, params), x, cls, readout,
                           factor)
  side = {4: 4 * grid, 2: 2 * grid, 1: grid, 0.5: (grid + 1) // 2}[factor]
  assert got.shape == (2, side, side, C)
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize('n_in,n_out', [(4, 8), (3, 7), (5, 5)])
def test_bilinear_align_corners(n_in, n_out):
  """align_corners=True samples input (n_in - 1) / (n_out - 1) * i."""
  x = np.random.default_rng(1).normal(size=(1, n_in, n_in, 2))
  got = np.asarray(dpt.resize_bilinear(x.astype(np.float32), (n_out, n_out),
                                       align_corners=True))
  at = np.arange(n_out) * (n_in - 1) / max(n_out - 1, 1)
  rows, cols = np.meshgrid(at, at, indexing='ij')
  for c in range(2):
    want = scipy.ndimage.map_coordinates(x[0, ..., c], [rows, cols], order=1)
    np.testing.assert_allclose(got[0, ..., c], want, atol=1e-5)


def test_bilinear_half_pixel_as_torch():
  """align_corners=False: (i + 0.5) * n_in / n_out - 0.5, clamped at 0
  (torch's interpolate of 2 -> 3 and 5 -> 3 rows, read off torch 2.14)."""
  np.testing.assert_allclose(
      posemb_resize.torch_linear_weights(2, 3, align_corners=False),
      [[1, 0], [.5, .5], [0, 1]], atol=1e-6)
  np.testing.assert_allclose(
      posemb_resize.torch_linear_weights(5, 3, align_corners=False),
      [[2 / 3, 1 / 3, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1 / 3, 2 / 3]],
      atol=1e-6)


def test_head_refuses_a_readout_without_class_tokens():
  head = dpt.DPTHead(features=4, out_channels=(4,) * 4, readout='project')
  maps = [np.zeros((1, 2, 2, D), np.float32)] * 4
  with pytest.raises(ValueError, match='class'):
    head.init(jax.random.key(0), maps, None, size=(8, 8))


def test_dpt_on_a_vit_splits_into_features_and_head():
  """DPT on a 4-block ViT (patch 16, 32 px): the class tokens for the
  readout, segmentation logits at 16 times the grid, `features` then
  `head` equal to the whole, BatchNorm's statistics updated in training."""
  config = models.MODEL_CONFIGS['testing']
  backbone = models.get_model('testing', num_classes=None, transformer=dict(
      config.transformer.to_dict(), num_layers=4))
  model = dpt.DPT(backbone=backbone, dpt=dpt.DPTHead(
      features=8, out_channels=(4, 4, 8, 8), readout='add',
      head='segmentation', num_classes=3), indices=4)
  x = np.random.default_rng(2).normal(size=(2, 32, 32, 3)).astype(np.float32)
  variables = model.init(jax.random.key(0), x)
  assert set(variables['params']) == {'backbone', 'dpt'}
  out = model.apply(variables, x)
  assert out.shape == (2, 32, 32, 3)
  maps, cls = model.apply(variables, x, method='features')
  assert [m.shape for m in maps] == [(2, 2, 2, 10)] * 4
  assert [c.shape for c in cls] == [(2, 10)] * 4
  np.testing.assert_allclose(
      model.apply(variables, maps, cls, None, method='head'), out, atol=1e-6)
  _, updates = model.apply(variables, x, train=True, mutable=['batch_stats'],
                           rngs={'dropout': jax.random.key(1)})
  assert not np.allclose(updates['batch_stats']['dpt']['head']['bn']['mean'],
                         variables['batch_stats']['dpt']['head']['bn']['mean'])
