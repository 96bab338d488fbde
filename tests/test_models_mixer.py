"""MLP-Mixer presets, parameter tree, shapes, errors, and numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax import models_mixer

# The original release's parameter counts at 224 px with 1000 classes.
EXPECTED_PARAMS = {
    'Mixer-B_16': 59_880_472,
    'Mixer-B_32': 60_293_428,
    'Mixer-L_16': 208_196_168,
    'Mixer-testing': 38_288,
}


@pytest.mark.parametrize('name', sorted(EXPECTED_PARAMS))
def test_param_count(name):
  model = models.get_model(name, num_classes=1000)
  assert isinstance(model, models_mixer.MlpMixer)
  assert models.count_params(model) == EXPECTED_PARAMS[name]


def _param_shapes(model, shape):
  return jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros(shape), train=False))['params']


def test_param_tree_names():
  model = models.get_model('Mixer-testing', num_classes=5)
  params = _param_shapes(model, (1, 32, 48, 3))
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
    _param_shapes(model, shape)


# A numpy reference, written from the Mixer paper's equations.


def _layernorm(x, p, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu)**2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _gelu(x):  # tanh approximation, as flax's nn.gelu
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _mlp(x, p):
  h = _gelu(x @ p['Dense_0']['kernel'] + p['Dense_0']['bias'])
  return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


def _mixer(images, p, patch):
  n, h, w, c = images.shape
  gh, gw = h // patch, w // patch
  x = images.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  x = x.reshape(n, gh * gw, -1) @ p['stem']['kernel'].reshape(
      -1, p['stem']['kernel'].shape[-1]) + p['stem']['bias']
  i = 0
  while f'MixerBlock_{i}' in p:
    b = p[f'MixerBlock_{i}']
    # U = X + W2 gelu(W1 LN(X))^T over tokens, then Y = U + MLP(LN(U)).
    u = _layernorm(x, b['LayerNorm_0']).transpose(0, 2, 1)
    x = x + _mlp(u, b['token_mixing']).transpose(0, 2, 1)
    x = x + _mlp(_layernorm(x, b['LayerNorm_1']), b['channel_mixing'])
    i += 1
  x = _layernorm(x, p['pre_head_layer_norm']).mean(1)
  return x @ p['head']['kernel'] + p['head']['bias']


def test_forward_matches_reference():
  model = models.get_model('Mixer-testing', num_classes=4,
                           patches={'size': (8, 8)})
  x = np.random.default_rng(1).uniform(-1, 1, (2, 16, 24, 3))
  shapes = _param_shapes(model, x.shape)
  leaves, treedef = jax.tree.flatten(shapes)
  rng = np.random.default_rng(2)
  params = jax.tree.unflatten(
      treedef, [rng.normal(0, 0.3, l.shape).astype(np.float32)
                for l in leaves])
  apply = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))
  out = apply(params, jnp.asarray(x, jnp.float32))
  np.testing.assert_allclose(out, _mixer(x, params, 8), rtol=1e-3, atol=1e-3)
