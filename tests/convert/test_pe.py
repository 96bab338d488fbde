"""timm's Perception Encoder (`vit_pe_*`) converted both ways, against the
outputs that timm computed itself: the pooled output (PE Core's attention
pool and projection), every token, the blocks' maps; its RoPE; the presets
against timm's entrypoints.

The golden folders (tests/data/timm_pe), outputs (timm_pe_golden.npz) and
counts (pe_param_counts.json) come from scripts/make_pe_golden.py, with
torch and timm; these tests need neither.
"""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import eva as convert_eva
from vit_jax.convert import transform
from vit_jax.convert.preset_inference import differences
from vit_jax.models import registry
from vit_jax.models.posemb import rope_angles

DATA = helpers.DATA
FOLDERS = os.path.join(DATA, 'timm_pe')
GOLDEN = np.load(os.path.join(DATA, 'timm_pe_golden.npz'))
with open(os.path.join(DATA, 'pe_param_counts.json')) as f:
  PUBLISHED = json.load(f)['pretrained_cfg']
# (golden folder, preset, image side, what config.json adds to the preset).
CASES = {
    'core': ('PE-Core-testing', 64, None),
    # G's: no class token, RoPE from 0 on a 32x32 grid.
    'core_g': ('PE-Core-testing', 64, {
        'classifier': 'map',
        'transformer': {'rope_ref_grid': [32, 32], 'rope_offset': 0.0}}),
    'spatial': ('PE-Spatial-testing', 64, None),
    'lang': ('PE-Lang-testing', 56, None),
}
# Within 1e-4 of timm's; the features reach ~25, float32 rounding is relative.
CLOSE = dict(atol=1e-4, rtol=1e-5)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """Each golden folder converted with no flags: (npz, its preset, its
  record, `from_pretrained`'s model)."""
  folder = tmp_path_factory.mktemp('pe')
  out = {}
  for case in CASES:
    npz = str(folder / f'{case}.npz')
    preset = convert.convert(os.path.join(FOLDERS, case), npz)
    out[case] = (npz, preset, transform.load_transform(npz),
                 models.from_pretrained(npz))
  return out


def _apply(pretrained, images, **kw):
  return pretrained.model.apply({'params': pretrained.params}, images,
                                train=False, **kw)


@pytest.mark.parametrize('case', sorted(CASES))
def test_gives_timms_outputs(converted, case):
  """The preset from timm's architecture and the shapes, what config.json
  changes recorded, inputs in [-1, 1]; timm's pooled output and every
  token (timm's `forward_features`: the final tokens of
  `forward_intermediates`) at the recorded side."""
  _, preset, record, pretrained = converted[case]
  want_preset, side, overrides = CASES[case]
  assert preset == want_preset
  assert record.get('model') == overrides
  assert (record['mean'], record['std']) == ([0.5] * 3, [0.5] * 3)
  assert pretrained.transform.size == side
  images = GOLDEN['images'][:, :side, :side]
  np.testing.assert_allclose(_apply(pretrained, images), GOLDEN[case],
                             **CLOSE)
  final, _ = _apply(pretrained, images, method='forward_intermediates',
                    indices=1)
  np.testing.assert_allclose(final, GOLDEN[f'{case}/tokens'], **CLOSE)


def test_another_side_as_timms(converted):
  """At 48 px: the table resized as timm's checkpoint filter does
  (antialiased bicubic, the class entry kept), RoPE's positions rescaled
  to its reference grid at the new grid, as timm's model built at 48 px."""
  pretrained = models.from_pretrained(converted['core'][0], image_size=48)
  np.testing.assert_allclose(
      _apply(pretrained, GOLDEN['images'][:, :48, :48]), GOLDEN['core_48'],
      **CLOSE)


@pytest.mark.parametrize('norm', [False, True])
@pytest.mark.parametrize('case', ['core', 'lang'])
def test_forward_intermediates_equal_timms(converted, case, norm):
  """timm's `forward_intermediates(x, 2, norm, intermediates_only=True)`,
  as NHWC maps; the class token dropped; `norm` a no-op for Lang, which
  has no final norm."""
  pretrained, side = converted[case][3], CASES[case][1]
  got = _apply(pretrained, GOLDEN['images'][:, :side, :side],
               method='forward_intermediates', indices=2, norm=norm,
               output_fmt='NHWC', intermediates_only=True)
  assert len(got) == 2
  for i, maps in enumerate(got):
    np.testing.assert_allclose(
        maps, GOLDEN[f'{case}/blocks{"_norm" if norm else ""}/{i}'], **CLOSE)


def test_every_token_unpooled(converted):
  """classifier='token_unpooled': PE Spatial's class token and patches, as
  timm's `forward_features`; a Core's MAP head is dropped for it."""
  npz = converted['spatial'][0]
  pretrained = models.from_pretrained(npz, classifier='token_unpooled')
  np.testing.assert_allclose(_apply(pretrained, GOLDEN['images']),
                             GOLDEN['spatial/tokens'], **CLOSE)
  core = models.from_pretrained(converted['core'][0],
                                classifier='token_unpooled')
  assert 'MAPHead_0' not in core.params
  assert _apply(core, GOLDEN['images']).shape == (2, 17, 16)


@pytest.mark.parametrize('case', sorted(CASES))
def test_back_to_timm_bit_for_bit(converted, tmp_path, case):
  """timm -> .npz -> timm gives timm's own state dict: AttentionRope's
  qkv.bias, the pool's q and kv, the projection `head`."""
  back = str(tmp_path / 'w.safetensors')
  assert convert.convert(converted[case][0], back) == CASES[case][0]
  want = load_file(os.path.join(FOLDERS, case, 'model.safetensors'))
  got = load_file(back)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_rope_is_timms():
  """timm's PE RoPE ('cat', offset 1, 'xy', a 4x6 reference grid) of a 3x5
  grid, head width 16: sin and cos of each angle, repeated for its pair."""
  angles = np.asarray(rope_angles('eva02', (3, 5), 16, 10_000., (4, 6),
                                  offset=1., indexing='xy'))
  for fn in ('sin', 'cos'):
    np.testing.assert_allclose(
        np.repeat(getattr(np, fn)(angles), 2, axis=-1), GOLDEN[f'rope/{fn}'],
        atol=1e-6)


@pytest.mark.parametrize('preset', sorted(PUBLISHED))
def test_presets_compute_as_timms_entrypoints(preset):
  """What each published preset's timm entrypoint passes to Eva is the
  preset's model (no overrides), and its pretrained_cfg's side, mean and
  std are the preset's."""
  architecture = {'Core': 'vit_pe_core', 'Spatial': 'vit_pe_spatial',
                  'Lang': 'vit_pe_lang'}[preset.split('-')[1]]
  size = {'T': 'tiny', 'S': 'small', 'B': 'base', 'L': 'large',
          'G': 'gigantic'}[preset.split('-')[2][0]]
  patch, side = preset[-2:], PUBLISHED[preset]['side']
  name = f'{architecture}_{size}_patch{patch}_{side}'
  overrides = convert_eva.eva_overrides(convert_eva.eva_settings(
      {'architecture': name}))
  assert differences(preset, overrides) == {}
  assert registry.native_resolution(preset) == side
  mean, std = registry.input_normalization(preset)
  assert [list(mean), list(std)] == [PUBLISHED[preset]['mean'],
                                     PUBLISHED[preset]['std']]


@pytest.mark.parametrize('setting,value,message', [
    ('rope_grid_indexing', 'yx', "rope_grid_indexing='yx'"),
    ('attn_type', 'diff', "attn_type='diff'"),
    ('rope_type', 'dinov3', "rope_type='dinov3'"),
])
def test_settings_that_change_the_computation_are_refused(
    tmp_path, setting, value, message):
  folder = tmp_path / 'core'
  shutil.copytree(os.path.join(FOLDERS, 'core'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'][setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'w.npz'))
