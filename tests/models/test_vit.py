"""ViT presets, shapes, errors, and numerics against a numpy reference;
the MAP head and stochastic depth."""

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
from tests.models.vit_reference import _block
from tests.models.vit_reference import _msa
from vit_jax import models
from vit_jax.models import posemb as vit_posemb
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


# Against a numpy reference, written from the paper's equations (1)-(4)
# (the attention and the block: vit_reference.py).


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


@pytest.mark.parametrize('classifier,has', [
    ('token', True), ('token_unpooled', True), ('gap', False), ('map', False),
    ('unpooled', False), ({}, True), ({'classifier': 'gap'}, False)])
def test_has_class_token(classifier, has):
  assert models_vit.has_class_token(classifier) is has
