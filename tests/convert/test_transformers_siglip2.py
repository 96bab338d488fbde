"""transformers' SigLIP 2 (NaFlex) -> vit_jax and back, against transformers'
own outputs: tests/data/transformers/siglip2_vision and siglip2 (tiny
random `Siglip2VisionModel` and `Siglip2Model`, a Gemma-like tokenizer) and
tests/data/siglip2_golden.npz, from scripts/make_siglip2_golden.py: the
processor's padded patches of two images (grids 4 x 6 and 5 x 5 in 32
tokens) and transformers' pooled outputs, embeddings and logits."""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import transform
from vit_jax.data import packing
from vit_jax.data import tokenizers
from vit_jax.models import navit as models_navit

FOLDERS = os.path.join(helpers.DATA, 'transformers')
GOLDEN = np.load(os.path.join(helpers.DATA, 'siglip2_golden.npz'))
TEXTS = json.loads(open(os.path.join(helpers.DATA,
                                     'siglip2_golden.json')).read())
INPUTS = ('pixel_values', 'pixel_attention_mask', 'spatial_shapes')


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """(preset, .npz) of the vision folder, converted with no flags."""
  npz = str(tmp_path_factory.mktemp('siglip2') / 'siglip2_vision.npz')
  name = convert.convert(os.path.join(FOLDERS, 'siglip2_vision'), npz)
  return name, npz


def _relative_error(have, want):
  return float(np.abs(np.asarray(have) - want).max() / np.abs(want).max())


def _images():
  """Each image of the processor's patches, whole: (h * p, w * p, 3)."""
  out = []
  for patches, (h, w) in zip(GOLDEN['pixel_values'], GOLDEN['spatial_shapes']):
    grid = patches[:h * w].reshape(h, w, 16, 16, 3)
    out.append(grid.transpose(0, 2, 1, 3, 4).reshape(h * 16, w * 16, 3))
  return out


def test_vision_tower_on_each_image_gives_the_pooled_output(converted):
  """The NaFlex preset, chosen by the shapes; its table resized to each
  image's grid (64 x 96, 80 x 80) as transformers resizes it."""
  name, npz = converted
  assert name == 'SigLIP2-testing-naflex'
  record = transform.load_transform(npz)
  assert (record['max_num_patches'], record['input_size'],
          record['interpolation']) == (32, [3, 80, 80], 'bilinear')
  for i, image in enumerate(_images()):
    m = models.from_pretrained(npz, image_size=image.shape[:2])
    assert tuple(m.model.posemb_grid) == (16, 16)
    got = m.model.apply({'params': m.params}, image[None], train=False)
    want = GOLDEN['vision/pooler_output'][i:i + 1]
    assert _relative_error(got, want) < 1e-5


def test_naflex_batch_lays_out_transformers_inputs():
  batch = packing.naflex_batch(*(GOLDEN[k] for k in INPUTS))
  np.testing.assert_array_equal(batch['patches'], GOLDEN['pixel_values'])
  np.testing.assert_array_equal(batch['segment_ids'],
                                GOLDEN['pixel_attention_mask'])
  np.testing.assert_array_equal(batch['rows'][0, :7], [0] * 6 + [1])
  np.testing.assert_array_equal(batch['cols'][0, :7], [0, 1, 2, 3, 4, 5, 0])
  assert (batch['rows'][1, 24], batch['cols'][1, 24]) == (4, 4)
  assert (batch['heights'][:, 0].tolist(), batch['widths'][:, 0].tolist()) == (
      [4, 5], [6, 5])
  for key in packing.KEYS[1:]:  # padding: zeros
    assert not batch[key][0, 24:].any() and not batch[key][1, 25:].any()
  holed = GOLDEN['pixel_attention_mask'].copy()
  holed[0, 3] = 0
  with pytest.raises(ValueError, match='first h \\* w tokens'):
    packing.naflex_batch(GOLDEN['pixel_values'], holed,
                         GOLDEN['spatial_shapes'])


def test_navit_on_transformers_inputs_gives_the_pooled_output(converted):
  """The same parameters as NaViT's padded sequences (`naflex_batch`)."""
  m = models.from_pretrained(converted[1])
  navit = models_navit.NaViT(
      num_classes=0, patches=m.model.patches, hidden_size=m.model.hidden_size,
      transformer=dict(m.model.transformer), posemb='learn_resized',
      max_grid=16, pool='map', max_images=1)
  batch = packing.naflex_batch(*(GOLDEN[k] for k in INPUTS))
  got = navit.apply({'params': m.params}, batch, train=False)[:, 0]
  assert _relative_error(got, GOLDEN['vision/pooler_output']) < 1e-5


def test_two_towers_give_transformers_embeddings_and_logits():
  m = models.from_pretrained(os.path.join(FOLDERS, 'siglip2'))
  assert m.model.__class__.__name__ == 'LitModel'
  assert m.model.pp['tokenizer_name'] == 'gemma'
  assert m.model.text['vocab_size'] == 320  # the weights', not Gemma's 256k
  zimg, ztxt, out = m.model.apply({'params': m.params},
                                  images=_images()[0][None],
                                  tokens=GOLDEN['towers/input_ids'])
  assert _relative_error(zimg, GOLDEN['towers/image_embeds']) < 1e-5
  assert _relative_error(ztxt, GOLDEN['towers/text_embeds']) < 1e-5
  logits = zimg @ ztxt.T * out['t'] + out['b']
  assert _relative_error(logits, GOLDEN['towers/logits_per_image']) < 1e-5


@pytest.mark.parametrize('max_len,key', [(16, 'tokenizer/input_ids'),
                                         (64, 'tokenizer/input_ids_64')])
def test_gemma_tokenizer_gives_transformers_ids(max_len, key):
  """Siglip2Tokenizer's ids: lower-cased, no <bos>, <eos> kept last when
  cut, <pad> after; byte fallback for what the pieces lack."""
  tokenizer = tokenizers.tokenizer_from_folder(
      os.path.join(FOLDERS, 'siglip2'), max_len)
  assert isinstance(tokenizer, tokenizers.GemmaTokenizer)
  np.testing.assert_array_equal(tokenizer(TEXTS['tokenized']), GOLDEN[key])
  if max_len == 16:
    np.testing.assert_array_equal(tokenizer(TEXTS['prompts']),
                                  GOLDEN['towers/input_ids'])


def test_written_back_as_siglip2_vision_model(converted, tmp_path):
  """`--layout=transformers`: the folder's names, values, config.json and
  processor; read again, the same outputs."""
  _, npz = converted
  out = str(tmp_path / 'out')
  convert.convert(npz, out, layout='transformers')
  folder = os.path.join(FOLDERS, 'siglip2_vision')
  written = load_file(os.path.join(out, 'model.safetensors'))
  original = load_file(os.path.join(folder, 'model.safetensors'))
  assert written.keys() == original.keys()
  for key, value in written.items():
    np.testing.assert_allclose(value, original[key], rtol=1e-6, err_msg=key)
  config, want = ({k: v for k, v in json.loads(open(os.path.join(
      f, 'config.json')).read()).items()
                   if k not in ('dtype', 'transformers_version')}
                  for f in (out, folder))
  assert config == want
  processor, want = (json.loads(open(os.path.join(
      f, 'preprocessor_config.json')).read()) for f in (out, folder))
  assert processor == pytest.approx(want)
  again = convert.convert(out, str(tmp_path / 'again.npz'))
  assert again == 'SigLIP2-testing-naflex'
  with np.load(npz) as a, np.load(str(tmp_path / 'again.npz')) as b:
    assert a.files == b.files
    for key in a.files:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_fixed_size_siglip2_folder_reads_as_siglip2_towers(tmp_path):
  """A `SiglipModel` folder with Gemma's tokenizer.model (the hub's
  google/siglip2-base-patch16-224): SigLIP 2's fixed-size towers, its text
  read by the Gemma tokenizer; the embeddings transformers computed."""
  folder = tmp_path / 'siglip'
  shutil.copytree(os.path.join(FOLDERS, 'siglip'), folder)
  (folder / 'spiece.model').rename(folder / 'tokenizer.model')
  npz = str(tmp_path / 'siglip.npz')
  assert convert.convert(str(folder), npz) == 'SigLIP2-testing-towers'
  assert transform.load_transform(npz)['vocab'] == 'tokenizer.model'
  m = models.from_pretrained(npz)
  assert m.model.pp['tokenizer_name'] == 'gemma'
  golden = np.load(os.path.join(helpers.DATA, 'transformers_golden.npz'))
  zimg, ztxt, _ = m.model.apply({'params': m.params},
                                images=golden['images/32'],
                                tokens=golden['siglip/input_ids'])
  assert _relative_error(zimg, golden['siglip/image_embeds']) < 1e-5
  assert _relative_error(ztxt, golden['siglip/text_embeds']) < 1e-5
