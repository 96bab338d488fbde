"""Position embedding schemes (the paper's Appendix D.4) against numpy
references: learned 1-D and 2-D tables, none, sine-cosine, relative
attention, 2-D RoPE and MoonViT's interpolated grid."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import layernorm
from tests.helpers import param_shapes
from tests.helpers import random_params
from tests.models.vit_reference import _apply
from tests.models.vit_reference import _block
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import models
from vit_jax.models import vit as models_vit


# A small model for the tests below.


def _tiny(posemb, classifier='token', hidden_size=12, **kw):
  """'testing' with width 12 (2-D schemes need D/2 or D/4), no dropout."""
  return models.get_model(
      'testing', num_classes=5, hidden_size=hidden_size, posemb=posemb,
      classifier=classifier,
      transformer=dict(num_layers=1, mlp_dim=8, num_heads=2, dropout_rate=0.,
                       attention_dropout_rate=0., relative_max_distance=2),
      **kw)


@pytest.mark.parametrize('posemb,input_tables,block_tables', [
    ('learn', {'pos_embedding': (1, 7, 12)}, {}),
    ('none', None, {}),
    ('learn2d', {'pos_embedding_row': (1, 2, 6),
                 'pos_embedding_col': (1, 3, 6)}, {}),
    # (2K+1, 2K+1, heads, D/heads) with K = 2, whatever the resolution.
    ('relative', None, {'rel_embedding': (5, 5, 2, 6)}),
    ('sincos2d', None, {}),
    # MoonViT's grid, created at the 2x3 patches of initialization.
    ('interp2d', {'pos_embedding_grid': (2, 3, 12)}, {}),
])
def test_posemb_params(posemb, input_tables, block_tables):
  params = param_shapes(_tiny(posemb), jnp.zeros((1, 32, 48, 3)), train=False)
  transformer = params['Transformer']
  if input_tables is None:
    assert 'posembed_input' not in transformer
  else:
    assert jax.tree.map(lambda a: a.shape, transformer['posembed_input'],
                        ) == input_tables
  block = transformer['encoderblock_0']
  assert jax.tree.map(lambda a: a.shape,
                      block.get('posembed_relative', {})) == block_tables


def _resize_1d(table, length):
  """Linear interpolation of a (1, n, c) table to (1, length, c)."""
  old = np.linspace(0, 1, table.shape[1])
  new = np.linspace(0, 1, length)
  return np.stack([np.interp(new, old, table[0, :, c])
                   for c in range(table.shape[2])], -1)[None]


@pytest.mark.parametrize('posemb', ['none', 'relative', 'sincos2d', 'learn2d'])
def test_posemb_at_a_second_resolution(posemb):
  model = _tiny(posemb)
  x = jax.random.normal(jax.random.key(1), (2, 64, 32, 3))  # 4x2 patches.
  params = random_params(model, jnp.zeros((1, 32, 48, 3)), train=False)
  if posemb == 'learn2d':
    with pytest.raises(ValueError, match='pos_embedding_row.*1-D interp'):
      _apply(model, params, x, train=False)
    pe = dict(params['Transformer']['posembed_input'])
    pe['pos_embedding_row'] = _resize_1d(pe['pos_embedding_row'], 4)
    pe['pos_embedding_col'] = _resize_1d(pe['pos_embedding_col'], 2)
    params['Transformer']['posembed_input'] = pe
  # Same shapes as a model initialized at the second resolution.
  assert (jax.tree.map(np.shape, params) ==
          jax.tree.map(np.shape, param_shapes(model, x, train=False)))
  out = _apply(model, params, x, train=False)
  assert out.shape == (2, 5)
  assert np.all(np.isfinite(out))


def _sincos(h, w, d):
  """The 2-D sine-cosine embedding, one patch and one frequency at a time."""
  pe = np.zeros((h * w, d))
  q = d // 4
  for r in range(h):
    for c in range(w):
      for k in range(q):
        omega = 10_000.**(-k / (q - 1))
        pe[r * w + c, [k, q + k, 2 * q + k, 3 * q + k]] = [
            np.sin(c * omega), np.cos(c * omega),
            np.sin(r * omega), np.cos(r * omega)]
  return pe


def test_sincos2d_values():
  np.testing.assert_allclose(models_vit.posemb_sincos_2d(3, 5, 16)[0],
                             _sincos(3, 5, 16), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match='divisible by 4'):
    models_vit.posemb_sincos_2d(2, 2, 10)


@pytest.mark.parametrize('posemb', ['learn', 'none', 'learn2d', 'sincos2d',
                                    'interp2d'])
@pytest.mark.parametrize('prefix', [0, 1])
def test_additive_posemb_matches_reference(posemb, prefix):
  """Encoder without blocks: LN(x + E), E from the scheme's definition."""
  h, w, d = 2, 3, 8
  encoder = models_vit.Encoder(num_layers=0, mlp_dim=4, num_heads=2,
                               dropout_rate=0., posemb=posemb)
  x = np.random.default_rng(1).normal(size=(2, prefix + h * w, d))
  params = random_params(encoder, jnp.asarray(x), train=False, grid=(h, w))
  out = jax.jit(lambda p, x: encoder.apply(
      {'params': p}, x, train=False, grid=(h, w)))(params, x)

  pe = np.zeros((prefix + h * w, d))  # Class tokens get none...
  if posemb == 'learn':  # ... except with the 1-D table.
    pe = params['posembed_input']['pos_embedding'][0]
  elif posemb == 'learn2d':
    row = params['posembed_input']['pos_embedding_row'][0]
    col = params['posembed_input']['pos_embedding_col'][0]
    for i in range(h * w):
      pe[prefix + i] = np.concatenate([row[i // w], col[i % w]])
  elif posemb == 'sincos2d':
    pe[prefix:] = _sincos(h, w, d)
  elif posemb == 'interp2d':  # at its own grid, the table as it is
    pe[prefix:] = params['posembed_input']['pos_embedding_grid'].reshape(
        h * w, d)
  expected = layernorm(x + pe, params['encoder_norm'])
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def _relative_bias(table, grid, prefix, k):
  """Bias of described 'relative' scheme, one query/key pair at a time."""
  h, w = grid

  def bias_fn(q):  # q: (batch, heads, tokens, depth), already scaled.
    bias = np.zeros(q.shape[:3] + q.shape[2:3])
    for i in range(h * w):
      for j in range(h * w):
        dr = np.clip(i // w - j // w, -k, k)
        dc = np.clip(i % w - j % w, -k, k)
        bias[:, :, prefix + i, prefix + j] = np.einsum(
            'bhd,hd->bh', q[:, :, prefix + i], table[dr + k, dc + k])
    return bias  # Zero for pairs with a class token.

  return bias_fn


@pytest.mark.parametrize('prefix', [0, 1])
def test_relative_attention_matches_reference(prefix):
  grid, k = (2, 3), 1  # Column offsets of 2 are clipped to 1.
  block = models_vit.Encoder1DBlock(mlp_dim=12, num_heads=3,
                                    relative_max_distance=k)
  x = np.random.default_rng(1).normal(size=(2, prefix + 6, 9))
  params = random_params(block, jnp.asarray(x), deterministic=True, grid=grid,
                         seed=2)
  table = params['posembed_relative']['rel_embedding']
  assert table.shape == (3, 3, 3, 3)
  out = jax.jit(lambda p, x: block.apply(
      {'params': p}, x, deterministic=True, grid=grid))(params, x)
  expected = _block(x, params, _relative_bias(table, grid, prefix, k))
  np.testing.assert_allclose(out, expected, rtol=5e-4, atol=5e-4)
  # The bias matters: without it the output differs.
  assert not np.allclose(out, _block(x, params), rtol=1e-2, atol=1e-2)


def _rope2d(h, w, prefix, d, theta=10_000.):
  """2-D RoPE angles (prefix + h w, d / 2): angle 2k of patch (r, c) is
  c theta^(-4k/d), angle 2k+1 is r theta^(-4k/d); prefix tokens 0."""
  angles = np.zeros((prefix + h * w, d // 2))
  freqs = theta**(-4. * np.arange(d // 4) / d)
  for i in range(h * w):
    angles[prefix + i, 0::2] = i % w * freqs
    angles[prefix + i, 1::2] = i // w * freqs
  return angles


@pytest.mark.parametrize('prefix', [0, 1])
def test_rope2d_encoder_matches_reference(prefix):
  h, w, d = 2, 3, 16
  encoder = models_vit.Encoder(num_layers=1, mlp_dim=12, num_heads=2,
                               dropout_rate=0., attention_dropout_rate=0.,
                               posemb='rope2d')
  x = np.random.default_rng(1).normal(size=(2, prefix + h * w, d))
  params = random_params(encoder, jnp.asarray(x), train=False, grid=(h, w),
                         seed=2, dtype=np.float64)
  assert 'posembed_input' not in params
  out = jax.jit(lambda p, x: encoder.apply(
      {'params': p}, x, train=False, grid=(h, w)))(params, x)
  rope = _rope2d(h, w, prefix, d // 2)
  expected = layernorm(_block(x, params['encoderblock_0'], rope=rope),
                       params['encoder_norm'])
  np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)
  # The rotation matters: without it the output differs.
  unrotated = layernorm(_block(x, params['encoderblock_0']),
                        params['encoder_norm'])
  assert not np.allclose(out, unrotated, rtol=1e-2, atol=1e-2)


def test_rope2d_follows_the_kept_patches():
  """With 'gap', keeping every patch in a shuffled order changes nothing:
  each keeps its rotation."""
  model = _tiny('rope2d', classifier='gap', hidden_size=16)
  x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 48, 3))
  params = random_params(model, jnp.zeros(x.shape), train=False)
  keep = np.stack([np.random.default_rng(i).permutation(6) for i in (2, 3)])
  out = _apply(model, params, x, train=False)
  np.testing.assert_allclose(
      _apply(model, params, x, train=False, keep=jnp.asarray(keep)), out,
      rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='divisible by 4, got 12 / 2'):
    param_shapes(_tiny('rope2d'), jnp.zeros((1, 32, 32, 3)), train=False)


@pytest.mark.parametrize('posemb', ['rope2d', 'interp2d'])
def test_rope2d_interp2d_save_and_load(tmp_path, posemb):
  """The published names; at a new resolution the 'interp2d' grid is
  resampled as the model would resample it itself."""
  model = _tiny(posemb, hidden_size=16)
  params = random_params(model, jnp.zeros((1, 32, 48, 3)), train=False)
  path = tmp_path / f'{posemb}.npz'
  files.save(params, path)
  names = {k for k in np.load(path) if 'posembed' in k}
  assert names == ({'Transformer/posembed_input/pos_embedding_grid'}
                   if posemb == 'interp2d' else set())
  config = {'classifier': 'token', 'posemb': posemb}
  loaded = loading.load_params(
      path, init_params=param_shapes(model, jnp.zeros((1, 32, 48, 3)),
                                     train=False), model_config=config)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  x = np.random.default_rng(1).uniform(-1, 1, (2, 64, 32, 3))  # 4x2 patches
  resized = loading.load_params(
      path, init_params=param_shapes(model, x, train=False),
      model_config=config)
  if posemb == 'interp2d':
    assert resized['Transformer']['posembed_input'][
        'pos_embedding_grid'].shape == (4, 2, 16)
  np.testing.assert_allclose(_apply(model, resized, x, train=False),
                             _apply(model, params, x, train=False),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('posemb,invariant', [('none', True), ('learn', False)])
def test_no_posemb_is_permutation_invariant(posemb, invariant):
  """With 'none' and 'gap', shuffling the patches leaves the output alone."""
  model = _tiny(posemb, classifier='gap')
  x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 48, 3))
  patches = x.reshape(2, 2, 16, 3, 16, 3).transpose(0, 1, 3, 2, 4, 5)
  perm = [4, 2, 5, 0, 3, 1]
  shuffled = patches.reshape(2, 6, 16, 16, 3)[:, perm].reshape(
      2, 2, 3, 16, 16, 3).transpose(0, 1, 3, 2, 4, 5).reshape(x.shape)
  params = random_params(model, jnp.zeros(x.shape), train=False)
  apply = jax.jit(lambda x: model.apply({'params': params}, x, train=False))
  out, out_shuffled = apply(x), apply(shuffled)
  assert np.allclose(out, out_shuffled, rtol=1e-4, atol=1e-4) == invariant


def test_unknown_posemb():
  with pytest.raises(ValueError, match="Unknown posemb 'rope'"):
    param_shapes(_tiny('rope'), jnp.zeros((1, 32, 32, 3)), train=False)
