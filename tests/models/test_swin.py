"""Swin Transformer: windows, shifts and masks against numpy written from
the paper's definitions; sizes, features, dtype, stochastic depth."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax import models
from vit_jax.models import swin as models_swin

# timm 1.0's sum(p.numel() for p in create_model(name).parameters()).
TIMM_PARAMS = {'Swin-T': 28_288_354, 'Swin-S': 49_606_258,
               'Swin-B': 87_768_224}


def test_relative_position_index_2x2_by_hand():
  """Patches (0,0) (0,1) (1,0) (1,1); offset (dy, dx) of query minus key
  is row (dy + 1) * 3 + (dx + 1) of the 3 x 3 table."""
  want = [[4, 3, 1, 0],
          [5, 4, 2, 1],
          [7, 6, 4, 3],
          [8, 7, 5, 4]]
  np.testing.assert_array_equal(
      models_swin.relative_position_index((2, 2)), want)


def test_window_partition_and_reverse():
  x = np.random.default_rng(0).normal(size=(2, 6, 8, 3))
  windows = np.asarray(models_swin.window_partition(x, (3, 2)))
  assert windows.shape == (2 * 2 * 4, 6, 3)
  for b, wy, wx, r, c in np.ndindex(2, 2, 4, 3, 2):
    np.testing.assert_array_equal(windows[(b * 2 + wy) * 4 + wx, r * 2 + c],
                                  x[b, wy * 3 + r, wx * 2 + c])
  np.testing.assert_array_equal(
      models_swin.window_reverse(windows, (3, 2), 6, 8), x)


def _layer_norm(x, p):
  x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                + 1e-5)
  return x * p['scale'] + p['bias']


def _attention(x, p, window, shift, heads):
  """Shifted-window attention of one (H, W, C) image, pair by pair: after
  rolling by -shift, query and key attend iff they share a window and the
  roll did not wrap the pair apart (their offset is unchanged)."""
  h, w, c = x.shape
  qkv = x.reshape(-1, c) @ p['qkv']['kernel'] + p['qkv']['bias']
  q, k, v = (t.reshape(h * w, heads, -1) for t in np.split(qkv, 3, -1))
  pos = np.stack(np.divmod(np.arange(h * w), w), -1)  # (y, x)
  rolled = (pos - shift) % (h, w)
  same = (rolled[:, None] // window == rolled[None] // window).all(-1)
  kept = ((rolled[:, None] - rolled[None]) ==
          (pos[:, None] - pos[None])).all(-1)
  off = rolled[:, None] - rolled[None] + np.asarray(window) - 1
  off = np.where(same[..., None], off, 0)  # other windows' pairs are unused
  bias = p['relative_position_bias_table'][off[..., 0] * (2 * window[1] - 1)
                                           + off[..., 1]]  # (N, N, heads)
  logits = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(q.shape[-1])
  logits = np.where(same & kept, logits + bias.transpose(2, 0, 1), -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum('hqk,khd->qhd', weights, v).reshape(h * w, c)
  return (out @ p['proj']['kernel'] + p['proj']['bias']).reshape(h, w, c)


def _block(x, p, window, shift, heads):
  """x + attention(LN(x)), then x + MLP(LN(x)), exact GELU."""
  x = x + _attention(_layer_norm(x, p['norm1']), p['attn'], window, shift,
                     heads)
  mlp = p['mlp']
  y = _layer_norm(x, p['norm2']) @ mlp['Dense_0']['kernel'] + (
      mlp['Dense_0']['bias'])
  y = 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))
  return x + y @ mlp['Dense_1']['kernel'] + mlp['Dense_1']['bias']


@pytest.mark.parametrize('grid,shifted,window,shift', [
    ((8, 8), True, (4, 4), (2, 2)),
    ((8, 8), False, (4, 4), (0, 0)),
    # Rows no longer than the window: one window, never shifted.
    ((4, 8), True, (4, 4), (0, 2)),
])
def test_block_against_numpy(grid, shifted, window, shift):
  heads = 2
  block = models_swin.SwinBlock(num_heads=heads, window=4, shifted=shifted)
  x = np.random.default_rng(1).normal(size=(2, *grid, 8)).astype(np.float32)
  params = block.init(jax.random.key(0), x, deterministic=True)['params']
  rng = np.random.default_rng(2)  # every parameter, norms too, random
  params = jax.tree.map(
      lambda t: (t + rng.normal(size=t.shape) * 0.3).astype(np.float32),
      params)
  got = block.apply({'params': params}, x, deterministic=True)
  p = jax.tree.map(lambda t: np.asarray(t, np.float64), params)
  for b in range(2):
    np.testing.assert_allclose(got[b], _block(x[b].astype(np.float64), p,
                                              window, shift, heads),
                               rtol=1e-4, atol=1e-4)


def test_mask_only_in_shifted_stages_of_several_windows():
  assert models_swin.shifted_window_mask((7, 7), (7, 7), (0, 0)) is None
  mask = models_swin.shifted_window_mask((4, 4), (2, 2), (1, 1))
  assert mask.shape == (4, 4, 4)
  assert not mask[0].any()  # the first window holds no wrapped patches
  assert (mask[3] != 0).sum() == 12  # 4 regions of one patch each


@pytest.mark.parametrize('name', sorted(TIMM_PARAMS))
def test_parameter_counts_equal_timms(name):
  model = models.get_model(name, num_classes=1000)
  assert models.count_params(model) == TIMM_PARAMS[name]


def test_stage_features_and_pooled_output():
  model = models.get_model('Swin-T', num_classes=None)
  out, state = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False,
      mutable=['params', 'intermediates']))
  assert out.shape == (1, 768)
  shapes = [state['intermediates'][f'stage_{i}'][0].shape for i in range(4)]
  assert shapes == [(1, 56, 56, 96), (1, 28, 28, 192), (1, 14, 14, 384),
                    (1, 7, 7, 768)]


@pytest.mark.parametrize('shape', [(1, 225, 224, 3), (1, 112, 112, 3),
                                   (224, 224, 3)])
def test_bad_image_size_fails_before_compiling(shape):
  model = models.get_model('Swin-T', num_classes=10)
  with pytest.raises(ValueError, match='224|NHWC'):
    jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros(shape),
                                      train=False))


def test_rectangular_multiple_works():
  model = models.get_model('Swin-T', num_classes=10)
  out = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), jnp.zeros((1, 224, 448, 3)), train=False))[0]
  assert out.shape == (1, 10)


def test_bfloat16_close_to_float32():
  x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3))
  f32 = models.get_model('Swin-testing', num_classes=10)
  bf16 = models.get_model('Swin-testing', num_classes=10, dtype='bfloat16')
  params = helpers.random_params(f32, x, train=False, scale=0.3)
  assert all(t.dtype == jnp.float32 for t in jax.tree.leaves(params))
  want = jax.jit(f32.apply, static_argnames='train')(
      {'params': params}, x, train=False)
  got = jax.jit(bf16.apply, static_argnames='train')(
      {'params': params}, x, train=False)
  assert got.dtype == jnp.float32  # the head is float32
  np.testing.assert_allclose(got, want, atol=0.1 * np.abs(want).max())


def test_stochastic_depth_in_training_only():
  model = models.get_model('Swin-testing', num_classes=10,
                           stochastic_depth=0.5)
  x = np.random.default_rng(0).uniform(-1, 1, (4, 32, 32, 3))
  # Random weights, not a shared shift (which makes every logit equal), so
  # that each dropped branch moves the logits far above float rounding.
  params = helpers.random_params(model, x, train=False, scale=0.3)
  apply = jax.jit(model.apply, static_argnames='train')
  run = lambda seed: apply(  # pylint: disable=g-long-lambda
      {'params': params}, x, train=True,
      rngs={'dropout': jax.random.key(seed)})
  logits = run(0)
  assert np.ptp(np.asarray(logits), axis=-1).min() > 0.1  # classes differ
  assert np.abs(logits - run(1)).max() > 0.1 * np.abs(logits).max()
  plain = models.get_model('Swin-testing', num_classes=10)
  np.testing.assert_allclose(
      apply({'params': params}, x, train=False),
      jax.jit(plain.apply, static_argnames='train')(
          {'params': params}, x, train=False), rtol=1e-6)
