"""SigLIP 2's NaFlex towers: timm's `naflexvit_*_siglip` files converted
with no flags, run at three aspect ratios against timm's own NaFlex path
(scripts/make_naflex_golden.py: padded patch sequences, masked); big_vision's
SigLIP 2 .npz, fixed-size (SigLIP's layout) and NaFlex (a Dense patch
embedding, a (g, g, D) table), against big_vision's own embeddings."""

import json
import os
import shutil

import numpy as np
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.checkpoints import files

DATA = helpers.DATA
NAFLEX = os.path.join(DATA, 'timm_naflex')
GOLDEN = np.load(os.path.join(DATA, 'timm_naflex_golden.npz'))
PIXELS = GOLDEN['image'].astype(np.float32) / 127.5 - 1
SIZES = ((224, 224), (224, 320), (64, 160))


@pytest.fixture(scope='module')
def npz(tmp_path_factory):
  """The golden folder converted as `python -m vit_jax.convert SRC DST`
  does, with no flags."""
  path = str(tmp_path_factory.mktemp('naflex') / 'naflex.npz')
  assert convert.convert(NAFLEX, path) == 'SigLIP2-testing-naflex'
  return path


@pytest.mark.parametrize('size', SIZES)
def test_naflex_at_three_aspect_ratios(npz, size):
  h, w = size
  m = models.from_pretrained(npz, image_size=(h, w))
  assert m.model.posemb_grid == (16, 16) and m.transform.hw == (h, w)
  out = m.model.apply({'params': m.params}, PIXELS[None, :h, :w],
                      train=False)
  np.testing.assert_allclose(out[0], GOLDEN[f'{h}x{w}'], atol=1e-4)


@pytest.mark.parametrize('setting, value, message', [
    ('pos_embed_interp_mode', 'bicubic', 'resizes .* bilinearly'),
    ('patchify_channels_last', False, r'flattened as \(C, p, p\)'),
    ('rope_type', 'axial', 'rotary'),
])
def test_settings_that_change_the_computation_are_refused(
    tmp_path, setting, value, message):
  folder = tmp_path / 'naflex'
  shutil.copytree(NAFLEX, folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'][setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'n.npz'))


def test_other_naflex_architectures_are_refused_by_name(tmp_path):
  folder = tmp_path / 'naflex'
  shutil.copytree(NAFLEX, folder)
  config = json.loads((folder / 'config.json').read_text())
  config['architecture'] = 'naflexvit_base_patch16_gap'
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match="'naflexvit_base_patch16_gap' is not"):
    convert.convert(str(folder), str(tmp_path / 'n.npz'))


BIG_VISION = os.path.join(DATA, 'big_vision_siglip.npz')
BIG_VISION_GOLDEN = np.load(os.path.join(DATA, 'big_vision_siglip_golden.npz'))


def _embeddings(m, images):
  zimg, ztxt, out = m.model.apply({'params': m.params}, images=images,
                                  tokens=BIG_VISION_GOLDEN['tokens'])
  return zimg, ztxt, out


def test_big_vision_siglip2_npz_loads_into_the_siglip2_towers():
  """SigLIP 2's fixed-size .npz is SigLIP's layout (big_vision's
  README_siglip2.md): big_vision's file of SigLIP2-testing's shapes
  loads into SigLIP2-testing-towers, its vocabulary and length the
  file's, and gives big_vision's embeddings."""
  m = models.from_pretrained(BIG_VISION, model_name='SigLIP2-testing-towers')
  assert m.model.pp['tokenizer_name'] == 'gemma'
  zimg, ztxt, out = _embeddings(m, BIG_VISION_GOLDEN['images'])
  np.testing.assert_allclose(zimg, BIG_VISION_GOLDEN['zimg'], atol=1e-5)
  np.testing.assert_allclose(ztxt, BIG_VISION_GOLDEN['ztxt'], atol=1e-5)
  np.testing.assert_allclose(out['b'], BIG_VISION_GOLDEN['b'], rtol=1e-6)


def _as_naflex(flat, tower):
  """A ViT's big_vision names as big_vision's NaFlex ViT stores them: the
  patch embedding a Dense of (p, p, C)-flattened patches, the table
  (g, g, D) at the tower's top."""
  out = dict(flat)
  kernel = out[f'params/{tower}embedding/kernel']
  out[f'params/{tower}embedding/kernel'] = kernel.reshape(
      -1, kernel.shape[-1])
  table = out[f'params/{tower}pos_embedding']
  side = int(round(np.sqrt(table.shape[1])))
  out[f'params/{tower}pos_embedding'] = table.reshape(side, side, -1)
  return out


def test_big_vision_naflex_npz_gives_big_vision_embeddings(tmp_path):
  """Both towers in the NaFlex layout load into SigLIP2-testing-naflex-
  towers (at its table's grid, 2 x 2: no resize) and give the embeddings
  that big_vision computed with the conv and the (1, 4, D) table."""
  with np.load(BIG_VISION) as f:
    flat = _as_naflex(dict(f), 'img/')
  path = str(tmp_path / 'siglip2_naflex.npz')
  np.savez(path, **flat)
  m = models.from_pretrained(path, model_name='SigLIP2-testing-naflex-towers',
                             image={'posemb_grid': (2, 2)})
  zimg, ztxt, _ = _embeddings(m, BIG_VISION_GOLDEN['images'])
  np.testing.assert_allclose(zimg, BIG_VISION_GOLDEN['zimg'], atol=1e-5)
  np.testing.assert_allclose(ztxt, BIG_VISION_GOLDEN['ztxt'], atol=1e-5)


def test_big_vision_naflex_image_tower_gives_timms_outputs(npz, tmp_path):
  """timm's tower in big_vision's NaFlex layout (scanned blocks, the
  Dense embedding, a 16 x 16 table) at 224 x 320: timm's features."""
  linen = {'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
           'LayerNorm_2': 'LayerNorm_1', 'MlpBlock_3': 'MlpBlock_0'}
  flat, blocks = {}, {}
  for key, value in files.published_flat(files.load(npz)).items():
    parts = key.split('/')
    if len(parts) > 2 and parts[1].startswith('encoderblock_'):
      name = '/'.join([linen.get(parts[2], parts[2])] + parts[3:])
      blocks.setdefault(name, []).append(value)
    else:
      flat[f'params/{key}'] = value
  flat['params/pos_embedding'] = flat.pop(
      'params/Transformer/posembed_input/pos_embedding')
  for name, layers in blocks.items():
    flat[f'params/Transformer/encoderblock/{name}'] = np.stack(layers)
  path = str(tmp_path / 'naflex_bv.npz')
  np.savez(path, **_as_naflex(flat, ''))
  m = models.from_pretrained(path, model_name='SigLIP2-testing-naflex',
                             image_size=(224, 320))
  out = m.model.apply({'params': m.params}, PIXELS[None], train=False)
  np.testing.assert_allclose(out[0], GOLDEN['224x320'], atol=1e-4)


def test_timms_layout_is_refused_for_a_naflex_npz(npz, tmp_path):
  """timm's ViT state dict would resize the table otherwise (bicubic):
  one line that says which layout holds it."""
  with pytest.raises(ValueError, match=r'is a NaFlex tower \(SigLIP2-testing'
                     r'-naflex\).*--layout=transformers'):
    convert.convert(npz, str(tmp_path / 'out.safetensors'))
  assert not (tmp_path / 'out.safetensors').exists()
