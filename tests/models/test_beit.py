"""BEiT's relative position tables (`transformer.relative_bias`): the index
against timm's layout, the bias in the attention logits, with scan, remat,
the mask token and intermediates, what it refuses, and the presets."""

import jax
import numpy as np
import pytest

from tests.helpers import layernorm
from tests.helpers import random_params
from vit_jax.checkpoints import files
from vit_jax import models
from vit_jax.models import posemb

TOL = dict(rtol=1e-5, atol=1e-5)
IMAGES = np.random.default_rng(0).uniform(-1, 1, (2, 48, 64, 3)).astype(
    np.float32)  # a 3x4 grid of 16 px patches


def _timm_index(wh, ww):
  """timm beit's `gen_relative_position_index`, line for line in numpy."""
  num_relative_distance = (2 * wh - 1) * (2 * ww - 1) + 3
  window_area = wh * ww
  coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww),
                                indexing='ij'))  # 2, Wh, Ww
  coords_flatten = coords.reshape(2, -1)  # 2, Wh*Ww
  relative_coords = coords_flatten[:, :, None] - coords_flatten[:, None, :]
  relative_coords = relative_coords.transpose(1, 2, 0).copy()
  relative_coords[:, :, 0] += wh - 1  # shift to start from 0
  relative_coords[:, :, 1] += ww - 1
  relative_coords[:, :, 0] *= 2 * ww - 1
  index = np.zeros((window_area + 1,) * 2, relative_coords.dtype)
  index[1:, 1:] = relative_coords.sum(-1)
  index[0, 0:] = num_relative_distance - 3
  index[0:, 0] = num_relative_distance - 2
  index[0, 0] = num_relative_distance - 1
  return index


@pytest.mark.parametrize('grid', [(1, 1), (2, 2), (3, 4), (14, 14), (5, 2)])
def test_index_is_timms(grid):
  np.testing.assert_array_equal(posemb.relative_bias_index(grid),
                                _timm_index(*grid))


def _model(relative_bias='block', **transformer):
  return models.get_model(
      'BEiT-testing', num_classes=5,
      transformer=dict(models.MODEL_CONFIGS['BEiT-testing'].transformer,
                       relative_bias=relative_bias, **transformer))


def _apply(model, params, images=IMAGES, **kw):
  return np.asarray(model.apply({'params': params}, images, train=False,
                                **kw))


@pytest.mark.parametrize('relative_bias,name', [
    ('block', 'Transformer/encoderblock_1/relative_bias/table'),
    ('shared', 'Transformer/relative_bias/table')])
def test_the_table_and_its_rows(relative_bias, name):
  """The table, ((2h - 1)(2w - 1) + 3, heads), zeros at init as timm's,
  read by `relative_bias_index`: the bias of query i and key j of head h is
  table[index[i, j], h]."""
  model = _model(relative_bias)
  init = model.init(jax.random.key(0), IMAGES, train=False)['params']
  flat = files.published_flat(init)
  assert flat[name].shape == (5 * 7 + 3, 2)
  assert not flat[name].any()
  assert len([k for k in flat if k.endswith('relative_bias/table')]) == (
      2 if relative_bias == 'block' else 1)
  table = np.random.default_rng(1).normal(size=(38, 2)).astype(np.float32)
  bias = posemb.RelativeBiasTable(2).apply({'params': {'table': table}},
                                           (3, 4), 13)
  index = _timm_index(3, 4)
  assert bias.shape == (1, 2, 13, 13)
  for h, i, j in np.ndindex(2, 13, 13):
    assert bias[0, h, i, j] == table[index[i, j], h]


def test_bias_added_to_the_scaled_logits():
  """A block's attention weights are softmax(q k / sqrt(d) + bias): the
  table's bias added after the query is scaled, as timm's Attention adds
  it; the key has no bias."""
  block = models.vit.Encoder1DBlock(mlp_dim=8, num_heads=2, dropout_rate=0.,
                                    attention_dropout_rate=0.,
                                    relative_bias=True, qkv_bias='qv')
  x = np.random.default_rng(2).normal(size=(2, 7, 8)).astype(np.float32)
  params = random_params(block, x, True, (2, 3))
  _, state = block.apply({'params': params}, x, True, (2, 3),
                         mutable=['intermediates'])
  p = params['MultiHeadDotProductAttention_0']
  y = layernorm(x, params['LayerNorm_0'])
  q = np.einsum('btd,dhk->bhtk', y, p['query']['kernel']) + (
      p['query']['bias'][None, :, None])
  k = np.einsum('btd,dhk->bhtk', y, p['key']['kernel'])
  table = params['relative_bias']['table']
  bias = table[_timm_index(2, 3)].transpose(2, 0, 1)
  logits = np.einsum('bhtk,bhsk->bhts', q / np.sqrt(4), k) + bias
  want = np.exp(logits - logits.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  got = state['intermediates']['MultiHeadDotProductAttention_0'][
      'attention_weights'][0]
  np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize('relative_bias', ['block', 'shared'])
def test_scan_and_remat_compute_the_same(relative_bias):
  """Scanned (the block tables stacked) and rematerialized, the logits and
  the gradients are the unrolled model's."""
  model = _model(relative_bias)
  params = random_params(model, IMAGES, train=False)
  want = _apply(model, params)
  for options in (dict(scan=True), dict(remat_policy='full'),
                  dict(scan=True, remat_policy='dots')):
    other = _model(relative_bias, **options)
    stacked = (files.scan_like(params, {'Transformer': {'encoderblock': {}}})
               if options.get('scan') else params)
    np.testing.assert_allclose(_apply(other, stacked), want, **TOL)
  loss = lambda m, p: m.apply({'params': p}, IMAGES, train=False).sum()
  grads = jax.grad(lambda p: loss(model, p))(params)
  scanned = _model(relative_bias, scan=True, remat_policy='full')
  stacked = files.scan_like(params, {'Transformer': {'encoderblock': {}}})
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL),
               jax.grad(lambda p: loss(scanned, p))(stacked),
               files.scan_like(grads, stacked))


@pytest.mark.parametrize('scan', [False, True])
def test_mask_token(scan):
  """BEiT's pretraining input: masked patches replaced by `mask_token`
  before the blocks; an empty mask changes nothing."""
  model = _model('shared', scan=scan)
  mask = np.zeros((2, 12), bool)
  params = random_params(model, IMAGES, train=False, mask=mask)
  assert params['mask_token'].shape == (1, 1, 32)
  plain = dict(params)
  del plain['mask_token']
  np.testing.assert_allclose(_apply(model, params, mask=mask),
                             _apply(model, plain), **TOL)
  mask[0, [0, 5]] = True
  masked = _apply(model, params, mask=mask)
  np.testing.assert_allclose(masked[1], _apply(model, plain)[1], **TOL)
  assert np.abs(masked[0] - _apply(model, plain)[0]).max() > 1e-3


def test_forward_intermediates():
  """Each block's patch map; the last one, through fc_norm's absence, is the
  tokens the head pools."""
  model = _model('block')
  params = random_params(model, IMAGES, train=False)
  final, maps = model.apply({'params': params}, IMAGES,
                            method=model.forward_intermediates)
  assert [m.shape for m in maps] == [(2, 3, 4, 32)] * 2
  np.testing.assert_allclose(maps[-1].reshape(2, 12, 32), final[:, 1:],
                             **TOL)
  only = model.apply({'params': params}, IMAGES, indices=[0],
                     intermediates_only=True,
                     method=model.forward_intermediates)
  np.testing.assert_allclose(only[0], maps[0], **TOL)


def test_what_it_refuses():
  model = _model('block')
  params = random_params(model, IMAGES, train=False)
  with pytest.raises(ValueError, match="keep= cannot be used with "
                     "relative_bias='block'"):
    model.apply({'params': params}, IMAGES, train=False,
                keep=np.zeros((2, 4), np.int32))
  with pytest.raises(ValueError, match='one class token'):
    models.get_model('BEiT-testing', num_classes=5, classifier='gap').init(
        jax.random.key(0), IMAGES, train=False)
  with pytest.raises(ValueError, match='Unknown relative_bias'):
    _model('both').init(jax.random.key(0), IMAGES, train=False)
  with pytest.raises(ValueError, match='two relative position biases'):
    models.get_model('BEiT-testing', num_classes=5, posemb='relative').init(
        jax.random.key(0), IMAGES, train=False)
  # The table of a 3x4 grid at a 4x4 one: resize it when loading.
  with pytest.raises(ValueError, match='resize_relative_table'):
    model.apply({'params': params}, np.zeros((1, 64, 64, 3)), train=False)


@pytest.mark.parametrize('name,layerscale,mean', [
    ('BEiT-B_16', 0.1, 0.5), ('BEiT-L_16', 1e-5, 0.5),
    ('BEiTv2-B_16', 1e-5, 0.485)])
def test_presets(name, layerscale, mean):
  """timm's beit[v2]_*_patch16_224: erf GELU, eps 1e-6, its LayerScale, q
  and v biases, a table per block, no position table, the class token
  kept and the patch mean pooled with fc_norm; BEiT's inputs in [-1, 1],
  BEiT v2's ImageNet's."""
  config = models.MODEL_CONFIGS[name]
  assert (config.classifier, config.fc_norm, config.posemb) == (
      'token_gap', True, 'none')
  t = config.transformer
  eps = t.get('layer_norm_eps', models.vit.Encoder.layer_norm_eps)
  assert (t.gelu_approximate, eps, t.layerscale_init,
          t.qkv_bias, t.relative_bias) == (False, 1e-6, layerscale, 'qv',
                                           'block')
  assert models.registry.input_normalization(name)[0][0] == mean
  assert models.registry.family(name).timm_layout == 'beit'
