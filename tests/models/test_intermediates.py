"""`forward_intermediates`: timm's outputs on converted golden models (from
scripts/make_intermediates_golden.py, with torch and timm; these tests need
neither), scanned blocks, stopping early, the final output and bad input."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.models import backbone

DATA = helpers.DATA
GOLDEN = np.load(os.path.join(DATA, 'timm_intermediates_golden.npz'))
IMAGES = np.load(os.path.join(DATA, 'timm_ssl_golden.npz'))['images']
# name: (timm weights, image side); as the golden script's.
SOURCES = {
    'vit': ('timm_ssl/mae', 64),
    'dinov2_reg4': ('timm_ssl/dinov2_reg4', 56),
    'eva02': ('timm_families/eva02', 56),
    'swin': ('timm_swin.safetensors', 64),
    'mixer': ('timm_mixer.safetensors', 32),
}
INDICES = {'last': (2, 2), 'first': ([-2], [0, -3])}


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  folder = tmp_path_factory.mktemp('intermediates')
  out = {}
  for name, (source, side) in SOURCES.items():
    npz = str(folder / f'{name}.npz')
    convert.convert(os.path.join(DATA, source), npz)
    out[name] = models.from_pretrained(npz, image_size=side)
  return out


def _intermediates(pretrained, images, **kw):
  return pretrained.model.apply({'params': pretrained.params}, images,
                                method='forward_intermediates', **kw)


@pytest.mark.parametrize('norm', [False, True])
@pytest.mark.parametrize('setting', sorted(INDICES))
@pytest.mark.parametrize('name', sorted(SOURCES))
def test_equals_timms(converted, name, setting, norm):
  """timm's `forward_intermediates(x, indices, norm, intermediates_only)`,
  its NCHW maps as NHWC."""
  side = SOURCES[name][1]
  indices = INDICES[setting][name == 'swin']
  got = _intermediates(converted[name], IMAGES[:, :side, :side],
                       indices=indices, norm=norm, output_fmt='NHWC',
                       intermediates_only=True)
  key = f'{name}/{setting}{"_norm" if norm else ""}'
  want = [GOLDEN[f'{key}/{i}'] for i in range(len(got))]
  assert f'{key}/{len(got)}' not in GOLDEN  # as many maps as timm's
  for i, (g, w) in enumerate(zip(got, want)):
    # Unnormalized tokens grow to ~10: float32 rounding is relative.
    np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-5, err_msg=str(i))


def test_prefix_tokens_and_tokens(converted):
  """DINOv2 with registers: the class and register tokens, in timm's
  order; 'NLC' the patch tokens of the 'NHWC' maps, row-major."""
  pretrained = converted['dinov2_reg4']
  images = IMAGES[:, :56, :56]
  pairs = _intermediates(pretrained, images, indices=2, output_fmt='NLC',
                         return_prefix_tokens=True, intermediates_only=True)
  for i, (tokens, prefix) in enumerate(pairs):
    assert prefix.shape == (2, 5, 32)
    np.testing.assert_allclose(prefix, GOLDEN[f'dinov2_reg4/prefix/{i}'],
                               atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(
        tokens, GOLDEN[f'dinov2_reg4/last/{i}'].reshape(2, 16, 32),
        atol=1e-4, rtol=1e-5)


def test_final_output_is_the_encoders(converted):
  """intermediates_only=False: the tokens after every block and the final
  norm, as the model's unpooled output; Swin's final normed map."""
  pretrained = converted['vit']
  images = IMAGES[:, :64, :64]
  final, maps = _intermediates(pretrained, images, indices=[0])
  unpooled = pretrained.model.clone(classifier='token_unpooled')
  np.testing.assert_allclose(
      final, unpooled.apply({'params': pretrained.params}, images,
                            train=False), atol=1e-5)
  assert len(maps) == 1 and maps[0].shape == (2, 4, 4, 32)
  swin = converted['swin']
  final, _ = _intermediates(swin, images, indices=1)
  logits = swin.model.apply({'params': swin.params}, images, train=False)
  head = swin.params['head']
  np.testing.assert_allclose(
      final.mean(axis=(1, 2)) @ head['kernel'] + head['bias'], logits,
      atol=1e-4)


def _without(params, block):
  return {**params, 'Transformer': {
      k: v for k, v in params['Transformer'].items() if k != block}}


def test_stops_after_the_last_block_asked_for():
  """The first block's map needs no later block's parameters; the run to
  the end does."""
  model = models.get_model('testing', num_classes=3)
  model = model.clone(transformer={**model.transformer, 'num_layers': 3})
  images = jnp.asarray(IMAGES[:1, :32, :32])
  params = model.init(jax.random.PRNGKey(0), images, train=False)['params']
  params = jax.tree.map(lambda p: p + 0.1, params)  # zero-init off
  depth = model.transformer['num_layers']
  assert depth >= 2
  full = _intermediates(models.Pretrained(model, params, None), images,
                        indices=[0], intermediates_only=True)
  cut = _without(params, f'encoderblock_{depth - 1}')
  early = _intermediates(models.Pretrained(model, cut, None), images,
                         indices=[0], intermediates_only=True)
  np.testing.assert_array_equal(early[0], full[0])
  with pytest.raises(Exception, match=f'encoderblock_{depth - 1}'):
    _intermediates(models.Pretrained(model, cut, None), images, indices=[0])


def test_scanned_blocks_give_the_same_maps():
  """`scan=True`: its stacked parameters give the unrolled model's maps,
  cut short or run to the end."""
  model = models.get_model('DINOv2-testing-reg4', num_classes=0)
  images = jnp.asarray(IMAGES[:, :56, :56])
  params = model.init(jax.random.PRNGKey(0), images, train=False)['params']
  scanned = model.clone(transformer={**model.transformer, 'scan': True})
  scanned_params = files.scan_like(
      params, scanned.init(jax.random.PRNGKey(1), images,
                           train=False)['params'])
  for indices, only in (([0], True), (2, False), ([-1, 0], True)):
    want = _intermediates(models.Pretrained(model, params, None), images,
                          indices=indices, norm=True, intermediates_only=only)
    got = _intermediates(models.Pretrained(scanned, scanned_params, None),
                         images, indices=indices, norm=True,
                         intermediates_only=only)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5),
                 got, want)


def test_flexivit_at_another_patch_size():
  """FlexiViT: the grid of the patch size it runs at."""
  model = models.get_model('FlexiViT-testing', num_classes=0) if (
      'FlexiViT-testing' in models.MODEL_CONFIGS) else models.get_model(
          'testing', num_classes=0, posemb_grid=(2, 2))
  images = jnp.asarray(IMAGES[:1, :32, :32])
  params = model.init(jax.random.PRNGKey(0), images, train=False)['params']
  maps = model.apply({'params': params}, images,
                     method='forward_intermediates', indices=1,
                     patch_size=8, intermediates_only=True)
  assert maps[0].shape == (1, 4, 4, model.hidden_size)


@pytest.mark.parametrize('kw,message', [
    (dict(indices=0), 'the last n blocks'),
    (dict(indices=[2]), r'block indices in \[-2, 1\]'),
    (dict(indices=[]), 'block indices'),
    (dict(indices=1, output_fmt='NCHW'), "output_fmt='NCHW'"),
])
def test_bad_arguments_are_named(converted, kw, message):
  with pytest.raises(ValueError, match=message):
    _intermediates(converted['vit'], IMAGES[:, :64, :64], **kw)


def test_wrappers_give_their_vits_intermediates():
  """DINO's encoder: its last block's class token, normed, and its final
  tokens are the model's own 'cls'; a model without blocks to take is
  refused by name."""
  images = jnp.asarray(IMAGES[:, :28, :28])
  dino = models.dino.DinoModel(
      encoder=models.MODEL_CONFIGS['DINOv2-testing'].to_dict(),
      head=dict(num_prototypes=8, hidden_dim=16, bottleneck_dim=8))
  params = dino.init(jax.random.PRNGKey(0), images, train=False)['params']
  out = dino.apply({'params': params}, images, train=False)
  encoder, encoder_params = backbone.image_encoder(dino, params)
  final, (pair,) = encoder.apply(
      {'params': encoder_params}, images, method='forward_intermediates',
      indices=1, norm=True, return_prefix_tokens=True)
  np.testing.assert_allclose(pair[1][:, 0], out['cls'], atol=1e-6)
  np.testing.assert_allclose(final[:, 0], out['cls'], atol=1e-6)
  with pytest.raises(ValueError, match='ResNetV2 has no forward_inter'):
    backbone.image_encoder(models.get_model('BiT-testing', num_classes=2), {})


def test_hybrid_maps_are_on_the_resnets_grid():
  """R+ViT: the patches of the ResNet's feature map (stride 4 here)."""
  model = models.get_model('testing', num_classes=0, patches={'size': (1, 1)},
                           resnet={'num_layers': (1,), 'width_factor': 1})
  images = jnp.asarray(IMAGES[:1, :32, :32])
  params = model.init(jax.random.PRNGKey(0), images, train=False)['params']
  maps = model.apply({'params': params}, images,
                     method='forward_intermediates', indices=1,
                     intermediates_only=True)
  assert maps[0].shape == (1, 8, 8, model.hidden_size)
