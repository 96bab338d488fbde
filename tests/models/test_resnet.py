"""Hybrid R+ViT presets, parameter tree, shapes, and ResNet numerics."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import eqns
from tests.helpers import param_shapes
from tests.helpers import random_params
from vit_jax import models
from vit_jax.models import resnet as models_resnet

TINY = dict(num_classes=7, patches={'size': (1, 1)},
            resnet={'num_layers': (1, 2), 'width_factor': 0.5})


def test_param_tree_names():
  model = models.get_model('testing', **TINY)
  params = param_shapes(model, jnp.zeros((1, 32, 32, 3)), train=False)
  # Top level, as in the published hybrid checkpoints.
  assert set(params) == {'conv_root', 'gn_root', 'block1', 'block2',
                         'embedding', 'cls', 'Transformer', 'head'}
  assert set(params['conv_root']) == {'kernel'}  # No bias.
  assert params['conv_root']['kernel'].shape == (7, 7, 3, 32)
  assert set(params['block1']) == {'unit1'}
  assert set(params['block2']) == {'unit1', 'unit2'}
  convs = {'conv1', 'gn1', 'conv2', 'gn2', 'conv3', 'gn3'}
  # Shapes change in each stage's first unit only: 32 -> 128, 128 -> 256.
  assert set(params['block1']['unit1']) == convs | {'conv_proj', 'gn_proj'}
  assert set(params['block2']['unit1']) == convs | {'conv_proj', 'gn_proj'}
  assert set(params['block2']['unit2']) == convs
  unit = params['block2']['unit1']
  assert unit['conv1']['kernel'].shape == (1, 1, 128, 64)
  assert unit['conv2']['kernel'].shape == (3, 3, 64, 64)
  assert unit['conv3']['kernel'].shape == (1, 1, 64, 256)
  assert unit['conv_proj']['kernel'].shape == (1, 1, 128, 256)
  assert params['embedding']['kernel'].shape == (1, 1, 256, 10)


def test_last_groupnorm_starts_at_zero():
  unit = models_resnet.ResidualUnit(32)
  params = jax.jit(unit.init)(jax.random.key(0), jnp.ones((1, 4, 4, 16)))
  np.testing.assert_array_equal(params['params']['gn3']['scale'], 0)
  np.testing.assert_array_equal(params['params']['gn2']['scale'], 1)


@pytest.mark.parametrize('resnet,patch,size,tokens', [
    # Root /4, block2 /2: 32x48 -> 4x6 patches, plus the class token.
    ({'num_layers': (1, 2), 'width_factor': 0.5}, 1, (32, 48), 25),
    # Root alone, 2x2 patches: 32x32 -> 8x8 -> 4x4.
    ({'num_layers': (), 'width_factor': 0.5}, 2, (32, 32), 17),
])
def test_forward_shapes(resnet, patch, size, tokens):
  model = models.get_model('testing', num_classes=7, resnet=resnet,
                           patches={'size': (patch, patch)})
  x = jax.random.normal(jax.random.key(1), (2, *size, 3))
  params = random_params(model, x, train=False)
  pe = params['Transformer']['posembed_input']['pos_embedding']
  assert pe.shape == (1, tokens, 10)
  out = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(
      params, x)
  assert out.shape == (2, 7)
  assert np.all(np.isfinite(out))


@pytest.mark.parametrize('shape,match', [
    # 36 -> 18 (conv) -> 9 (pool): not a multiple of 2.
    ((1, 36, 36, 3), r'ResNet feature map \(of the 36x36 image\) size 9x9 '
                     'is not a multiple of the patch size 2x2'),
    ((36, 36, 3), 'NHWC'),
])
def test_bad_image_size(shape, match):
  model = models.get_model('testing', num_classes=3, patches={'size': (2, 2)},
                           resnet={'num_layers': (), 'width_factor': 0.5})
  with pytest.raises(ValueError, match=match):
    param_shapes(model, jnp.zeros(shape), train=False)


# Numpy references: a direct convolution, GroupNorm, weight standardization.


def _conv(x, kernel, stride=1):
  """'SAME' cross-correlation, padding as TensorFlow/XLA (extra at the end)."""
  n, h, w, _ = x.shape
  kh, kw, _, cout = kernel.shape
  oh, ow = -(-h // stride), -(-w // stride)
  ph = max((oh - 1) * stride + kh - h, 0)
  pw = max((ow - 1) * stride + kw - w, 0)
  x = np.pad(x, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2),
                 (0, 0)))
  out = np.zeros((n, oh, ow, cout))
  for i in range(oh):
    for j in range(ow):
      window = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw]
      out[:, i, j] = np.einsum('nabc,abco->no', window, kernel)
  return out


def _standardized(kernel, eps=1e-5):
  flat = kernel.reshape(-1, kernel.shape[-1])
  return (kernel - flat.mean(0)) / (flat.std(0) + eps)


def _groupnorm(x, p, groups=32, eps=1e-6):
  n, h, w, c = x.shape
  g = x.reshape(n, h, w, groups, c // groups)
  mu = g.mean((1, 2, 4), keepdims=True)
  var = g.var((1, 2, 4), keepdims=True)
  g = (g - mu) / np.sqrt(var + eps)
  return g.reshape(x.shape) * p['scale'] + p['bias']


@pytest.mark.parametrize('stride,use_bias', [(1, False), (2, True)])
def test_std_conv_matches_reference(stride, use_bias):
  x = np.random.default_rng(1).normal(size=(2, 7, 6, 4))
  conv = models_resnet.StdConv(5, (3, 3), (stride, stride), use_bias=use_bias)
  # A small kernel, so that where eps goes (std + eps) shows in the result.
  params = random_params(conv, jnp.asarray(x, jnp.float32), scale=0.01)
  out = jax.jit(conv.apply)({'params': params}, jnp.asarray(x, jnp.float32))
  expected = _conv(x, _standardized(params['kernel']), stride)
  if use_bias:
    expected += params['bias']
  assert out.shape == expected.shape
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_standardize_statistics():
  kernel = np.random.default_rng(2).normal(3., 2., size=(3, 3, 4, 6))
  w = np.asarray(models_resnet.standardize(jnp.asarray(kernel)))
  np.testing.assert_allclose(w.mean((0, 1, 2)), 0, atol=1e-5)
  np.testing.assert_allclose(w.std((0, 1, 2)), 1, atol=1e-4)


def _unit(x, p, stride):
  """Bottleneck unit, written from its description."""
  y = np.maximum(_groupnorm(_conv(x, _standardized(p['conv1']['kernel'])),
                            p['gn1']), 0)
  y = np.maximum(_groupnorm(
      _conv(y, _standardized(p['conv2']['kernel']), stride), p['gn2']), 0)
  y = _groupnorm(_conv(y, _standardized(p['conv3']['kernel'])), p['gn3'])
  residual = x
  if 'conv_proj' in p:
    residual = _groupnorm(
        _conv(x, _standardized(p['conv_proj']['kernel']), stride),
        p['gn_proj'])
  return np.maximum(residual + y, 0)


@pytest.mark.parametrize('channels,stride', [(16, 2), (128, 1)])
def test_residual_unit_matches_reference(channels, stride):
  x = np.random.default_rng(3).normal(size=(2, 5, 5, channels))
  unit = models_resnet.ResidualUnit(32, strides=(stride, stride))
  params = random_params(unit, jnp.asarray(x, jnp.float32))
  # Projection only when the shape changes (128 channels in, stride 1: none).
  assert ('conv_proj' in params) == (channels != 128 or stride != 1)
  out = jax.jit(unit.apply)({'params': params}, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(out, _unit(x, params, stride),
                             rtol=2e-3, atol=2e-3)


# bfloat16 computation (`dtype`): float32 parameters and statistics.

# bf16 keeps 8 significant bits: each rounding is off by up to 2^-8 relative
# (epsilon 2^-7). Over 10 draws, a stage of two units' roundings add up to
# 1.0% of the largest output at most; the bound is four epsilons (3.1%).
BF16_TOL = 4 * 2.**-7

# 32 bottleneck channels. A first unit projects its shortcut (4 convs), the
# stage's second unit does not (3 convs).
BF16_MODULES = {
    'unit': (functools.partial(models_resnet.ResidualUnit, 32, (2, 2)),
             (2, 8, 8, 16), 4),
    'stage': (functools.partial(models_resnet.ResNetStage, 2, 32, (2, 2)),
              (2, 8, 8, 64), 7),
}


@pytest.mark.parametrize('name', sorted(BF16_MODULES))
@pytest.mark.parametrize('dtype', [jnp.bfloat16, 'bfloat16'])
def test_bf16_convs_in_bf16(name, dtype):
  make, shape, num_convs = BF16_MODULES[name]
  module = make(dtype=dtype)
  x = jnp.zeros(shape)
  assert param_shapes(module, x) == param_shapes(make(), x)
  params = random_params(module, x)
  assert {p.dtype.name for p in jax.tree.leaves(params)} == {'float32'}
  jaxpr = jax.make_jaxpr(module.apply)({'params': params}, x)
  found = list(eqns(jaxpr))
  dtypes = lambda e: {v.aval.dtype.name for v in e.invars}
  convs = [dtypes(e) for e in found
           if e.primitive.name == 'conv_general_dilated']
  assert convs == [{'bfloat16'}] * num_convs
  # Weight standardization (sqrt of the variance) and GroupNorm statistics
  # (rsqrt) in float32; their means too.
  stats = [dtypes(e) for e in found
           if e.primitive.name in ('reduce_sum', 'sqrt', 'rsqrt')]
  assert stats and all(d == {'float32'} for d in stats)
  assert jaxpr.out_avals[0].dtype == jnp.bfloat16


@pytest.mark.parametrize('name', sorted(BF16_MODULES))
def test_bf16_close_to_float32(name):
  make, shape, _ = BF16_MODULES[name]
  x = jax.random.normal(jax.random.key(2), shape)
  params = random_params(make(), x, seed=9)
  out32 = jax.jit(make().apply)({'params': params}, x)
  out16 = jax.jit(make(dtype=jnp.bfloat16).apply)({'params': params}, x)
  assert out32.dtype == jnp.float32 and out16.dtype == jnp.bfloat16
  err = np.max(np.abs(np.asarray(out16, np.float32) - out32))
  peak = np.max(np.abs(out32))
  assert peak > 1
  assert 0 < err < BF16_TOL * peak, (err, peak)


# BiT's ResNet-v2 classifier (pre-activation units).


def _conv_sym(x, kernel, stride=1):
  """Cross-correlation with BiT's symmetric padding of (k - 1) / 2."""
  pad = (kernel.shape[0] - 1) // 2
  x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  n, h, w, _ = x.shape
  k = kernel.shape[0]
  oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
  out = np.zeros((n, oh, ow, kernel.shape[-1]))
  for i in range(oh):
    for j in range(ow):
      window = x[:, i * stride:i * stride + k, j * stride:j * stride + k]
      out[:, i, j] = np.einsum('nabc,abco->no', window, kernel)
  return out


def _preact_unit(x, p, stride):
  """x + convs(ReLU(GN(x))), GN and ReLU before each conv (BiT)."""
  gn = functools.partial(_groupnorm, eps=1e-5)
  conv = lambda y, name, s=1: _conv_sym(
      y, _standardized(p[name]['kernel']), s)
  y = np.maximum(gn(x, p['gn1']), 0)
  residual = conv(y, 'conv_proj', stride) if 'conv_proj' in p else x
  y = np.maximum(gn(conv(y, 'conv1'), p['gn2']), 0)
  y = np.maximum(gn(conv(y, 'conv2', stride), p['gn3']), 0)
  return residual + conv(y, 'conv3')


def _bit(images, p):
  """Root (7x7/2 conv, 3x3/2 max-pool over zeros), units, GN, ReLU, mean,
  head."""
  x = _conv_sym(images, _standardized(p['root_block']['conv_root']['kernel']),
                2)
  x = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
  n, h, w, c = x.shape
  x = np.stack([np.stack([x[:, i:i + 3, j:j + 3].max((1, 2))
                          for j in range(0, w - 2, 2)], 1)
                for i in range(0, h - 2, 2)], 1)
  for i in (1, 2):
    x = _preact_unit(x, p[f'block{i}']['unit01'], 2 if i > 1 else 1)
  x = np.maximum(_groupnorm(x, p['norm-pre-head'], eps=1e-5), 0).mean((1, 2))
  return x @ p['head']['kernel'] + p['head']['bias']


def test_bit_param_tree():
  model = models.get_model('BiT-testing', num_classes=7)
  assert isinstance(model, models_resnet.ResNetV2)
  x = jnp.zeros((1, 32, 32, 3))
  params = param_shapes(model, x, train=False)
  # BiT's names: root_block/conv_root, block{i}/unit{j:02d}, norm-pre-head.
  assert set(params) == {'root_block', 'block1', 'block2', 'norm-pre-head',
                         'head'}
  assert set(params['root_block']['conv_root']) == {'kernel'}  # No bias.
  assert params['root_block']['conv_root']['kernel'].shape == (7, 7, 3, 32)
  unit = params['block2']['unit01']
  # Pre-activation: gn1 normalizes the 128-channel input; the projection
  # has no norm of its own.
  assert set(unit) == {'gn1', 'conv1', 'gn2', 'conv2', 'gn3', 'conv3',
                       'conv_proj'}
  assert unit['gn1']['scale'].shape == (128,)
  assert unit['conv2']['kernel'].shape == (3, 3, 64, 64)
  assert unit['conv_proj']['kernel'].shape == (1, 1, 128, 256)
  assert params['head']['kernel'].shape == (256, 7)
  head = jax.jit(lambda: model.init(jax.random.key(0), x, train=False))()[
      'params']['head']
  np.testing.assert_array_equal(head['kernel'], 0)  # zero-initialized


@pytest.mark.parametrize('channels,stride', [(32, 2), (128, 1)])
def test_preact_unit_matches_reference(channels, stride):
  """An even side (6), where BiT's symmetric padding differs from 'SAME'."""
  x = np.random.default_rng(5).normal(size=(2, 6, 6, channels))
  unit = models_resnet.PreActUnit(32, strides=(stride, stride))
  params = random_params(unit, jnp.asarray(x, jnp.float32))
  assert ('conv_proj' in params) == (channels != 128 or stride != 1)
  out = jax.jit(unit.apply)({'params': params}, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(out, _preact_unit(x, params, stride),
                             rtol=2e-3, atol=2e-3)


def test_bit_matches_reference():
  model = models.get_model('BiT-testing', num_classes=5)
  x = np.random.default_rng(6).uniform(-1, 1, (2, 32, 32, 3))
  params = random_params(model, jnp.asarray(x, jnp.float32), train=False)
  out = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(
      params, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(out, _bit(x, params), rtol=2e-3, atol=2e-3)


def test_bit_takes_train_as_the_vit():
  """As the classification task calls it; nothing depends on `train`."""
  model = models.get_model('BiT-testing', num_classes=5)
  x = jax.random.uniform(jax.random.key(0), (2, 48, 32, 3), minval=-1)
  params = random_params(model, x, train=False)
  apply = jax.jit(lambda p, x, train: model.apply(
      {'params': p}, x, train=train, rngs={'dropout': jax.random.key(1)}),
                  static_argnums=2)
  np.testing.assert_array_equal(apply(params, x, True),
                                apply(params, x, False))
  assert apply(params, x, False).shape == (2, 5)
  features = jax.jit(lambda p, x: model.clone(num_classes=0).apply(
      {'params': p}, x, train=False))(
          {k: v for k, v in params.items() if k != 'head'}, x)
  assert features.shape == (2, 256)
  with pytest.raises(ValueError, match='NHWC'):
    model.init(jax.random.key(0), jnp.zeros((32, 32, 3)), train=False)
