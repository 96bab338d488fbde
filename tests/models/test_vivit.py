"""`models.vivit`: ViViT's parameter tree (Scenic's names), its tubelet
embedding and position tables against numpy, its two encoders against the
ViT `Encoder` applied by hand, its intermediates, its presets' sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import random_params
from vit_jax import models
from vit_jax.models import registry
from vit_jax.models import vivit
from vit_jax.models.encoder import Encoder

VIDEO = (2, 4, 8, 12, 3)  # T' = 2 slots of a 2x3 grid (tubelet 2x4x4)


def _model(name='ViViT-testing', **kw):
  kw.setdefault('num_classes', 5)
  return models.get_model(name, **kw)


def _video(seed=0, shape=VIDEO):
  return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def _params(model, seed=0):
  return random_params(model, jnp.zeros(VIDEO), train=False, seed=seed,
                       scale=0.3)


def _shapes(tree):
  return {'/'.join(k.key for k in path): tuple(x.shape)
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def test_unfactorised_parameters():
  shapes = _shapes(_params(_model()))
  assert shapes['embedding/kernel'] == (2, 4, 4, 3, 32)
  assert shapes['cls'] == (1, 1, 32)
  assert shapes['Transformer/posembed_input/pos_embedding'] == (1, 13, 32)
  assert shapes['Transformer/encoderblock_1/MlpBlock_0/Dense_0/kernel'] == (
      32, 64)
  assert shapes['Transformer/encoder_norm/scale'] == (32,)
  assert shapes['head/kernel'] == (32, 5)
  assert {k.split('/')[0] for k in shapes} == {
      'embedding', 'cls', 'Transformer', 'head'}


def test_separate_table_parameters():
  shapes = _shapes(_params(_model(temporal_posemb='separate')))
  assert shapes['Transformer/posembed_input/pos_embedding'] == (1, 7, 32)
  assert shapes['Transformer/posembed_input/pos_embedding_time'] == (1, 2, 32)
  assert 'Transformer/encoderblock_0/LayerNorm_0/scale' in shapes


def test_factorised_parameters():
  shapes = _shapes(_params(_model('ViViT-testing-FE')))
  assert {k.split('/')[0] for k in shapes} == {
      'embedding', 'cls_SpatialTransformer', 'SpatialTransformer',
      'cls_TemporalTransformer', 'TemporalTransformer', 'head'}
  assert shapes['SpatialTransformer/posembed_input/pos_embedding'] == (
      1, 7, 32)
  assert shapes['TemporalTransformer/posembed_input/pos_embedding'] == (
      1, 3, 32)
  assert 'SpatialTransformer/encoderblock_1/LayerNorm_1/bias' in shapes
  assert 'TemporalTransformer/encoderblock_0/LayerNorm_1/bias' in shapes
  assert 'TemporalTransformer/encoderblock_1/LayerNorm_1/bias' not in shapes


def _embed_numpy(video, kernel, bias):
  """The tubelet embedding as an einsum over non-overlapping tubelets:
  (batch, T', h, w, D)."""
  t, p, q, c, d = kernel.shape
  b, frames, height, width, _ = video.shape
  x = video.reshape(b, frames // t, t, height // p, p, width // q, q, c)
  return np.einsum('bsthiwjc,tijcd->bshwd', x, kernel) + bias


def _captured(model, params, video, name, **kw):
  """The output of submodule `name`'s first call."""
  _, state = model.apply({'params': params}, video, train=False,
                         capture_intermediates=lambda m, _: m.name == name,
                         mutable=['intermediates'], **kw)
  return np.asarray(state['intermediates'][name]['__call__'][0])


def test_tubelet_embedding_against_numpy():
  model = _model()
  params, video = _params(model), _video()
  got = _captured(model, params, video, 'embedding')
  want = _embed_numpy(video.astype(np.float64), params['embedding']['kernel'],
                      params['embedding']['bias'])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_separate_position_table_against_numpy():
  """Patch token (t, i) gets spatial entry 1 + i plus temporal entry t; the
  class token spatial entry 0."""
  rng = np.random.default_rng(0)
  slots, patches, d = 3, 4, 6
  space = rng.normal(size=(1, 1 + patches, d)).astype(np.float32)
  time = rng.normal(size=(1, slots, d)).astype(np.float32)
  x = rng.normal(size=(2, 1 + slots * patches, d)).astype(np.float32)
  got = vivit.SeparatePositionEmbs().apply(
      {'params': {'pos_embedding': space, 'pos_embedding_time': time}}, x,
      slots, 1)
  want = x.copy()
  want[:, 0] += space[0, 0]
  for t in range(slots):
    for i in range(patches):
      want[:, 1 + t * patches + i] += space[0, 1 + i] + time[0, t]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def _encoder(config, params, tokens):
  """A ViT `Encoder` of a preset's `config`, applied by hand."""
  return np.asarray(Encoder(**config).apply({'params': params}, tokens,
                                            train=False))


def _head(params, x):
  return x @ params['head']['kernel'] + params['head']['bias']


def test_unfactorised_is_one_encoder_over_all_tokens():
  """Class token, then the tokens in (slot, row, column) order, through
  one encoder with one joint table; the class token's output is pooled."""
  model = _model()
  params, video = _params(model), _video()
  config = models.MODEL_CONFIGS['ViViT-testing'].transformer.to_dict()
  tokens = _embed_numpy(video, params['embedding']['kernel'],
                        params['embedding']['bias']).reshape(2, 12, 32)
  cls = np.tile(params['cls'], (2, 1, 1))
  out = _encoder(config, params['Transformer'],
                 np.concatenate([cls, tokens], axis=1).astype(np.float32))
  got = model.apply({'params': params}, video, train=False)
  np.testing.assert_allclose(got, _head(params, out[:, 0]), rtol=1e-4,
                             atol=1e-5)


def test_factorised_encodes_each_slot_then_the_slots():
  """A spatial encoder on each slot alone (its class token pooled), then a
  temporal encoder over the slots' pooled tokens after its class token."""
  model = _model('ViViT-testing-FE')
  params, video = _params(model), _video()
  preset = models.MODEL_CONFIGS['ViViT-testing-FE']
  tokens = _embed_numpy(video, params['embedding']['kernel'],
                        params['embedding']['bias']).reshape(2, 2, 6, 32)
  cls = np.tile(params['cls_SpatialTransformer'], (2, 1, 1))
  pooled = [_encoder(preset.transformer.to_dict(),
                     params['SpatialTransformer'],
                     np.concatenate([cls, tokens[:, t]], 1).astype(
                         np.float32))[:, 0] for t in range(2)]
  cls = np.tile(params['cls_TemporalTransformer'], (2, 1, 1))
  out = _encoder(preset.temporal_transformer.to_dict(),
                 params['TemporalTransformer'],
                 np.concatenate([cls, np.stack(pooled, 1)], 1))
  got = model.apply({'params': params}, video, train=False)
  np.testing.assert_allclose(got, _head(params, out[:, 0]), rtol=1e-4,
                             atol=1e-5)


@pytest.mark.parametrize('name', ['ViViT-testing', 'ViViT-testing-FE'])
def test_gap_and_pre_logits(name):
  model = _model(name, classifier='gap', representation_size=7)
  params = _params(model)
  assert 'cls' not in params and 'cls_SpatialTransformer' not in params
  assert params['pre_logits']['kernel'].shape == (32, 7)
  features = _model(name, classifier='gap', representation_size=7,
                    num_classes=None).apply({'params': {
                        k: v for k, v in params.items() if k != 'head'}},
                                            _video(), train=False)
  assert features.shape == (2, 7) and np.all(np.abs(features) < 1)


def test_intermediates_of_the_unfactorised_encoder():
  """The last block, normed, is the final tokens; a patch map's (t, i, j)
  is token 1 + t·h·w + i·w + j."""
  model = _model()
  params, video = _params(model), _video()
  final, taken = model.apply({'params': params}, video, indices=[0, -1],
                             norm=True, return_prefix_tokens=True,
                             method='forward_intermediates')
  assert final.shape == (2, 13, 32)
  (first, first_cls), (last, last_cls) = taken
  assert first.shape == last.shape == (2, 2, 2, 3, 32)
  np.testing.assert_allclose(last[:, 1, 0, 2], final[:, 1 + 6 + 2],
                             rtol=1e-6)
  np.testing.assert_allclose(last_cls[:, 0], final[:, 0], rtol=1e-6)
  only = model.apply({'params': params}, video, indices=[0], output_fmt='NLC',
                     norm=True, intermediates_only=True,
                     method='forward_intermediates')
  np.testing.assert_allclose(only[0], first.reshape(2, 12, 32), rtol=1e-6)


def test_intermediates_of_the_factorised_encoder():
  """The spatial encoder's blocks, a map per slot and a class token per
  slot; the temporal encoder does not run for intermediates only."""
  model = _model('ViViT-testing-FE')
  params, video = _params(model), _video()
  final, taken = model.apply({'params': params}, video, indices=1,
                             return_prefix_tokens=True,
                             method='forward_intermediates')
  assert final.shape == (2, 3, 32)  # the temporal encoder's tokens
  (patches, cls), = taken
  assert patches.shape == (2, 2, 2, 3, 32) and cls.shape == (2, 2, 32)
  del params['TemporalTransformer']
  only = model.apply({'params': params}, video, indices=1,
                     intermediates_only=True, method='forward_intermediates')
  np.testing.assert_allclose(only[0], patches, rtol=1e-6)


@pytest.mark.parametrize('kw, match', [
    (dict(encoder='axial'), 'Unknown encoder'),
    (dict(classifier='map'), "a ViViT takes one of \\('token', 'gap'\\)"),
    (dict(temporal_posemb='rope3d'), 'Unknown temporal_posemb'),
    (dict(encoder='factorised'), 'needs temporal_transformer'),
])
def test_refused_configs(kw, match):
  with pytest.raises(ValueError, match=match):
    _params(_model(**kw))


def test_factorised_tables_are_separate():
  with pytest.raises(ValueError, match="temporal_posemb='joint' is for"):
    _params(_model('ViViT-testing-FE', temporal_posemb='joint'))


@pytest.mark.parametrize('shape', [(1, 3, 8, 8, 3), (1, 4, 8, 6, 3),
                                   (1, 4, 8, 8)])
def test_refused_videos(shape):
  with pytest.raises(ValueError, match='tubelet 2x4x4|Expected videos'):
    _model().init(jax.random.key(0), jnp.zeros(shape), train=False)


# Kinetics-400 at 32 frames of 224 px (`families.vivit`'s docstring).
KINETICS_SIZES = {'ViViT-B_16x2': 88_954_000, 'ViViT-B_16x2-FE': 115_062_928}


@pytest.mark.parametrize('name', sorted(KINETICS_SIZES))
def test_kinetics_param_counts(name):
  model = _model(name, num_classes=400)
  assert models.count_params(model, (1, 32, 224, 224, 3)) == (
      KINETICS_SIZES[name])


def test_kinetics_count_by_hand():
  """ViT-B/16's 86_567_656 at 1000 classes, less its head and 197-entry
  table, plus the tubelet's second frame, the 1 + 16·196 table and a
  400-class head."""
  vit_b = 86_567_656 - (768 * 1000 + 1000) - 197 * 768
  assert vit_b + 16 * 16 * 3 * 768 + 3137 * 768 + 768 * 400 + 400 == (
      KINETICS_SIZES['ViViT-B_16x2'])


@pytest.mark.parametrize('name', ['ViViT-testing', 'ViViT-testing-FE'])
def test_custom_config_is_a_vivit(name):
  config = models.MODEL_CONFIGS[name].to_dict()
  assert registry.family('my-video-model', config).name == 'ViViT'
  assert registry.family(name).model is vivit.ViViT
