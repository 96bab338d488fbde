"""MLP-Mixer presets, parameter tree, shapes, errors, and numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import layernorm
from helpers import mlp
from helpers import param_shapes
from helpers import patch_embed
from helpers import random_params
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
