"""SAM's image encoder (`models.sam`) against numpy written from its
equations: one windowed block (padding, windows, decomposed relative
positions, exact GELU) and one global block whose tables are interpolated
to another grid; `forward_intermediates` against the model itself run in
parts. timm's and transformers' outputs: tests/convert/test_sam.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax import models
from vit_jax.models import sam

WIDTH, HEADS, MLP = 8, 2, 16


def _rel_table(table, size):
  """(size, size, D): [i, j] = the table's row i - j + size - 1, after
  torch's linear interpolation (align_corners=False: sample (k + 0.5) *
  L / rows - 0.5, clamped at the ends) to 2 * size - 1 rows."""
  rows, length = 2 * size - 1, table.shape[0]
  at = (np.arange(rows) + 0.5) * length / rows - 0.5
  resized = np.stack([np.interp(at, np.arange(length), table[:, d])
                      for d in range(table.shape[1])], axis=1)
  return np.array([[resized[i - j + size - 1] for j in range(size)]
                   for i in range(size)])


def _attention(x, p):
  """MViTv2's attention with decomposed relative positions over one map
  x (h, w, C): logits q.k / sqrt(d) + q.Rh[y, y'] + q.Rw[x, x']."""
  h, w, c = x.shape
  d = c // HEADS
  qkv = x.reshape(h * w, c) @ p['qkv']['kernel'] + p['qkv']['bias']
  q, k, v = (qkv[:, i * c:(i + 1) * c].reshape(h * w, HEADS, d)
             for i in range(3))
  rh, rw = _rel_table(p['rel_pos_h'], h), _rel_table(p['rel_pos_w'], w)
  out = np.zeros((h * w, HEADS, d))
  for n in range(HEADS):
    logits = q[:, n] @ k[:, n].T / math.sqrt(d)
    for a in range(h * w):
      for b in range(h * w):
        (ya, xa), (yb, xb) = divmod(a, w), divmod(b, w)
        logits[a, b] += q[a, n] @ rh[ya, yb] + q[a, n] @ rw[xa, xb]
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    out[:, n] = weights / weights.sum(-1, keepdims=True) @ v[:, n]
  y = out.reshape(h * w, c) @ p['proj']['kernel'] + p['proj']['bias']
  return y.reshape(h, w, c)


def _block(x, p, window):
  """One SAM block on x (h, w, C): windows of `window` over the grid
  zero-padded at the bottom and right (0: global), erf GELU MLP."""
  h, w, c = x.shape
  y = helpers.layernorm(x, p['norm1'])
  if window:
    hp, wp = -(-h // window) * window, -(-w // window) * window
    padded = np.zeros((hp, wp, c))
    padded[:h, :w] = y
    for i in range(0, hp, window):
      for j in range(0, wp, window):
        padded[i:i + window, j:j + window] = _attention(
            padded[i:i + window, j:j + window], p['attn'])
    y = padded[:h, :w]
  else:
    y = _attention(y, p['attn'])
  x = x + y
  z = helpers.layernorm(x, p['norm2']) @ p['mlp']['Dense_0']['kernel'] + (
      p['mlp']['Dense_0']['bias'])
  z = 0.5 * z * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))
  return x + z @ p['mlp']['Dense_1']['kernel'] + p['mlp']['Dense_1']['bias']


@pytest.mark.parametrize('window,table,grid', [
    (4, (4, 4), (6, 5)),  # padded to 8 x 8: four windows
    (0, (4, 4), (3, 5)),  # global: tables of 7 rows to 5 and 9
])
def test_block_is_the_equations(window, table, grid):
  block = sam.SamBlock(HEADS, MLP, window, table)
  x = np.random.default_rng(1).normal(size=(1, *grid, WIDTH)).astype(
      np.float32)
  params = helpers.random_params(block, x, deterministic=True)
  got = block.apply({'params': params}, x, deterministic=True)
  want = _block(x[0].astype(np.float64),
                jax.tree.map(lambda a: np.asarray(a, np.float64), params),
                window)
  np.testing.assert_allclose(got[0], want, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope='module')
def testing():
  model = models.get_model('SAM-testing')
  images = np.random.default_rng(0).uniform(-1, 1, (1, 64, 96, 3)).astype(
      np.float32)
  return model, helpers.random_params(model, images, scale=0.3), images


def test_forward_intermediates(testing):
  model, params, images = testing
  run = lambda **kw: model.apply(  # pylint: disable=g-long-lambda
      {'params': params}, images, method='forward_intermediates', **kw)
  final, maps = run(indices=2)
  np.testing.assert_allclose(final, model.apply({'params': params}, images),
                             atol=1e-6)
  assert [m.shape for m in maps] == [(1, 4, 6, 16)] * 2
  first = run(indices=[0, -2], intermediates_only=True)
  np.testing.assert_allclose(first[1], maps[0], atol=1e-6)
  # `norm`: each through the neck, which the last block's output is too.
  necked = run(indices=[-1], norm=True, output_fmt='NLC',
               intermediates_only=True)
  np.testing.assert_allclose(necked[0], final.reshape(1, 24, 8), atol=1e-6)
  with pytest.raises(ValueError, match='output_fmt'):
    run(output_fmt='NCHW')


def test_sides_must_be_whole_patches():
  model = models.get_model('SAM-testing')
  with pytest.raises(ValueError, match='multiples of the patch, 16 px'):
    helpers.param_shapes(model, jnp.zeros((1, 40, 48, 3)))
