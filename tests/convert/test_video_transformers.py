"""transformers' video models -> vit_jax's ViViT, against their own outputs:
tests/data/transformers_video, from scripts/make_video_golden.py (tiny
random VivitForVideoClassification, VideoMAEForVideoClassification and
VideoMAEForPreTraining on 4 frames of 32 px, their outputs on one clip and
their processors' pixels)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.convert import transform
from vit_jax.convert import transformers_defaults
from vit_jax.convert import transformers_video

DATA = os.path.join(helpers.DATA, 'transformers_video')
GOLDEN = np.load(os.path.join(DATA, 'golden.npz'))
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
# case: (preset, the record's model overrides, its mean and std)
CASES = {
    'vivit': ('ViViT-custom', None, ([0.75] * 3, [0.25] * 3)),
    'videomae': ('VideoMAE-testing', {}, IMAGENET),
    'videomae_pretraining': ('VideoMAE-testing', {
        'fc_norm': False, 'transformer': {'final_norm': True}}, IMAGENET),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """case -> (preset, .npz), each golden folder converted with no flags."""
  folder = tmp_path_factory.mktemp('video')
  return {case: (convert.convert(os.path.join(DATA, case),
                                 str(folder / f'{case}.npz')),
                 str(folder / f'{case}.npz')) for case in CASES}


@pytest.mark.parametrize('case', CASES)
def test_converted_gives_the_sources_outputs(converted, case):
  """The preset by the shapes (else the whole model, recorded), what the
  source computes beyond it, its eval transform (4 frames of 32 px); on
  a clip (N, T, H, W, C) the logits (the pre-trained encoder's tokens)
  within 1e-4."""
  name, npz = converted[case]
  preset, overrides, (mean, std) = CASES[case]
  record = transform.load_transform(npz)
  assert name == record['model_name'] == preset
  if overrides is not None:
    assert record.get('model', {}) == overrides
  assert record['num_frames'] == 4 and record['input_size'] == [3, 32, 32]
  np.testing.assert_allclose(record['mean'], mean, rtol=1e-6)
  np.testing.assert_allclose(record['std'], std, rtol=1e-6)
  m = models.from_pretrained(npz, image_size=32)
  clip, want = GOLDEN['clip'], GOLDEN[f'{case}/out']
  if case == 'videomae_pretraining':  # last_hidden_state: every token
    got, _ = m.model.apply({'params': m.params}, clip, indices=[1],
                           output_fmt='NLC', method='forward_intermediates')
  else:
    got = m.model.apply({'params': m.params}, clip, train=False)
  assert got.shape == want.shape
  assert float(np.abs(np.asarray(got) - want).max()) < 1e-4, case


@pytest.mark.parametrize('case', ['vivit', 'videomae'])
def test_recorded_normalization_is_the_processors(converted, case):
  """The record's mean and std on [0, 1] frames give the processor's
  pixels: ViViT's [-1, 1] rescale, then its mean and std of 0.5."""
  record = transform.load_transform(converted[case][1])
  frames = GOLDEN['frames'] / 255.
  have = (frames - np.asarray(record['mean'])) / np.asarray(record['std'])
  np.testing.assert_allclose(have, GOLDEN[f'{case}/pixels'], atol=1e-5)


def test_from_pretrained_converts_a_folder(converted):
  """A folder by its path: converted into the cache, the same weights;
  VideoMAE's attention has no key bias."""
  m = models.from_pretrained(os.path.join(DATA, 'videomae'), image_size=32)
  again = models.from_pretrained(converted['videomae'][1], image_size=32)
  jax.tree.map(np.testing.assert_array_equal, m.params, again.params)
  attention = m.params['Transformer']['encoderblock_0'][
      'MultiHeadDotProductAttention_0']
  assert 'bias' in attention['query'] and 'bias' not in attention['key']


@pytest.mark.parametrize('changes,match', [
    ({'use_mean_pooling': False}, 'use_mean_pooling=False'),
    ({'intermediate_size': 48}, 'mlp_dim 48 .weights: 64.'),
])
def test_refused_before_anything_compiles(tmp_path, changes, match):
  """VideoMAEForVideoClassification without mean pooling reads its first
  patch token, which ViViT does not; a config.json that does not describe
  its weights: one clear error each."""
  folder = tmp_path / 'changed'
  shutil.copytree(os.path.join(DATA, 'videomae'), folder)
  config = json.loads((folder / 'config.json').read_text())
  (folder / 'config.json').write_text(json.dumps(dict(config, **changes)))
  with pytest.raises(ValueError, match=match):
    convert.convert(str(folder), str(tmp_path / 'out.npz'))


@pytest.mark.parametrize('arch,changes,want', [
    ('VideoMAEModel', {}, dict(fc_norm=False, final_norm=False)),
    ('VideoMAEForPreTraining', {'use_mean_pooling': False},
     dict(fc_norm=False, final_norm=True)),
    ('VideoMAEForVideoClassification', {}, dict(fc_norm=True,
                                                final_norm=False)),
    ('VideoMAEModel', {'qkv_bias': False}, dict(qkv_bias='none')),
])
def test_videomae_settings(arch, changes, want):
  """Which norms a VideoMAE class has (a pooled model: its mean without
  either), and an older file's `qkv_bias`."""
  config = transformers_defaults.complete_config(dict(
      model_type='videomae', architectures=[arch], **changes))
  settings = transformers_video.model_settings(config)
  have = dict(settings, **settings['transformer'])
  assert {k: have.get(k) for k in want} == want


@pytest.mark.parametrize('case', CASES)
def test_written_back_reads_the_same(converted, case, tmp_path):
  """--layout=transformers writes ViViT's and VideoMAE's classes (the
  pre-trained encoder as a VideoMAEModel), read back to the same weights
  and record (transformers' outputs on them: `make_video_golden.py
  --check`, measured equal)."""
  name, npz = converted[case]
  folder = str(tmp_path / 'hf')
  convert.convert(npz, folder, layout='transformers')
  assert convert.convert(folder, str(tmp_path / 'back.npz')) == name
  jax.tree.map(np.testing.assert_array_equal, files.read_params(npz),
               files.read_params(str(tmp_path / 'back.npz')))
  assert transform.load_transform(str(tmp_path / 'back.npz')) == (
      transform.load_transform(npz))
