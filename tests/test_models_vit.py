"""ViT presets, shapes, errors, and numerics against a numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax import models_vit

# The original release's parameter counts at 224 px with 1000 classes.
EXPECTED_PARAMS = {
    'ViT-Ti_16': 5_717_416,
    'ViT-S_16': 22_050_664,
    'ViT-S_32': 22_878_952,
    'ViT-B_16': 86_567_656,
    'ViT-B_8': 86_576_872,
    'ViT-B_32': 88_224_232,
    'ViT-L_16': 304_326_632,
    'ViT-L_32': 306_535_400,
    'ViT-H_14': 632_045_800,
    'ViT-B_16-gap-norep': 86_566_120,
    'ViT-B_32-gap-norep': 88_222_696,
    'ViT-S_16-gap-norep': 22_049_896,
    'ViT-S_32-gap-norep': 22_878_184,
    'testing': 21_390,
    'testing-unpooled': 21_370,
}


@pytest.mark.parametrize('name', sorted(EXPECTED_PARAMS))
def test_param_count(name):
  model = models.get_model(name, num_classes=1000)
  assert models.count_params(model) == EXPECTED_PARAMS[name]


def test_param_tree_names():
  model = models.get_model('testing', num_classes=3, representation_size=4)
  params = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))['params']
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


def _layernorm(x, p, eps=1e-6):
  mu = x.mean(-1, keepdims=True)
  var = ((x - mu)**2).mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + eps) * p['scale'] + p['bias']


def _gelu(x):  # tanh approximation, as flax's nn.gelu
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _msa(x, p):
  """Multi-head self-attention: softmax(q k^T / sqrt(d)) v per head."""
  q, k, v = (np.einsum('btd,dhk->bhtk', x, p[n]['kernel']) +
             p[n]['bias'].transpose(0, 1)[None, :, None, :]
             for n in ('query', 'key', 'value'))
  logits = np.einsum('bhtk,bhsk->bhts', q, k) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  heads = np.einsum('bhts,bhsk->bthk', w, v)
  return np.einsum('bthk,hkd->btd', heads, p['out']['kernel']) + p['out']['bias']


def _block(x, p):
  x = x + _msa(_layernorm(x, p['LayerNorm_0']),
               p['MultiHeadDotProductAttention_0'])
  mlp = p['MlpBlock_0']
  y = _layernorm(x, p['LayerNorm_1'])
  y = _gelu(y @ mlp['Dense_0']['kernel'] + mlp['Dense_0']['bias'])
  return x + y @ mlp['Dense_1']['kernel'] + mlp['Dense_1']['bias']


def _vit(images, p, patch, classifier):
  n, h, w, c = images.shape
  gh, gw = h // patch, w // patch
  patches = images.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  patches = patches.reshape(n, gh * gw, patch * patch * c)
  kernel = p['embedding']['kernel'].reshape(-1, p['embedding']['kernel'].shape[-1])
  x = patches @ kernel + p['embedding']['bias']               # x_p E
  if classifier == 'token':
    x = np.concatenate([np.broadcast_to(p['cls'], (n, 1, x.shape[-1])), x], 1)
  t = p['Transformer']
  x = x + t['posembed_input']['pos_embedding']                # + E_pos
  i = 0
  while f'encoderblock_{i}' in t:
    x = _block(x, t[f'encoderblock_{i}'])
    i += 1
  x = _layernorm(x, t['encoder_norm'])
  y = x[:, 0] if classifier == 'token' else x.mean(1)
  y = np.tanh(y @ p['pre_logits']['kernel'] + p['pre_logits']['bias'])
  return y @ p['head']['kernel'] + p['head']['bias']


def _random_params(model, x, seed=0):
  variables = model.init(jax.random.key(seed), x, train=False)
  leaves, treedef = jax.tree.flatten(variables['params'])
  rng = np.random.default_rng(seed)
  leaves = [rng.normal(0, 0.5, l.shape).astype(np.float64) for l in leaves]
  return jax.tree.unflatten(treedef, leaves)


def test_encoder_block_matches_reference():
  block = models_vit.Encoder1DBlock(mlp_dim=12, num_heads=3)
  x = np.random.default_rng(1).normal(size=(2, 5, 9))
  variables = block.init(jax.random.key(0), jnp.asarray(x), deterministic=True)
  leaves, treedef = jax.tree.flatten(variables['params'])
  rng = np.random.default_rng(2)
  params = jax.tree.unflatten(
      treedef, [rng.normal(0, 0.5, l.shape) for l in leaves])
  out = block.apply({'params': params}, jnp.asarray(x, jnp.float32),
                    deterministic=True)
  np.testing.assert_allclose(out, _block(x, params), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize('classifier,size', [('token', (32, 48)),
                                             ('gap', (32, 32))])
def test_forward_matches_reference(classifier, size):
  model = models.get_model('testing', num_classes=6, representation_size=8,
                           classifier=classifier, patches={'size': (8, 8)},
                           transformer=dict(num_layers=2, mlp_dim=16,
                                            num_heads=2, dropout_rate=0.1,
                                            attention_dropout_rate=0.1))
  x = np.random.default_rng(3).uniform(-1, 1, (2, *size, 3))
  params = _random_params(model, jnp.asarray(x, jnp.float32))
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
  params = _random_params(model, x)
  apply = lambda train, key: model.apply(
      {'params': params}, x, train=train, rngs={'dropout': key})
  k1, k2 = jax.random.key(1), jax.random.key(2)
  np.testing.assert_array_equal(apply(False, k1), apply(False, k2))
  np.testing.assert_array_equal(apply(True, k1), apply(True, k1))
  assert not np.allclose(apply(True, k1), apply(True, k2))
  assert not np.allclose(apply(True, k1), apply(False, k1))
