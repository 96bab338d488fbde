"""timm's Swin Transformer converted, against the outputs that timm computed
itself (tests/data/timm_swin*, from scripts/make_swin_golden.py, with torch
and timm; these tests need neither)."""

import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import checkpoint  # the original's helpers: load_pretrained
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import swin as convert_swin

DATA = helpers.DATA
WEIGHTS = os.path.join(DATA, 'timm_swin.safetensors')
GOLDEN = np.load(os.path.join(DATA, 'timm_swin_golden.npz'))


def _apply(npz, side, name='Swin-testing', mutable=False):
  model = models.get_model(name, num_classes=10)
  params = files.load(npz)
  images = GOLDEN['images'][:, :side, :side]
  # Jitted: Swin's windows take seconds op by op.
  return jax.jit(lambda p, x: model.apply(
      {'params': p}, x, train=False,
      mutable=['intermediates'] if mutable else False))(params, images)


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  npz = str(tmp_path_factory.mktemp('swin') / 'swin.npz')
  assert convert.convert(WEIGHTS, npz) == 'Swin-testing'  # inferred
  return npz


@pytest.mark.parametrize('side', [64, 32])
def test_gives_timms_logits(converted, side):
  """64 px: every stage has shifted blocks; 32 px: the last stage is a
  single window, never shifted."""
  np.testing.assert_allclose(_apply(converted, side),
                             GOLDEN[f'logits{side}'], atol=1e-5, rtol=0)


def test_gives_timms_stage_features(converted):
  _, state = _apply(converted, 64, mutable=True)
  for i in range(4):
    (got,) = state['intermediates'][f'stage_{i}']
    # Unnormalized, up to ~14: float32 rounding is relative.
    np.testing.assert_allclose(got, GOLDEN[f'stage_{i}'], atol=1e-5, rtol=1e-5)


def test_round_trip_gives_timms_state(converted, tmp_path):
  back = str(tmp_path / 'back.safetensors')
  assert convert.convert(converted, back) == 'Swin-testing'
  want, got = load_file(WEIGHTS), load_file(back)
  want = {k: v for k, v in want.items() if not k.endswith(
      ('relative_position_index', 'attn_mask'))}
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_original_layout_is_read():
  """Microsoft's release merges patches at the end of a stage and names
  the head `head`: the same weights once moved."""
  state = load_file(WEIGHTS)
  moved = {k.replace('head.fc.', 'head.'): v for k, v in state.items()}
  moved = {(k.replace(f'layers.{i}.downsample', f'layers.{i - 1}.downsample')
            if k.startswith(f'layers.{i}.downsample') else k): v
           for k, v in moved.items() for i in [int(k.split('.')[1])
                                               if k.startswith('layers.')
                                               else 0]}
  a, b = convert_swin.timm_to_npz(state), convert_swin.timm_to_npz(moved)
  assert sorted(a) == sorted(b)


@pytest.mark.parametrize('name', ['7_12', '2_3'])
def test_resize_bias_table_as_timm(name):
  old, new = GOLDEN[f'{name}/old'], GOLDEN[f'{name}/new']
  window = (int(np.sqrt(new.shape[0])) + 1) // 2
  np.testing.assert_allclose(convert_swin.resize_bias_table(old, window),
                             new, atol=1e-5, rtol=1e-5)


def test_preset_of_another_window_resizes_tables(tmp_path):
  """Swin-B's 7 x 7 windows converted for Swin-B_384's 12 x 12."""
  flat = convert_swin.timm_to_npz(load_file(WEIGHTS))
  resized = convert_swin.fit_window(flat, 3)
  assert convert_swin.dims(resized)['window_size'] == 3
  table = 'layers_0/blocks_0/attn/relative_position_bias_table'
  assert resized[table].shape == (25, 1)
  assert resized['embedding/kernel'] is flat['embedding/kernel']


def test_fine_tuning_load_takes_a_new_head(converted):
  """The one loader (`checkpoint.load_pretrained`) fits a converted Swin:
  the model's fresh head, the file's body."""
  model = models.get_model('Swin-testing', num_classes=5)
  init = jax.jit(lambda: model.init(jax.random.key(0), GOLDEN['images'][:1],
                                    train=False))()
  params = checkpoint.load_pretrained(
      pretrained_path=converted, init_params=init['params'],
      model_config=models.MODEL_CONFIGS['Swin-testing'])
  assert params['head']['kernel'].shape == (32, 5)
  np.testing.assert_array_equal(params['norm']['scale'],
                                files.load(converted)['norm']['scale'])


def test_wrong_preset_is_refused(tmp_path):
  with pytest.raises(ValueError, match='which preset Swin-T is not'):
    convert.convert(WEIGHTS, str(tmp_path / 'x.npz'), 'Swin-T')


def test_unknown_key_is_named():
  state = dict(load_file(WEIGHTS), **{'layers.0.blocks.0.attn.q_norm.weight':
                                      np.ones(4, np.float32)})
  with pytest.raises(ValueError, match='q_norm'):
    convert_swin.timm_to_npz(state)


@pytest.mark.skipif('VIT_JAX_SWIN_FULL' not in os.environ,
                    reason='full-size check by hand (see the script)')
def test_full_size_swin_t():
  folder = os.environ['VIT_JAX_SWIN_FULL']
  golden = np.load(os.path.join(folder, 'golden.npz'))
  model = models.get_model('Swin-T', num_classes=1000)
  params = files.load(os.path.join(folder, 'swin_t.npz'))
  logits = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(
      params, golden['images'])
  np.testing.assert_allclose(logits, golden['logits'], rtol=1e-4, atol=1e-5)
