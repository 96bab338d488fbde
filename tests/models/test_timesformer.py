"""TimeSformer (`models.timesformer`): a block of each attention scheme
against numpy, transformers' TimesformerForVideoClassification converted
with no flags against its logits (scripts/make_timesformer_golden.py), and
the model inflated from an image ViT."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import numpy as safetensors_numpy
from scipy import special

from tests import helpers
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.checkpoints import inflate
from vit_jax.convert import converter
from vit_jax.models import timesformer

GOLDEN = os.path.join(helpers.ROOT, 'tests', 'data', 'transformers_video')


# Numpy, from the paper's equations (Bertasius et al., 2021, Sec. 3) with
# the class token as its code and transformers' TimesformerLayer take it:
# not in the temporal attention; copied into each frame's spatial
# attention, its outputs averaged over the frames.


def _attention(x, p):
  """Multi-head self-attention of (..., L, D) `x` by flax's parameters."""
  q, k, v = (np.einsum('...ld,dhk->...hlk', x, p[n]['kernel']) +
             p[n]['bias'][:, None] for n in ('query', 'key', 'value'))
  logits = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
  weights = special.softmax(logits, axis=-1)
  return np.einsum('...hlk,hkd->...ld', weights @ v, p['out']['kernel']) + (
      p['out']['bias'])


def _mlp(x, p):
  h = x @ p['Dense_0']['kernel'] + p['Dense_0']['bias']
  h = 0.5 * h * (1 + special.erf(h / np.sqrt(2)))  # exact GELU
  return h @ p['Dense_1']['kernel'] + p['Dense_1']['bias']


def _block(cls, x, p, attention_type):
  """One block on the class token(s) `cls` (N, k, D) and patches `x`
  (N, T, P, D)."""
  ln = helpers.layernorm
  n, t, s, d = x.shape
  if attention_type == 'divided_space_time':
    # Temporal: patch (p, t) attends to (p, t') for every frame t'.
    xt = np.swapaxes(x, 1, 2)  # (N, P, T, D)
    y = _attention(ln(xt, p['temporal_norm']), p['temporal_attention'])
    y = y @ p['temporal_dense']['kernel'] + p['temporal_dense']['bias']
    x = x + np.swapaxes(y, 1, 2)
    # Spatial: within frame t, with the class token's copy.
    xs = np.concatenate([np.repeat(cls[:, None], t, axis=1), x], axis=2)
    y = _attention(ln(xs, p['LayerNorm_0']),
                   p['MultiHeadDotProductAttention_0'])
    cls = cls + y[:, :, 0].mean(axis=1)[:, None]
    tokens = np.concatenate([cls, (x + y[:, :, 1:]).reshape(n, t * s, d)], 1)
  elif attention_type == 'joint_space_time':
    tokens = np.concatenate([cls, x.reshape(n, t * s, d)], axis=1)
    tokens = tokens + _attention(ln(tokens, p['LayerNorm_0']),
                                 p['MultiHeadDotProductAttention_0'])
  else:  # space_only: every frame on its own, a class token each
    tokens = np.concatenate([cls[:, :, None], x], axis=2)
    tokens = tokens + _attention(ln(tokens, p['LayerNorm_0']),
                                 p['MultiHeadDotProductAttention_0'])
  tokens = tokens + _mlp(ln(tokens, p['LayerNorm_1']), p['MlpBlock_0'])
  if attention_type == 'space_only':
    return tokens[:, :, 0], tokens[:, :, 1:]
  k = cls.shape[1]
  return tokens[:, :k], tokens[:, k:].reshape(n, t, s, d)


@pytest.mark.parametrize('attention_type', timesformer.ATTENTION_TYPES)
def test_block_equals_numpy(attention_type):
  """Random parameters (the zero temporal_dense too), 3 frames of 4
  patches, 2 heads of 8."""
  block = timesformer.TimeSformerBlock(mlp_dim=24, num_heads=2,
                                       attention_type=attention_type,
                                       gelu_approximate=False)
  rng = np.random.default_rng(0)
  k = 3 if attention_type == 'space_only' else 1
  cls = rng.normal(size=(2, k, 16)).astype(np.float32)
  x = rng.normal(size=(2, 3, 4, 16)).astype(np.float32)
  params = helpers.random_params(block, cls, x, True)
  got = block.apply({'params': params}, cls, x, True)
  want = _block(cls, x, jax.tree.map(np.float64, params), attention_type)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
  # The class token took part: not the token alone through the MLP.
  assert np.abs(np.asarray(got[0]) - cls).max() > 0.1


@pytest.fixture(scope='module')
def golden():
  with np.load(os.path.join(GOLDEN, 'timesformer_golden.npz')) as f:
    return dict(f)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """The golden folder converted as `python -m vit_jax.convert SRC DST`
  does, no flags."""
  dst = str(tmp_path_factory.mktemp('ts') / 'timesformer.npz')
  name = converter.convert(os.path.join(GOLDEN, 'timesformer'), dst)
  return name, dst


def test_converts_with_no_flags_and_records_the_eval_transform(converted):
  name, dst = converted
  assert name == 'TimeSformer-testing'  # its shapes and settings
  with open(dst[:-4] + '.transform.json') as f:
    record = json.load(f)
  assert record['num_frames'] == 4
  assert record['mean'] == [0.485, 0.456, 0.406]
  assert record['std'] == [0.229, 0.224, 0.225]
  assert record['interpolation'] == 'bilinear'
  assert (record['input_size'], record['crop_mode']) == ([3, 224, 224],
                                                         'center')
  assert models.MODEL_CONFIGS[name].transformer.gelu_approximate is False


def test_from_pretrained_gives_transformers_logits(converted, golden,
                                                   tmp_path, monkeypatch):
  """From the .npz; from the folder itself (converted into the cache),
  the same model and parameters."""
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path))
  loaded = models.from_pretrained(converted[1], image_size=32)
  assert isinstance(loaded.model, timesformer.TimeSformer)
  logits = jax.jit(lambda p, x: loaded.model.apply({'params': p}, x,
                                                   train=False))(
                                                       loaded.params,
                                                       golden['clip'])
  np.testing.assert_allclose(logits, golden['logits'], atol=1e-4, rtol=1e-4)
  folder = models.from_pretrained(os.path.join(GOLDEN, 'timesformer'),
                                  image_size=32)
  assert folder.model == loaded.model
  jax.tree.map(np.testing.assert_array_equal, folder.params, loaded.params)
  assert np.abs(golden['logits']).max() > 1  # not a trivial output


def test_unknown_attention_type_is_refused():
  model = timesformer.TimeSformer(
      num_classes=2, patches={'size': (8, 8)}, hidden_size=16,
      transformer=dict(num_layers=1, mlp_dim=16, num_heads=2),
      attention_type='axial')
  with pytest.raises(ValueError, match="attention_type 'axial'"):
    jax.eval_shape(lambda: model.init(jax.random.key(0),
                                      jnp.zeros((1, 2, 16, 16, 3)),
                                      train=False))


@pytest.fixture(scope='module')
def image_vit(tmp_path_factory):
  """A random image ViT (16 wide, 1 block, 8 px patches, 24 px images)
  saved as .npz, and its logits of one image."""
  vit = models.VisionTransformer(
      num_classes=3, patches={'size': (8, 8)}, hidden_size=16,
      transformer=dict(num_layers=1, mlp_dim=32, num_heads=2,
                       dropout_rate=0., attention_dropout_rate=0.))
  image = np.random.default_rng(1).normal(size=(1, 24, 24, 3)).astype(
      np.float32)
  params = helpers.random_params(vit, image, train=False)
  path = str(tmp_path_factory.mktemp('vit') / 'image.npz')
  files.save(params, path)
  return path, image, vit.apply({'params': params}, image, train=False)


@pytest.mark.parametrize('attention_type',
                         ['divided_space_time', 'space_only'])
def test_from_image_a_still_clip_gives_the_images_logits(attention_type,
                                                         image_vit):
  """The image ViT inflated: on 4 equal frames each block computes the
  image block's. (Not so joint attention's: there the class token is one
  key among 4 copies of each patch's.)"""
  path, image, want = image_vit
  config = dict(patches={'size': (8, 8)}, hidden_size=16,
                attention_type=attention_type,
                transformer=dict(num_layers=1, mlp_dim=32, num_heads=2,
                                 dropout_rate=0., attention_dropout_rate=0.))
  model = timesformer.TimeSformer(num_classes=3, **config)
  clip = np.repeat(image[:, None], 4, axis=1)
  init = model.init(jax.random.key(0), clip, train=False)['params']
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config, new_head=False)
  block = params['Transformer']['encoderblock_0']
  if attention_type == 'divided_space_time':
    assert not np.any(block['temporal_dense']['kernel'])
    np.testing.assert_array_equal(
        block['temporal_attention']['query']['kernel'],
        block['MultiHeadDotProductAttention_0']['query']['kernel'])
  got = model.apply({'params': params}, clip, train=False)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  # Frames that differ: the temporal parts see time.
  moving = clip * np.linspace(0.5, 1.5, 4)[None, :, None, None, None]
  assert np.abs(model.apply({'params': params}, moving, train=False) -
                want).max() > 1e-3


def test_layout_transformers_writes_the_folder_back(converted, tmp_path):
  """`--layout=transformers` of the converted golden: transformers'
  tensors, config and video processor's file as they were."""
  folder = str(tmp_path / 'back')
  assert converter.convert(converted[1], folder,
                           layout='transformers') == 'TimeSformer-testing'
  source = os.path.join(GOLDEN, 'timesformer')
  want = safetensors_numpy.load_file(os.path.join(source, 'model.safetensors'))
  got = safetensors_numpy.load_file(os.path.join(folder, 'model.safetensors'))
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7,
                               err_msg=key)
  configs = [json.load(open(os.path.join(f, 'config.json')))
             for f in (source, folder)]
  keys = ('architectures', 'num_frames', 'hidden_act', 'attention_type',
          'patch_size', 'num_attention_heads', 'layer_norm_eps')
  assert [{k: c[k] for k in keys} for c in configs][0] == {
      k: configs[1][k] for k in keys}
  with open(os.path.join(folder, 'video_preprocessor_config.json')) as f:
    processor = json.load(f)
  assert processor['image_mean'] == [0.485, 0.456, 0.406]
  assert processor['size'] == {'shortest_edge': 224}
