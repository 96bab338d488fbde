"""MLP-Mixer presets, parameter tree, shapes, errors, and numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import eqns
from tests.helpers import layernorm
from tests.helpers import mlp
from tests.helpers import param_shapes
from tests.helpers import patch_embed
from tests.helpers import random_params
from vit_jax import models

def test_param_tree_names():
  model = models.get_model('Mixer-testing', num_classes=5)
  params = param_shapes(model, jnp.zeros((1, 32, 48, 3)), train=False)
  assert set(params) == {'stem', 'MixerBlock_0', 'MixerBlock_1',
                         'pre_head_layer_norm', 'head'}
  block = params['MixerBlock_1']
  assert set(block) == {'LayerNorm_0', 'token_mixing', 'LayerNorm_1',
                        'channel_mixing'}
  assert set(block['token_mixing']) == {'Dense_0', 'Dense_1'}
  assert set(block['channel_mixing']) == {'Dense_0', 'Dense_1'}
  # 6 patches, token MLP 8, channels 16, channel MLP 32.
  assert block['token_mixing']['Dense_0']['kernel'].shape == (6, 8)
  assert block['token_mixing']['Dense_1']['kernel'].shape == (8, 6)
  assert block['channel_mixing']['Dense_0']['kernel'].shape == (16, 32)
  assert params['stem']['kernel'].shape == (16, 16, 3, 16)
  assert params['head']['kernel'].shape == (16, 5)


@pytest.mark.parametrize('num_classes,size,expected', [
    (5, (32, 48), (2, 5)),
    (0, (64, 16), (2, 16)),  # No head: the pooled representation.
])
def test_output_shapes(num_classes, size, expected):
  model = models.get_model('Mixer-testing', num_classes=num_classes)
  out = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), jnp.zeros((2, *size, 3)), train=True))[0]
  assert out.shape == expected


def test_head_starts_at_zero():
  model = models.get_model('Mixer-testing', num_classes=3)
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  out, _ = jax.jit(lambda x: model.init_with_output(
      jax.random.key(0), x, train=False))(x)
  np.testing.assert_array_equal(out, 0)


@pytest.mark.parametrize('shape,match', [
    ((1, 30, 32, 3), '30x32 is not a multiple of the patch size 16x16'),
    ((1, 8, 8, 3), '8x8 is not a multiple'),
    ((32, 32, 3), 'NHWC'),
])
def test_bad_image_size(shape, match):
  model = models.get_model('Mixer-testing', num_classes=3)
  with pytest.raises(ValueError, match=match):
    param_shapes(model, jnp.zeros(shape), train=False)


# A numpy reference, written from the Mixer paper's equations.


def _mixer(images, p, patch):
  x = patch_embed(images, p['stem'], patch)
  i = 0
  while f'MixerBlock_{i}' in p:
    b = p[f'MixerBlock_{i}']
    # U = X + W2 gelu(W1 LN(X))^T over tokens, then Y = U + MLP(LN(U)).
    u = layernorm(x, b['LayerNorm_0']).transpose(0, 2, 1)
    x = x + mlp(u, b['token_mixing']).transpose(0, 2, 1)
    x = x + mlp(layernorm(x, b['LayerNorm_1']), b['channel_mixing'])
    i += 1
  x = layernorm(x, p['pre_head_layer_norm']).mean(1)
  return x @ p['head']['kernel'] + p['head']['bias']


def test_forward_matches_reference():
  model = models.get_model('Mixer-testing', num_classes=4,
                           patches={'size': (8, 8)})
  x = np.random.default_rng(1).uniform(-1, 1, (2, 16, 24, 3))
  params = random_params(model, jnp.zeros(x.shape), train=False, seed=2,
                         scale=0.3)
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))
  out = apply(params, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(out, _mixer(x, params, 8), rtol=1e-3, atol=1e-3)


# bfloat16 computation (`dtype`): float32 parameters, statistics and logits.

# bf16 keeps 8 significant bits: each rounding is off by up to 2^-8 relative
# (epsilon 2^-7). Over 30 draws, the two blocks' roundings add up to 0.6% of
# the largest logit at most; the bound is four epsilons (3.1%) of it.
BF16_TOL = 4 * 2.**-7


def _ops(model, x, primitive='dot_general'):
  """(operand dtypes, kernel shape) of each `primitive` eqn in the forward."""
  params = random_params(model, x, train=False)
  jaxpr = jax.make_jaxpr(
      lambda p, x: model.apply({'params': p}, x, train=False))(params, x)
  return [({v.aval.dtype.name for v in e.invars}, e.invars[1].aval.shape)
          for e in eqns(jaxpr) if e.primitive.name == primitive]


def test_bf16_params_stay_float32():
  x = jnp.zeros((1, 32, 32, 3))
  shapes = lambda m: param_shapes(m, x, train=False)
  bf16 = shapes(models.get_model('Mixer-testing', num_classes=10,
                                 dtype=jnp.bfloat16))
  # Same tree, shapes and dtypes (ShapeDtypeStructs compare both).
  assert bf16 == shapes(models.get_model('Mixer-testing', num_classes=10))
  assert {l.dtype.name for l in jax.tree.leaves(bf16)} == {'float32'}


@pytest.mark.parametrize('dtype', [jnp.bfloat16, 'bfloat16'])
def test_bf16_dots_in_bf16_but_head(dtype):
  model = models.get_model('Mixer-testing', num_classes=10, dtype=dtype)
  x = jnp.zeros((2, 32, 32, 3))
  assert _ops(model, x, 'conv_general_dilated') == [
      ({'bfloat16'}, (16, 16, 3, 16))]  # The stem.
  dots = _ops(model, x)
  # Two blocks of two MLPs of two Dense each, then the head (16 -> 10).
  assert len(dots) == 9
  assert [s for d, s in dots if d == {'bfloat16'}] == [
      (4, 8), (8, 4), (16, 32), (32, 16)] * 2
  assert [s for d, s in dots if d != {'bfloat16'}] == [(16, 10)]
  assert [d for d, s in dots if s == (16, 10)] == [{'float32'}]


def test_float32_dots_in_float32():
  model = models.get_model('Mixer-testing', num_classes=10)
  x = jnp.zeros((2, 32, 32, 3))
  dots = _ops(model, x) + _ops(model, x, 'conv_general_dilated')
  assert len(dots) == 10
  assert all(d == {'float32'} for d, _ in dots)


def test_bf16_without_head_outputs_bf16():
  model = models.get_model('Mixer-testing', num_classes=0, dtype='bfloat16')
  out = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), jnp.zeros((2, 32, 32, 3)), train=False))[0]
  assert out.shape == (2, 16) and out.dtype == jnp.bfloat16


def test_bf16_logits_close_to_float32():
  m32 = models.get_model('Mixer-testing', num_classes=10)
  m16 = models.get_model('Mixer-testing', num_classes=10, dtype=jnp.bfloat16)
  x = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3), minval=-1,
                         maxval=1)
  # Random weights (the head starts at zero), the same for both models.
  params = random_params(m32, x, train=False, seed=9, scale=0.5)
  apply = lambda m: jax.jit(
      lambda p, x: m.apply({'params': p}, x, train=False))(params, x)
  out32, out16 = apply(m32), apply(m16)
  assert out16.dtype == jnp.float32
  err = np.max(np.abs(out16 - out32))
  peak = np.max(np.abs(out32))
  assert peak > 1  # Logits of a useful size.
  assert 0 < err < BF16_TOL * peak, (err, peak)
