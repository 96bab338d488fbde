"""InternViT: timm's `vit_intern300m_patch14_448` and transformers'
`InternVLVisionModel` -> vit_jax (and back to transformers), against their
own outputs: tests/data/internvit, from scripts/make_internvit_golden.py
(tiny random models at 56 px; their outputs at 56 and 70 px, each block's
tokens, the processor's pixels)."""

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.convert import preset_inference
from vit_jax.convert import transform

DATA = os.path.join(helpers.DATA, 'internvit')
GOLDEN = np.load(os.path.join(DATA, 'golden.npz'))
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """case -> (preset, .npz), each golden folder converted with no flags."""
  folder = tmp_path_factory.mktemp('internvit')
  out = {}
  for case in ('timm', 'timm_qknorm', 'hf_300m', 'hf_300m_norm', 'hf_6b'):
    npz = str(folder / f'{case}.npz')
    out[case] = convert.convert(os.path.join(DATA, case), npz), npz
  return out


def _outputs(npz, side, **kw):
  m = models.from_pretrained(npz, image_size=side, **kw)
  images = GOLDEN[f'images/{side}']
  return m, np.asarray(m.model.apply({'params': m.params}, images,
                                     train=False))


def _error(have, want):
  return float(np.abs(np.asarray(have) - want).max())


@pytest.mark.parametrize('case,preset,overrides', [
    ('timm', 'InternViT-testing', {}),
    ('timm_qknorm', 'InternViT-testing', {'transformer': {'qk_norm': 'head'}}),
    ('hf_300m', 'InternViT-testing', {'classifier': 'token_unpooled'}),
    ('hf_300m_norm', 'InternViT-testing', {
        'classifier': 'token_unpooled', 'transformer': {'final_norm': True}}),
    ('hf_6b', 'InternViT-6B-testing', {'classifier': 'token_unpooled'}),
])
def test_converted_gives_the_sources_outputs(converted, case, preset,
                                             overrides):
  """The preset by the shapes and what the source computes beyond it;
  timm's pooled class token, transformers' every token, within 1e-4 at
  the table's 56 px and at 42 px (the table resized as each source does:
  timm's antialiased bicubic, transformers' plain)."""
  name, npz = converted[case]
  record = transform.load_transform(npz)
  assert name == preset
  assert record.get('model', {}) == overrides
  assert (record['mean'], record['std']) == IMAGENET
  for side, key in ((56, 'out'), (42, 'out@42')):
    _, got = _outputs(npz, side)
    assert got.shape == GOLDEN[f'{case}/{key}'].shape
    assert _error(got, GOLDEN[f'{case}/{key}']) < 1e-4, (case, side)


@pytest.mark.parametrize('case', ['timm', 'hf_6b'])
def test_forward_intermediates_are_the_sources_blocks(converted, case):
  """timm's `forward_intermediates` (NCHW patch maps) and transformers'
  `hidden_states` (every token) of both blocks."""
  _, npz = converted[case]
  m = models.from_pretrained(npz, image_size=56)
  want = GOLDEN[f'{case}/blocks']
  images = GOLDEN['images/56']
  if case == 'timm':
    got = m.model.apply({'params': m.params}, images, 2,
                        intermediates_only=True,
                        method=m.model.forward_intermediates)
    got = np.stack([np.asarray(b).transpose(0, 3, 1, 2) for b in got])
  else:
    got = m.model.apply({'params': m.params}, images, 2, output_fmt='NLC',
                        intermediates_only=True, return_prefix_tokens=True,
                        method=m.model.forward_intermediates)
    got = np.stack([np.concatenate([prefix, patches], axis=1)
                    for patches, prefix in got])
  assert got.shape == want.shape
  assert _error(got, want) < 1e-4


def test_processor_normalization_is_recorded(converted):
  """The hub processor's (GotOcr2ImageProcessor) size, bicubic and
  ImageNet's mean and std: predict's transform gives its pixels."""
  _, npz = converted['hf_300m']
  spec = models.from_pretrained(npz).transform
  assert (spec.size, spec.interpolation) == (56, 'bicubic')
  pixels = transform.prepare(os.path.join(helpers.DATA, 'predict_image.jpg'),
                             spec)
  want = GOLDEN['hf_300m/pixels'][0]
  assert _error(np.asarray(pixels)[::8, ::8], want) < 1e-4


@pytest.mark.parametrize('case', ['hf_300m', 'hf_6b'])
def test_transformers_layout_writes_the_source_folder(converted, tmp_path,
                                                      case):
  """`--layout=transformers` writes InternVLVisionModel with the source's
  names, shapes and settings; read back, the same outputs."""
  _, npz = converted[case]
  folder = str(tmp_path / case)
  convert.convert(npz, folder, layout='transformers')
  want = load_file(os.path.join(DATA, case, 'model.safetensors'))
  have = load_file(os.path.join(folder, 'model.safetensors'))
  assert {k: v.shape for k, v in have.items()} == {
      k: v.shape for k, v in want.items()}
  assert max(_error(have[k], want[k]) for k in want) < 1e-6
  config = json.load(open(os.path.join(folder, 'config.json')))
  source = json.load(open(os.path.join(DATA, case, 'config.json')))
  for key in ('architectures', 'model_type', 'hidden_size',
              'num_hidden_layers', 'num_attention_heads', 'intermediate_size',
              'attention_bias', 'use_qk_norm', 'norm_type', 'hidden_act',
              'use_mean_pooling', 'layer_norm_eps'):
    assert config[key] == source[key], key
  assert config['image_size'] in (56, [56, 56])
  _, got = _outputs(convert.as_npz(folder), 56)
  assert _error(got, GOLDEN[f'{case}/out']) < 1e-4


def test_what_transformers_cannot_hold_is_refused(converted, tmp_path):
  """6B's blocks have no timm layout; a head no InternVLVisionModel."""
  _, npz = converted['hf_6b']
  with pytest.raises(ValueError, match='RMSNorm blocks and query/key norms '
                     'across the heads .*--layout=transformers'):
    convert.convert(npz, str(tmp_path / 'six_b.safetensors'))
  _, npz = converted['timm']
  out = str(tmp_path / 'timm.safetensors')
  assert convert.convert(npz, out) == 'InternViT-testing'
  want = load_file(os.path.join(DATA, 'timm', 'model.safetensors'))
  assert sorted(load_file(out)) == sorted(want)


@pytest.mark.parametrize('case,want', [
    ('timm_qknorm', dict(final_norm=False, norm='layer', qk_norm='head')),
    ('hf_300m_norm', dict(final_norm=True, norm='layer', qk_norm=None)),
    ('hf_6b', dict(final_norm=False, norm='rms', qk_norm='all')),
])
def test_the_names_show_the_norms(converted, case, want):
  """What an .npz without its record tells the preset inference."""
  flat = files.published_flat(files.load(converted[case][1]))
  assert {k: preset_inference.dims(flat)[k] for k in want} == want
