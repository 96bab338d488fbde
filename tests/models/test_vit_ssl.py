"""The options of timm's self-supervised and DeiT III ViTs (LayerScale,
registers, a position table without prefix entries, fc_norm, SwiGLU, keep=)
against a numpy forward written from the papers' equations, and their
presets."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import layernorm
from tests.helpers import patch_embed
from tests.helpers import random_params
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import models
from vit_jax.models import posemb_resize
from vit_jax.models import registry
from vit_jax.models import vit as models_vit

TOL = dict(rtol=1e-5, atol=1e-5)


# The numpy reference.


def _gelu(x):  # exact (erf) GELU
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def _silu(x):
  return x / (1 + np.exp(-x))


def _attention(x, p):
  """Multi-head self-attention from the (D, heads, depth) q, k, v kernels."""
  q, k, v = (np.einsum('btd,dhk->bhtk', x, p[n]['kernel']) +
             p[n]['bias'][None, :, None, :] for n in ('query', 'key', 'value'))
  logits = np.einsum('bhtk,bhsk->bhts', q, k) / np.sqrt(q.shape[-1])
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  heads = np.einsum('bhts,bhsk->bthk', w, v)
  out = np.einsum('bthk,hkd->btd', heads, p['out']['kernel'])
  return out + p['out']['bias']


def _mlp(x, p, swiglu):
  """fc1, exact GELU (or SwiGLU: silu(first half) * second half), fc2."""
  h = x @ p['Dense_0']['kernel'] + p['Dense_0']['bias']
  if swiglu:
    h1, h2 = np.split(h, 2, axis=-1)
    h = _silu(h1) * h2
  else:
    h = _gelu(h)
  return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


def _block(x, b, swiglu):
  """x + gamma_1 * MSA(LN(x)), then x + gamma_2 * MLP(LN(x)) (CaiT's
  LayerScale; gamma = 1 without it)."""
  ls1 = b['ls1']['scale'] if 'ls1' in b else 1.
  ls2 = b['ls2']['scale'] if 'ls2' in b else 1.
  x = x + ls1 * _attention(layernorm(x, b['LayerNorm_0']),
                           b['MultiHeadDotProductAttention_0'])
  return x + ls2 * _mlp(layernorm(x, b['LayerNorm_1']), b['MlpBlock_0'],
                        swiglu)


def _reference(images, p, patch, classifier='token', posemb_prefix=True,
               fc_norm=False, swiglu=False, keep=None):
  """Tokens [cls, reg_1..reg_R, patches]; the position table on all of them
  or (posemb_prefix=False) on the patches only; the patches at `keep`;
  blocks; final LayerNorm (or fc_norm after pooling); pooling without the
  registers; the head if `p` has one."""
  n = images.shape[0]
  x = patch_embed(images, p['embedding'], patch)
  d = x.shape[-1]
  cls = [np.broadcast_to(p['cls'], (n, 1, d))] if 'cls' in p else []
  reg = [np.broadcast_to(p['reg'], (n, *p['reg'].shape[1:]))] if (
      'reg' in p) else []
  pe = p['Transformer']['posembed_input']['pos_embedding']
  if posemb_prefix:
    x = np.concatenate(cls + reg + [x], 1) + pe
  else:
    x = np.concatenate(cls + reg + [x + pe], 1)
  c, r = len(cls), (p['reg'].shape[1] if reg else 0)
  if keep is not None:
    kept = np.take_along_axis(x[:, c + r:], keep[..., None], 1)
    x = np.concatenate([x[:, :c + r], kept], 1)
  t = p['Transformer']
  for i in range(len([k for k in t if k.startswith('encoderblock_')])):
    x = _block(x, t[f'encoderblock_{i}'], swiglu)
  if not fc_norm:
    x = layernorm(x, t['encoder_norm'])
  x = np.concatenate([x[:, :c], x[:, c + r:]], 1)  # registers dropped
  x = {'token': lambda: x[:, 0], 'gap': lambda: x.mean(1)}.get(
      classifier, lambda: x)()
  if fc_norm:
    x = layernorm(x, p['fc_norm'])
  return x @ p['head']['kernel'] + p['head']['bias'] if 'head' in p else x


def _images(size, n=2, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (n, *size, 3)).astype(
      np.float32)


def _params(model, x, scale=0.2):
  return random_params(model, jnp.asarray(x), train=False, scale=scale)


def _check(model, params, x, expected, **kw):
  out = model.apply({'params': params}, jnp.asarray(x), train=False, **kw)
  np.testing.assert_allclose(out, expected, **TOL)


def _transformer(name, **kw):
  """The preset's transformer config with `kw` changed."""
  return dict(models.MODEL_CONFIGS[name].transformer.to_dict(), **kw)


# Forward passes against the reference.


@pytest.mark.parametrize('num_classes', [5, None])
def test_layerscale_registers_table_without_prefix(num_classes):
  """DINOv2 with registers: LayerScale, 4 registers, a table for the
  patches only, exact GELU; a 2x3 grid."""
  model = models.get_model('DINOv2-testing-reg4', num_classes=num_classes)
  x = _images((28, 42))
  params = _params(model, x)
  assert params['reg'].shape == (1, 4, 32)
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 6, 32)
  _check(model, params, x, _reference(x, params, 14, posemb_prefix=False))


@pytest.mark.parametrize('classifier', ['gap', 'token'])
def test_fc_norm_after_pooling(classifier):
  """fc_norm replaces the final LayerNorm and normalizes the pooled feature;
  'gap' averages the patch tokens only (no registers)."""
  model = models.get_model('MAE-testing', num_classes=4, classifier=classifier,
                           fc_norm=True, num_registers=2)
  x = _images((32, 48))
  params = _params(model, x)
  assert 'fc_norm' in params and 'encoder_norm' not in params['Transformer']
  _check(model, params, x, _reference(x, params, 16, classifier=classifier,
                                      fc_norm=True))


@pytest.mark.parametrize('scan,remat', [(False, 'none'), (True, 'full')])
def test_swiglu(scan, remat):
  """DINOv2-g's SwiGLU MLP with LayerScale, unrolled and scanned with remat
  (parameters stacked by `files.scan_like`)."""
  model = models.get_model('DINOv2-testing', num_classes=3, transformer=(
      _transformer('DINOv2-testing', swiglu=True, scan=scan,
                   remat_policy=remat)))
  x = _images((28, 28))
  unrolled = models.get_model('DINOv2-testing', num_classes=3, transformer=(
      _transformer('DINOv2-testing', swiglu=True)))
  params = _params(unrolled, x)
  block = params['Transformer']['encoderblock_0']
  assert block['MlpBlock_0']['Dense_0']['kernel'].shape == (32, 2 * 64)
  assert block['MlpBlock_0']['Dense_1']['kernel'].shape == (64, 32)
  expected = _reference(x, params, 14, swiglu=True)
  if scan:
    params = files.scan_like(params, _params(model, x))
  _check(model, params, x, expected)


def test_unpooled_outputs_exclude_registers():
  model = models.get_model('DINOv2-testing-reg4', num_classes=None,
                           classifier='unpooled')
  x = _images((28, 42))
  params = _params(model, x)
  assert 'cls' not in params
  expected = _reference(x, params, 14, classifier='unpooled',
                        posemb_prefix=False)
  assert expected.shape == (2, 6, 32)
  _check(model, params, x, expected)


def _token_unpooled(name='DINOv2-testing-reg4', **kw):
  return models.get_model(name, num_classes=None, classifier='token_unpooled',
                          **kw)


def test_keep_all_patches_in_order_changes_nothing():
  model = _token_unpooled()
  x = _images((28, 42))
  params = _params(model, x)
  keep = np.tile(np.arange(6), (2, 1))
  full = model.apply({'params': params}, x, train=False)
  kept = model.apply({'params': params}, x, train=False, keep=keep)
  assert full.shape == (2, 1 + 6, 32)
  np.testing.assert_allclose(kept, full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('name,registers,posemb_prefix', [
    ('DINOv2-testing-reg4', 4, False), ('DINOv2-testing', 0, True),
    ('DINOv2-testing', 2, True)])
def test_keep_a_subset(name, registers, posemb_prefix):
  """Different patches per image, out of order: position embeddings are
  those of the kept patches, and only they go through the blocks; the
  prefix (class, registers) always first."""
  model = _token_unpooled(name, num_registers=registers)
  x = _images((42, 42))
  params = _params(model, x)
  keep = np.array([[8, 0, 4], [1, 2, 7]])
  expected = _reference(x, params, 14, classifier='token_unpooled',
                        posemb_prefix=posemb_prefix, keep=keep)
  assert expected.shape == (2, 1 + 3, 32)
  _check(model, params, x, expected, keep=keep)


@pytest.mark.parametrize('kw,keep,match', [
    (dict(posemb='relative'), np.zeros((2, 3), np.int32), 'relative'),
    ({}, np.zeros((2, 3, 1), np.int32), r'keep must be \(batch, k\)'),
    ({}, np.zeros((1, 3), np.int32), 'batch 2'),
    ({}, np.zeros((2, 10), np.int32), 'k <= 9'),
    ({}, np.zeros((2, 3), np.float32), 'integer'),
])
def test_keep_refused(kw, keep, match):
  model = models.get_model('DINOv2-testing', num_classes=None, **kw)
  with pytest.raises(ValueError, match=match):
    jax.eval_shape(lambda: model.init(jax.random.key(0),
                                      jnp.zeros((2, 42, 42, 3)), train=False,
                                      keep=keep))


# Parameters.


def test_layerscale_and_register_initialization():
  model = models.get_model('DINOv2-testing-reg4', num_classes=None)
  params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 3)),
                      train=False)['params']
  block = params['Transformer']['encoderblock_1']
  assert set(block) == {'LayerNorm_0', 'MultiHeadDotProductAttention_0',
                        'LayerNorm_1', 'MlpBlock_0', 'ls1', 'ls2'}
  for ls in ('ls1', 'ls2'):
    np.testing.assert_array_equal(block[ls]['scale'],
                                  np.full(32, 1e-5, np.float32))
  assert 0 < np.abs(params['reg']).max() < 1e-5  # normal(stddev=1e-6)


@pytest.mark.parametrize('name,size,num_classes,count', [
    # Unchanged: the original release's and timm's DeiT counts.
    ('ViT-B_16', 224, 1000, 86_567_656),
    ('DeiT-S_16', 224, 1000, 22_050_664),
    ('DeiT-B_16-distilled', 224, 1000, 87_338_192),
    # timm's counts (timm 1.0.31) of vit_small_patch14_dinov2,
    # vit_small_patch14_reg4_dinov2, deit3_small_patch16_224 and
    # vit_base_patch16_224.mae, at their default sizes and heads.
    ('DINOv2-S_14', 518, None, 22_056_192),
    ('DINOv2-S_14-reg4', 518, None, 22_057_344),
    ('DeiT3-S_16', 224, 1000, 22_059_496),
    ('MAE-B_16', 224, None, 85_798_656),
])
def test_param_counts(name, size, num_classes, count):
  model = models.get_model(name, num_classes=num_classes)
  assert models.count_params(model, (1, size, size, 3)) == count


@pytest.mark.parametrize('name,prefix,table_prefix', [
    ('DINOv2-S_14', 1, 1), ('DINOv2-S_14-reg4', 5, 0), ('DeiT3-S_16', 1, 0),
    ('MAE-B_16', 1, 1), ('ViT-B_16-gap-norep', 0, 0),
])
def test_prefix_tokens(name, prefix, table_prefix):
  config = models.MODEL_CONFIGS[name]
  assert models_vit.num_prefix_tokens(config) == prefix
  assert models_vit.posemb_prefix_tokens(config) == table_prefix
  assert models_vit.has_class_token(config) == (name != 'ViT-B_16-gap-norep')


def test_registers_without_class_token():
  config = {'classifier': 'unpooled', 'num_registers': 4}
  assert models_vit.num_prefix_tokens(config) == 4
  assert not models_vit.has_class_token(config)


# Presets.


@pytest.mark.parametrize('name,source,resolution', [
    ('DINOv2-g_14-reg4', 'timm', 518), ('DeiT3-H_14', 'timm', 224),
    ('MAE-L_16', 'timm', 224), ('DeiT-S_16', 'timm', 224),
    ('ViT-B_16', 'google', 224), ('R50+ViT-B_16', 'google', 224),
    ('Mixer-B_16', 'google', None), ('BiT-R50x1', 'google', None),
])
def test_weights_source(name, source, resolution):
  assert registry.weights_source(name) == source
  assert registry.native_resolution(name) == resolution
  imagenet = registry.NORMALIZATIONS['imagenet']
  assert (registry.input_normalization(name) == imagenet) == (
      source == 'timm')
  assert registry.posemb_resize_method(name) == (
      'bicubic_antialias' if source == 'timm' else 'bicubic')


def test_preset_options():
  for name, config in models.MODEL_CONFIGS.items():
    if registry.model_class(name) is models.LitModel:
      continue  # two towers: their image towers are presets checked here
    family = registry.family(name).name
    if family in ('Swin', 'SAM'):  # their own models: flat configs
      assert not config.gelu_approximate, name
    elif registry.weights_source(name) == 'timm':
      assert not config.transformer.gelu_approximate, name
      # EVA-02 and DINOv3 keep a class token and pool the patches, as timm;
      # AIMv2 and VideoMAE pool the patches without one; Perception
      # Encoder's Core has its MAP head, its G no class token.
      assert config.classifier in ('token', 'distilled', 'token_gap') + (
          ('gap',) if family in ('AIMv2', 'VideoMAE') else ()) + (
              ('token_map', 'map', 'gap') if family.startswith('PE ') else
              ()), name
      assert config.transformer.dropout_rate == 0, name
  get = models.MODEL_CONFIGS.get
  assert get('DINOv2-g_14').transformer.swiglu
  assert not get('DINOv2-L_14').transformer.swiglu
  assert get('DINOv2-B_14').transformer.layerscale_init == 1e-5
  assert get('DINOv2-B_14-reg4').num_registers == 4
  assert not get('DINOv2-B_14-reg4').posemb_prefix
  assert get('DeiT3-M_16').transformer.layerscale_init == 1e-6
  assert not get('DeiT3-M_16').posemb_prefix
  assert get('MAE-H_14').transformer.layerscale_init is None
  assert get('ViT-B_16').transformer.gelu_approximate


# Checkpoints.


@pytest.mark.parametrize('name,prefix', [('DINOv2-testing', 1),
                                         ('DINOv2-testing-reg4', 0)])
def test_checkpoint_resized_as_timm(tmp_path, name, prefix):
  """Saved at 2x2 patches, loaded at 3x3: the prefix entries of the table
  (none without them) kept, the grid resized with timm's antialiased
  bicubic; LayerScale and registers keep their names through the file."""
  small = models.get_model(name, num_classes=None)
  params = _params(small, _images((28, 28), n=1))
  path = tmp_path / 'dinov2.npz'
  files.save(params, path)
  config = models.MODEL_CONFIGS[name]
  assert loading.image_size(files.read_params(path), config) == 28
  assert loading.default_resize_method(config) == 'bicubic_antialias'
  model = models.get_model(name, num_classes=None)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 42, 42, 3)), train=False))['params']
  loaded = loading.load_params(path, init_params=shapes, model_config=config)
  old = params['Transformer']['posembed_input']['pos_embedding']
  new = loaded['Transformer']['posembed_input']['pos_embedding']
  assert new.shape == (1, prefix + 9, 32)
  np.testing.assert_array_equal(new[:, :prefix], old[:, :prefix])
  grid = posemb_resize.resize_posemb_grid(
      old[:, prefix:], new_grid=(3, 3), has_class_token=False,
      method='bicubic_antialias')
  np.testing.assert_allclose(new[:, prefix:], grid, rtol=1e-6)
  block = loaded['Transformer']['encoderblock_0']
  saved = params['Transformer']['encoderblock_0']
  np.testing.assert_array_equal(block['ls2']['scale'], saved['ls2']['scale'])
  if 'reg' in params:
    np.testing.assert_array_equal(loaded['reg'], params['reg'])


def test_default_resize_method_of_google_and_custom_models():
  assert loading.default_resize_method(
      models.MODEL_CONFIGS['ViT-B_16']) == 'bicubic'
  assert loading.default_resize_method({'model_name': 'mine'}) == 'bicubic'
  assert loading.default_resize_method({}) == 'bicubic'
