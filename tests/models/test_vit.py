"""ViT presets, shapes, errors, and numerics against a numpy reference."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import gelu
from tests.helpers import layernorm
from tests.helpers import mlp
from tests.helpers import param_shapes
from tests.helpers import patch_embed
from tests.helpers import random_params
from vit_jax import checkpoint
from vit_jax import models
from vit_jax.models import posemb as vit_posemb
from vit_jax.models import posemb_resize
from vit_jax.models import vit as models_vit

def test_param_tree_names():
  model = models.get_model('testing', num_classes=3, representation_size=4)
  params = param_shapes(model, jnp.zeros((1, 32, 32, 3)), train=False)
  block = params['Transformer']['encoderblock_0']
  assert set(params) == {'embedding', 'cls', 'Transformer', 'pre_logits',
                         'head'}
  assert set(params['Transformer']) == {'posembed_input', 'encoderblock_0',
                                        'encoder_norm'}
  assert set(block) == {'LayerNorm_0', 'MultiHeadDotProductAttention_0',
                        'LayerNorm_1', 'MlpBlock_0'}
  assert set(block['MlpBlock_0']) == {'Dense_0', 'Dense_1'}
  attn = block['MultiHeadDotProductAttention_0']
  assert attn['query']['kernel'].shape == (10, 2, 5)
  assert attn['out']['kernel'].shape == (2, 5, 10)
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 5, 10)


@pytest.mark.parametrize('classifier,size,expected', [
    ('token', (32, 32), (2, 7)),
    ('gap', (32, 32), (2, 7)),
    ('unpooled', (32, 32), (2, 4, 7)),
    ('token_unpooled', (32, 32), (2, 5, 7)),
    ('token', (48, 32), (2, 7)),
    ('unpooled', (64, 16), (2, 4, 7)),
])
def test_output_shapes(classifier, size, expected):
  model = models.get_model('testing', num_classes=7, classifier=classifier)
  x = jnp.zeros((2, *size, 3))
  out, _ = jax.eval_shape(
      lambda: model.init_with_output(jax.random.key(0), x, train=False))
  assert out.shape == expected


def test_non_square_224x160():
  model = models.get_model('testing', num_classes=5)
  x = jnp.ones((1, 224, 160, 3))
  variables = model.init(jax.random.key(0), x, train=False)
  pe = variables['params']['Transformer']['posembed_input']['pos_embedding']
  assert pe.shape == (1, 1 + 14 * 10, 10)
  assert model.apply(variables, x, train=False).shape == (1, 5)


@pytest.mark.parametrize('shape,match', [
    ((1, 30, 32, 3), '30x32 is not a multiple of the patch size 16x16'),
    ((1, 32, 40, 3), '32x40 is not a multiple'),
    ((1, 8, 8, 3), '8x8 is not a multiple'),
    ((32, 32, 3), 'NHWC'),
])
def test_bad_image_size(shape, match):
  model = models.get_model('testing', num_classes=3)
  with pytest.raises(ValueError, match=match):
    model.init(jax.random.key(0), jnp.zeros(shape), train=False)


def test_resolution_change_without_resize_is_explained():
  model = models.get_model('testing', num_classes=3)
  variables = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)),
                         train=False)
  with pytest.raises(ValueError, match='interpolate_posembed'):
    model.apply(variables, jnp.zeros((1, 48, 48, 3)), train=False)


def test_unknown_names():
  with pytest.raises(ValueError, match='Unknown model'):
    models.get_model('ViT-Q_16')
  model = models.get_model('testing', num_classes=3, classifier='cls')
  with pytest.raises(ValueError, match="Unknown classifier 'cls'"):
    model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False)


# A numpy reference, written from the paper's equations (1)-(4).


def _msa(x, p, kv=None, bias_fn=None, rope=None):
  """Multi-head attention: softmax(q k^T / sqrt(d) + bias) v per head.

  Self-attention unless `kv` is given; `bias_fn` maps the scaled queries
  (batch, heads, tokens, depth) to a (batch, heads, tokens, tokens) bias;
  `rope`, (tokens, depth / 2) angles, rotates q and k first.
  """
  kv = x if kv is None else kv
  q, k, v = (np.einsum('btd,dhk->bhtk', y, p[n]['kernel']) +
             p[n]['bias'].transpose(0, 1)[None, :, None, :]
             for y, n in ((x, 'query'), (kv, 'key'), (kv, 'value')))
  if rope is not None:
    q, k = (_rotate(y, rope) for y in (q, k))
  q = q / np.sqrt(q.shape[-1])
  logits = np.einsum('bhtk,bhsk->bhts', q, k)
  if bias_fn is not None:
    logits = logits + bias_fn(q)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  heads = np.einsum('bhts,bhsk->bthk', w, v)
  return np.einsum('bthk,hkd->btd', heads, p['out']['kernel']) + p['out']['bias']


def _rotate(y, angles):
  """(..., tokens, depth) `y`, pairs (y[2j], y[2j+1]) as complex numbers
  times exp(i angles[token, j])."""
  z = (y[..., 0::2] + 1j * y[..., 1::2]) * np.exp(1j * angles)
  return np.stack([z.real, z.imag], -1).reshape(y.shape)


def _block(x, p, bias_fn=None, rope=None):
  x = x + _msa(layernorm(x, p['LayerNorm_0']),
               p['MultiHeadDotProductAttention_0'], bias_fn=bias_fn,
               rope=rope)
  return x + mlp(layernorm(x, p['LayerNorm_1']), p['MlpBlock_0'])


def _vit(images, p, patch, classifier):
  n = images.shape[0]
  x = patch_embed(images, p['embedding'], patch)              # x_p E
  if classifier == 'token':
    x = np.concatenate([np.broadcast_to(p['cls'], (n, 1, x.shape[-1])), x], 1)
  t = p['Transformer']
  x = x + t['posembed_input']['pos_embedding']                # + E_pos
  i = 0
  while f'encoderblock_{i}' in t:
    x = _block(x, t[f'encoderblock_{i}'])
    i += 1
  x = layernorm(x, t['encoder_norm'])
  y = x[:, 0] if classifier == 'token' else x.mean(1)
  y = np.tanh(y @ p['pre_logits']['kernel'] + p['pre_logits']['bias'])
  return y @ p['head']['kernel'] + p['head']['bias']


def test_encoder_block_matches_reference():
  block = models_vit.Encoder1DBlock(mlp_dim=12, num_heads=3)
  x = np.random.default_rng(1).normal(size=(2, 5, 9))
  params = random_params(block, jnp.asarray(x), deterministic=True, seed=2,
                         dtype=np.float64)
  out = block.apply({'params': params}, jnp.asarray(x, jnp.float32),
                    deterministic=True)
  np.testing.assert_allclose(out, _block(x, params), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize('approximate', [True, False])
def test_mlp_gelu_matches_reference(approximate):
  """tanh GELU (Google's checkpoints) or the exact erf one (timm's)."""
  block = models_vit.MlpBlock(mlp_dim=12, gelu_approximate=approximate)
  x = np.random.default_rng(4).normal(scale=2., size=(2, 5, 9))
  params = random_params(block, jnp.asarray(x), deterministic=True, seed=5,
                         dtype=np.float64)
  out = block.apply({'params': params}, jnp.asarray(x, jnp.float32),
                    deterministic=True)
  h = x @ params['Dense_0']['kernel'] + params['Dense_0']['bias']
  erf = np.vectorize(math.erf)
  h = gelu(h) if approximate else 0.5 * h * (1 + erf(h / np.sqrt(2)))
  want = h @ params['Dense_1']['kernel'] + params['Dense_1']['bias']
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
  # The two differ by more than the tolerance: the test can tell them apart.
  other = models_vit.MlpBlock(mlp_dim=12, gelu_approximate=not approximate)
  assert np.abs(other.apply({'params': params}, jnp.asarray(x, jnp.float32),
                            deterministic=True) - out).max() > 1e-4


@pytest.mark.parametrize('classifier,size', [('token', (32, 48)),
                                             ('gap', (32, 32))])
def test_forward_matches_reference(classifier, size):
  model = models.get_model('testing', num_classes=6, representation_size=8,
                           classifier=classifier, patches={'size': (8, 8)},
                           transformer=dict(num_layers=2, mlp_dim=16,
                                            num_heads=2, dropout_rate=0.1,
                                            attention_dropout_rate=0.1))
  x = np.random.default_rng(3).uniform(-1, 1, (2, *size, 3))
  params = random_params(model, jnp.asarray(x, jnp.float32), train=False,
                         dtype=np.float64)
  out = model.apply({'params': params}, jnp.asarray(x, jnp.float32),
                    train=False)
  np.testing.assert_allclose(out, _vit(x, params, 8, classifier),
                             rtol=1e-3, atol=1e-3)


def test_dropout_only_in_training():
  model = models.get_model('testing', num_classes=4,
                           transformer=dict(num_layers=1, mlp_dim=10,
                                            num_heads=2, dropout_rate=0.5,
                                            attention_dropout_rate=0.5))
  x = jax.random.uniform(jax.random.key(0), (2, 32, 32, 3), minval=-1)
  params = random_params(model, x, train=False, dtype=np.float64)
  apply = lambda train, key: model.apply(
      {'params': params}, x, train=train, rngs={'dropout': key})
  k1, k2 = jax.random.key(1), jax.random.key(2)
  np.testing.assert_array_equal(apply(False, k1), apply(False, k2))
  np.testing.assert_array_equal(apply(True, k1), apply(True, k1))
  assert not np.allclose(apply(True, k1), apply(True, k2))
  assert not np.allclose(apply(True, k1), apply(False, k1))


# A small model and a jitted apply for the tests below.


def _tiny(posemb, classifier='token', hidden_size=12, **kw):
  """'testing' with width 12 (2-D schemes need D/2 or D/4), no dropout."""
  return models.get_model(
      'testing', num_classes=5, hidden_size=hidden_size, posemb=posemb,
      classifier=classifier,
      transformer=dict(num_layers=1, mlp_dim=8, num_heads=2, dropout_rate=0.,
                       attention_dropout_rate=0., relative_max_distance=2),
      **kw)


def _apply(model, params, x, **kw):
  return jax.jit(lambda p, x: model.apply({'params': p}, x, **kw))(params, x)


# Position embedding schemes (the paper's Appendix D.4).


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
  checkpoint.save(params, path)
  names = {k for k in np.load(path) if 'posembed' in k}
  assert names == ({'Transformer/posembed_input/pos_embedding_grid'}
                   if posemb == 'interp2d' else set())
  config = {'classifier': 'token', 'posemb': posemb}
  loaded = checkpoint.load_params(
      path, init_params=param_shapes(model, jnp.zeros((1, 32, 48, 3)),
                                     train=False), model_config=config)
  jax.tree.map(np.testing.assert_array_equal, loaded, params)
  x = np.random.default_rng(1).uniform(-1, 1, (2, 64, 32, 3))  # 4x2 patches
  resized = checkpoint.load_params(
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


# Multi-head attention pooling.


def test_map_head_params_and_shape():
  model = models.get_model('testing', num_classes=7, classifier='map')
  x = jnp.zeros((2, 32, 48, 3))
  params = param_shapes(model, x, train=False)
  assert 'cls' not in params
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 6, 10)
  head = params['MAPHead_0']
  assert set(head) == {'probe', 'MultiHeadDotProductAttention_0',
                       'LayerNorm_0', 'MlpBlock_0'}
  assert head['probe'].shape == (1, 1, 10)
  assert head['MultiHeadDotProductAttention_0']['query']['kernel'].shape == (
      10, 2, 5)
  assert head['MlpBlock_0']['Dense_0']['kernel'].shape == (10, 10)
  out = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), x, train=False))[0]
  assert out.shape == (2, 7)


def test_map_head_matches_reference():
  head = models_vit.MAPHead(num_heads=2, mlp_dim=6)
  x = np.random.default_rng(1).normal(size=(3, 5, 8))
  params = random_params(head, jnp.asarray(x), seed=2)
  out = jax.jit(lambda p, x: head.apply({'params': p}, x))(params, x)

  probe = np.broadcast_to(params['probe'], (3, 1, 8))
  y = _msa(probe, params['MultiHeadDotProductAttention_0'], kv=x)
  z = mlp(layernorm(y, params['LayerNorm_0']), params['MlpBlock_0'])
  expected = (y + z)[:, 0]
  assert out.shape == (3, 8)
  np.testing.assert_allclose(out, expected, rtol=2e-4, atol=2e-4)


# Stochastic depth.


def test_drop_path_is_identity_at_eval():
  x = jax.random.normal(jax.random.key(0), (8, 3, 4))
  out = models_vit.DropPath(0.5).apply({}, x, deterministic=True)
  np.testing.assert_array_equal(out, x)


def test_drop_path_drops_whole_samples():
  rate = 0.3
  x = np.random.default_rng(0).uniform(1, 2, (20_000, 3, 2)).astype(np.float32)
  out = np.asarray(jax.jit(lambda x: models_vit.DropPath(rate).apply(
      {}, x, deterministic=False, rngs={'dropout': jax.random.key(1)}))(x))
  kept = np.any(out != 0, axis=(1, 2))
  np.testing.assert_array_equal(out[~kept], 0)
  np.testing.assert_allclose(out[kept], x[kept] / (1 - rate), rtol=1e-6)
  assert abs(kept.mean() - (1 - rate)) < 0.02  # ~6 standard deviations.
  with pytest.raises(ValueError, match=r'\[0, 1\)'):
    models_vit.DropPath(1.).apply({}, x, deterministic=False)


def test_drop_path_schedule():
  assert models_vit.drop_path_rates(0.2, 5) == pytest.approx(
      [0., 0.05, 0.1, 0.15, 0.2])
  assert models_vit.drop_path_rates(0.2, 1) == [0.]
  rates = []

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, models_vit.DropPath):
      rates.append(context.module.rate)
    return next_fun(*args, **kwargs)

  encoder = models_vit.Encoder(num_layers=4, mlp_dim=4, num_heads=2,
                               stochastic_depth=0.3)
  with nn.intercept_methods(record):
    param_shapes(encoder, jnp.zeros((1, 3, 4)), train=False)
  # Attention and MLP branch of each block, in order.
  assert rates == pytest.approx([0., 0., 0.1, 0.1, 0.2, 0.2, 0.3, 0.3])


def test_drop_path_in_encoder_block():
  block = models_vit.Encoder1DBlock(mlp_dim=8, num_heads=2, dropout_rate=0.,
                                    attention_dropout_rate=0.,
                                    drop_path_rate=0.5)
  plain = block.clone(drop_path_rate=0.)
  x = np.random.default_rng(1).normal(size=(64, 3, 6)).astype(np.float32)
  params = random_params(block, x, deterministic=True)

  def apply(module, deterministic):
    return np.asarray(jax.jit(lambda p, x: module.apply(
        {'params': p}, x, deterministic=deterministic,
        rngs={'dropout': jax.random.key(2)}))(params, x))

  full = apply(plain, True)
  np.testing.assert_array_equal(apply(block, True), full)
  out = apply(block, False)
  # Each sample: both branches dropped (the input), or some kept.
  same_as_input = np.all(np.isclose(out, x, atol=1e-6), axis=(1, 2))
  assert 0 < same_as_input.sum() < 64
  assert not np.allclose(out[~same_as_input], full[~same_as_input])


@pytest.mark.parametrize('name,image', [
    ('testing', (32, 48)), ('ViT-B_16', (384, 224)), ('R+ViT-Ti_16', (224, 160)),
    ('R26+ViT-S_32', (224, 160)), ('R50+ViT-B_16', (384, 320))])
def test_token_grid_is_the_embedding_grid(name, image):
  """`token_grid` (from the config) equals the grid the model really makes."""
  model = models.get_model(name, num_classes=0)
  def embed(x):
    return model.init_with_output(
        jax.random.key(0), x, train=False,
        capture_intermediates=lambda mdl, _: mdl.name == 'embedding')
  _, variables = jax.eval_shape(embed, jnp.zeros((1, *image, 3)))
  grid = variables['intermediates']['embedding']['__call__'][0].shape[1:3]
  assert vit_posemb.token_grid(models.MODEL_CONFIGS[name], image) == grid


# DeiT (Touvron et al., 2021): the distillation token and its head.


def _gelu_exact(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def _deit(images, p, patch):
  """(class logits, distillation logits) of a DeiT, from the paper: tokens
  [class, distillation, patches] plus position embeddings, ViT blocks with
  the exact GELU, one head on each of the first two tokens."""
  n = images.shape[0]
  x = patch_embed(images, p['embedding'], patch)
  d = x.shape[-1]
  x = np.concatenate([np.broadcast_to(p['cls'], (n, 1, d)),
                      np.broadcast_to(p['dist'], (n, 1, d)), x], 1)
  t = p['Transformer']
  x = x + t['posembed_input']['pos_embedding']
  i = 0
  while f'encoderblock_{i}' in t:
    b = t[f'encoderblock_{i}']
    x = x + _msa(layernorm(x, b['LayerNorm_0']),
                 b['MultiHeadDotProductAttention_0'])
    m = b['MlpBlock_0']
    h = _gelu_exact(layernorm(x, b['LayerNorm_1']) @ m['Dense_0']['kernel'] +
                    m['Dense_0']['bias'])
    x = x + h @ m['Dense_1']['kernel'] + m['Dense_1']['bias']
    i += 1
  x = layernorm(x, t['encoder_norm'])
  return (x[:, 0] @ p['head']['kernel'] + p['head']['bias'],
          x[:, 1] @ p['head_dist']['kernel'] + p['head_dist']['bias'])


def _distilled(**kw):
  return models.get_model('DeiT-testing-distilled', **{'num_classes': 6, **kw})


def test_distilled_param_tree():
  params = param_shapes(_distilled(), jnp.zeros((1, 32, 32, 3)), train=False)
  assert set(params) == {'embedding', 'cls', 'dist', 'Transformer',
                         'head', 'head_dist'}
  assert params['cls'].shape == params['dist'].shape == (1, 1, 32)
  assert params['head_dist']['kernel'].shape == (32, 6)
  # The class and distillation tokens, then the 4x4 patches.
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 2 + 16, 32)
  assert models_vit.num_prefix_tokens('distilled') == 2
  assert models_vit.num_prefix_tokens(models.MODEL_CONFIGS['DeiT-testing']) == 1
  assert models_vit.num_prefix_tokens('gap') == 0
  assert models_vit.has_class_token('distilled')


@pytest.mark.parametrize('size', [(32, 32), (32, 48)])
def test_distilled_forward_matches_reference(size):
  """Evaluation: the mean of the two heads; training: both (no dropout in
  the preset, so the same values)."""
  model = _distilled()
  x = np.random.default_rng(6).uniform(-1, 1, (2, *size, 3))
  params = random_params(model, jnp.asarray(x, jnp.float32), train=False,
                         dtype=np.float64)
  cls, dist = _deit(x, params, 8)
  assert np.abs(cls - dist).min() > 1e-2  # the heads differ: the mean shows
  out = _apply(model, params, jnp.asarray(x, jnp.float32), train=False)
  np.testing.assert_allclose(out, (cls + dist) / 2, rtol=1e-3, atol=1e-3)
  pair = model.apply({'params': params}, jnp.asarray(x, jnp.float32),
                     train=True, rngs={'dropout': jax.random.key(0)})
  assert isinstance(pair, tuple) and len(pair) == 2
  np.testing.assert_allclose(pair[0], cls, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(pair[1], dist, rtol=1e-3, atol=1e-3)


def test_distilled_without_head_gives_mean_of_tokens():
  """num_classes=0 (few-shot features): the mean of the class and
  distillation tokens, as timm's pre_logits."""
  model = _distilled(num_classes=0)
  x = jax.random.uniform(jax.random.key(3), (2, 32, 32, 3), minval=-1)
  params = random_params(model, x, train=False)
  out, state = model.apply(
      {'params': params}, x, train=False, mutable=['intermediates'],
      capture_intermediates=lambda mdl, _: mdl.name == 'Transformer')
  encoded = state['intermediates']['Transformer']['__call__'][0]
  assert encoded.shape == (2, 18, 32)
  np.testing.assert_allclose(out, (encoded[:, 0] + encoded[:, 1]) / 2,
                             rtol=1e-6, atol=1e-6)


def test_distilled_fine_tuning_keeps_both_prefix_entries(tmp_path):
  """At a new resolution the class and distillation entries are kept and
  only the 4x4 grid of patch entries is resized, to 6x6; both heads are the
  new model's."""
  params = random_params(_distilled(), jnp.zeros((1, 32, 32, 3)), train=False)
  path = tmp_path / 'deit.npz'
  checkpoint.save(params, path)
  config = models.MODEL_CONFIGS['DeiT-testing-distilled']
  assert checkpoint.image_size(checkpoint.read_params(path), config) == 32
  model = _distilled(num_classes=3)
  x = jnp.ones((2, 48, 48, 3))
  init = jax.jit(lambda: model.init(jax.random.key(1), x, train=False))()[
      'params']
  loaded = checkpoint.load_pretrained(pretrained_path=str(path),
                                      init_params=init, model_config=config)
  old = params['Transformer']['posembed_input']['pos_embedding']
  new = loaded['Transformer']['posembed_input']['pos_embedding']
  assert new.shape == (1, 2 + 36, 32)
  np.testing.assert_array_equal(new[:, :2], old[:, :2])
  # DeiT's weights are timm's: resized as timm does by default.
  grid = posemb_resize.resize_posemb_grid(old[:, 2:], new_grid=(6, 6),
                                          has_class_token=False,
                                          method='bicubic_antialias')
  np.testing.assert_allclose(new[:, 2:], grid, rtol=1e-6)
  for head in ('head', 'head_dist'):
    np.testing.assert_array_equal(loaded[head]['kernel'], init[head]['kernel'])
    assert loaded[head]['kernel'].shape == (32, 3)
  assert _apply(model, loaded, x, train=False).shape == (2, 3)
