"""timm's BEiT and BEiT v2 (`beit.py`) converted both ways, against the
outputs that timm computed itself, at its size and at another one (the
tables resized as timm's checkpoint filter does).

The golden folders (tests/data/timm_beit) and outputs
(tests/data/timm_beit_golden.npz) come from scripts/make_beit_golden.py,
with torch and timm; these tests need neither.
"""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file
from safetensors.numpy import save_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.checkpoints import loading
from vit_jax.convert import transform
from vit_jax.models import posemb_resize

BEIT = os.path.join(helpers.DATA, 'timm_beit')
GOLDEN = np.load(os.path.join(helpers.DATA, 'timm_beit_golden.npz'))
TOL = dict(rtol=1e-5, atol=1e-5)
HALF = ([0.5] * 3, [0.5] * 3)  # BEiT's; BEiT v2's timm.data IMAGENET_*
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
# (golden folder, preset, what config.json adds to the preset, mean and
# std recorded for predict).
CASES = [
    ('beit', 'BEiT-testing', None, HALF),
    ('beit_shared', 'BEiT-testing',
     {'classifier': 'token', 'fc_norm': False, 'posemb': 'learn',
      'transformer': {'relative_bias': 'shared'}}, HALF),
    ('beitv2', 'BEiTv2-testing', None, IMAGENET),
]
SIDE, RESIZED = 48, 64


@pytest.mark.parametrize('case,preset,overrides,normalization', CASES)
def test_gives_timms_outputs(tmp_path, case, preset, overrides,
                             normalization):
  """No flags: the preset from timm's architecture and the shapes; what
  config.json changes beside it recorded; timm's logits or features, at
  timm's size and, the tables resized, at another."""
  npz = str(tmp_path / f'{case}.npz')
  assert convert.convert(os.path.join(BEIT, case), npz) == preset
  recorded = transform.load_transform(npz)
  assert recorded.get('model') == overrides
  assert (recorded['mean'], recorded['std']) == normalization
  config = transform.model_config(models.MODEL_CONFIGS[preset], recorded)
  for side, golden in ((SIDE, case), (RESIZED, f'{case}_{RESIZED}')):
    model, params, _ = loading.load_model(config, npz, side)
    got = model.apply({'params': params}, GOLDEN['images'][:, :side, :side],
                      train=False)
    np.testing.assert_allclose(got, GOLDEN[golden], **TOL)


@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_one_call_from_the_hub_folder(tmp_path, monkeypatch, case):
  """`models.from_pretrained(folder)`: converted once, the model as timm
  computes it, at the side that its tables imply or at another."""
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path))
  folder = os.path.join(BEIT, case)
  pretrained = models.from_pretrained(folder)
  assert pretrained.transform.size == SIDE
  images = GOLDEN['images'][:, :SIDE, :SIDE]
  np.testing.assert_allclose(
      pretrained.model.apply({'params': pretrained.params}, images,
                             train=False), GOLDEN[case], **TOL)
  resized = models.from_pretrained(folder, image_size=RESIZED)
  np.testing.assert_allclose(
      resized.model.apply({'params': resized.params}, GOLDEN['images'],
                          train=False), GOLDEN[f'{case}_{RESIZED}'], **TOL)


@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_back_to_timm_bit_for_bit(tmp_path, case):
  """timm -> .npz -> timm gives timm's own state dict: gamma_1, q_bias and
  v_bias beside the fused qkv, the tables."""
  npz, back = str(tmp_path / 'w.npz'), str(tmp_path / 'w.safetensors')
  convert.convert(os.path.join(BEIT, case), npz)
  convert.convert(npz, back)
  want = load_file(os.path.join(BEIT, case, 'model.safetensors'))
  got = load_file(back)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize('name,new', [('4_6', (6, 6)), ('4_3', (3, 3)),
                                      ('4_4x6', (4, 6))])
def test_table_resized_as_timm(name, new):
  """timm's `resize_rel_pos_bias_table` (geometric offsets, linear), the
  class rows kept: growing, shrinking, to a grid that is not square."""
  old = GOLDEN[f'resize/{name}/old']
  got = posemb_resize.resize_relative_table(old, new, extra=3)
  np.testing.assert_allclose(got, GOLDEN[f'resize/{name}/new'], **TOL)
  stacked = posemb_resize.resize_relative_table(np.stack([old, -old]), new,
                                                extra=3)
  np.testing.assert_allclose(stacked[1], -got, **TOL)


def test_original_checkpoint_buffers_dropped(tmp_path):
  """The original's files hold `relative_position_index`: the model derives
  it."""
  folder = tmp_path / 'beit'
  shutil.copytree(os.path.join(BEIT, 'beit'), folder)
  state = load_file(str(folder / 'model.safetensors'))
  for i in range(2):
    state[f'blocks.{i}.attn.relative_position_index'] = np.zeros(
        (10, 10), np.int64)
  save_file(state, str(folder / 'model.safetensors'))
  assert convert.convert(str(folder), str(tmp_path / 'w.npz')) == (
      'BEiT-testing')


@pytest.mark.parametrize('setting,value,message', [
    ('use_shared_rel_pos_bias', True, 'beside use_rel_pos_bias'),
    ('swiglu_mlp', True, 'no BEiT has a SwiGLU'),
    ('global_pool', '', "global_pool=''"),
    ('some_new_setting', 1, 'does not know what it changes'),
])
def test_settings_that_change_the_computation_are_refused(
    tmp_path, setting, value, message):
  folder = tmp_path / 'beit'
  shutil.copytree(os.path.join(BEIT, 'beit'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'][setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'w.npz'))


def test_weights_alone_need_config(tmp_path):
  shutil.copy(os.path.join(BEIT, 'beit', 'model.safetensors'), tmp_path)
  with pytest.raises(ValueError, match="timm's Beit"):
    convert.convert(str(tmp_path / 'model.safetensors'),
                    str(tmp_path / 'w.npz'))


def test_testing_presets_count_as_timm():
  for preset in ('BEiT-testing', 'BEiTv2-testing'):
    model = models.get_model(preset, num_classes=1000)
    assert models.count_params(model) == GOLDEN[f'count/{preset}']


# timm architecture: (preset, image side, golden key): the real sizes, made
# outside CI by scripts/make_beit_golden.py --full_size.
FULL = [('beit_base_patch16_224', 'BEiT-B_16', 224, 'beit_base_patch16_224'),
        ('beit_base_patch16_224', 'BEiT-B_16', 384,
         'beit_base_patch16_224_384'),
        ('beit_large_patch16_224', 'BEiT-L_16', 224, 'beit_large_patch16_224'),
        ('beitv2_base_patch16_224', 'BEiTv2-B_16', 224,
         'beitv2_base_patch16_224')]


@pytest.mark.skipif('VIT_JAX_BEIT_FULL' not in os.environ,
                    reason='real-size timm folders, made outside CI by '
                    'scripts/make_beit_golden.py --full_size')
@pytest.mark.parametrize('architecture,preset,side,key', FULL)
def test_full_size_gives_timms_logits(tmp_path, monkeypatch, architecture,
                                      preset, side, key):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path))
  folder = os.environ['VIT_JAX_BEIT_FULL']
  golden = np.load(os.path.join(folder, 'golden.npz'))
  if key not in golden:
    pytest.skip(f'{folder} holds no {architecture} (--architectures)')
  pretrained = models.from_pretrained(os.path.join(folder, architecture),
                                      image_size=side)
  assert transform.load_transform(next(tmp_path.rglob('*.npz')))[
      'model_name'] == preset
  got = pretrained.model.apply({'params': pretrained.params},
                               golden[f'images{side}'], train=False)
  error = np.abs(got - golden[key]).max() / np.abs(golden[key]).max()
  print(f'{preset} at {side} px: max |error| / max |output| = {error:.2e}')
  assert error < 1e-4
