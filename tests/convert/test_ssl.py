"""timm's DINOv2 (with registers, with SwiGLU), DeiT III and MAE ViTs
converted, against the outputs that timm computed itself.

The golden folders (tests/data/timm_ssl) and outputs
(tests/data/timm_ssl_golden.npz) come from scripts/make_ssl_golden.py, with
torch and timm; these tests need neither.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.models import posemb_resize

DATA = helpers.DATA
SSL = os.path.join(DATA, 'timm_ssl')
GOLDEN = np.load(os.path.join(DATA, 'timm_ssl_golden.npz'))
# (golden folder, preset, image side, head): features unless a head.
CASES = [('dinov2', 'DINOv2-testing', 56, None),
         ('dinov2_reg4', 'DINOv2-testing-reg4', 56, None),
         ('dinov2_swiglu', 'DINOv2-testing', 56, None),
         ('deit3', 'DeiT3-testing', 64, 5),
         ('mae', 'MAE-testing', 64, None)]
IMAGENET = dict(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def _outputs(npz, preset, side, num_classes, model_config=None,
             resize_method=None):
  """The converted file run by the preset (plus `model_config`) at `side`
  px, loaded by `loading.load_params` (which resizes the table)."""
  model = models.get_model(preset, num_classes=num_classes,
                           **(model_config or {}))
  config = dict(models.MODEL_CONFIGS[preset].to_dict(), **(model_config or {}))
  images = GOLDEN['images'][:, :side, :side]
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), images, train=False))['params']
  params = loading.load_params(npz, init_params=shapes,
                                  model_config=config,
                                  resize_method=resize_method)
  return np.asarray(model.apply({'params': params}, images, train=False))


def _converted(tmp_path, case, model_name=None):
  npz = str(tmp_path / f'{case}.npz')
  return npz, convert.convert(os.path.join(SSL, case), npz, model_name)


@pytest.mark.parametrize('case,preset,side,head', CASES)
def test_gives_timms_outputs(tmp_path, case, preset, side, head):
  """No flags: the preset is inferred (MAE's from timm's tag 'mae'); only
  the SwiGLU MLP, which no small preset has, is recorded beside it."""
  npz, name = _converted(tmp_path, case)
  assert name == preset
  recorded = transform.load_transform(npz)
  assert {k: recorded[k] for k in IMAGENET} == IMAGENET
  overrides = recorded.get('model')
  if case == 'dinov2_swiglu':
    assert overrides == {'transformer': {'swiglu': True}}
    overrides = {'transformer': dict(
        models.MODEL_CONFIGS[preset].transformer.to_dict(), swiglu=True)}
  else:
    assert overrides is None
  got = _outputs(npz, preset, side, head, overrides)
  np.testing.assert_allclose(got, GOLDEN[case], rtol=1e-5, atol=1e-5)


def test_mae_by_model_name(tmp_path):
  npz, name = _converted(tmp_path, 'mae', 'MAE-testing')
  assert name == 'MAE-testing'
  np.testing.assert_allclose(_outputs(npz, 'MAE-testing', 64, None),
                             GOLDEN['mae'], rtol=1e-5, atol=1e-5)


def test_dinov2_at_another_size(tmp_path):
  """At 28 px (2x2 patches) the 4x4 table is resized as timm resizes it:
  the preset's 'bicubic_antialias', the default of `load_params`; jax's
  plain bicubic misses timm's features."""
  npz, _ = _converted(tmp_path, 'dinov2')
  np.testing.assert_allclose(_outputs(npz, 'DINOv2-testing', 28, None),
                             GOLDEN['dinov2_28'], rtol=1e-5, atol=1e-5)
  plain = _outputs(npz, 'DINOv2-testing', 28, None, resize_method='bicubic')
  assert np.abs(plain - GOLDEN['dinov2_28']).max() > 1e-3


@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_round_trip(tmp_path, case):
  """.npz back to timm's layout: timm's own state dict, key for key."""
  npz, name = _converted(tmp_path, case)
  back = str(tmp_path / 'back.safetensors')
  assert convert.convert(npz, back) == name
  want, got = load_file(os.path.join(SSL, case, 'model.safetensors')), \
      load_file(back)
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize('case,preset', [('dinov2', 'DINOv2-testing'),
                                         ('dinov2_reg4', 'DINOv2-testing-reg4'),
                                         ('deit3', 'DeiT3-testing'),
                                         ('mae', 'MAE-testing')])
def test_weights_alone(tmp_path, case, preset):
  """Without config.json the keys and the table's length tell the preset."""
  shutil.copy(os.path.join(SSL, case, 'model.safetensors'), tmp_path)
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(str(tmp_path / 'model.safetensors'), npz) == preset
  assert (transform.load_transform(npz) or {}).get('model') is None


@pytest.mark.parametrize('case,preset', [
    ('dinov2', 'DINOv2-testing'), ('dinov2_reg4', 'DINOv2-testing-reg4')])
@pytest.mark.parametrize('grid', [(2, 2), (37, 37), (16, 16)])
def test_resized_table_is_recognized(case, preset, grid):
  flat = convert.timm_to_npz(
      load_file(os.path.join(SSL, case, 'model.safetensors')), heads=2)
  name = 'Transformer/posembed_input/pos_embedding'
  flat[name] = posemb_resize.resize_posemb_grid(
      flat[name], new_grid=grid, has_class_token='reg' not in flat,
      method='bicubic_antialias')
  assert convert.infer_preset(flat) == preset


@pytest.mark.parametrize('name', ['DINOv2-S_14', 'DINOv2-S_14-reg4',
                                  'DINOv2-g_14', 'DINOv2-g_14-reg4',
                                  'DeiT3-S_16', 'DeiT3-H_14'])
@pytest.mark.parametrize('grid', [16, 37])  # 224 and 518 px at patch 14
def test_infer_preset_from_published_shapes(name, grid):
  model = models.get_model(name, num_classes=None)
  side = grid * models.MODEL_CONFIGS[name].patches.size[0]
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros((1, side, side, 3), np.float32),
      train=False))['params']
  assert convert.infer_preset(files.published_flat(shapes)) == name


def _edited(tmp_path, case, **model_args):
  folder = tmp_path / case
  shutil.copytree(os.path.join(SSL, case), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'].update(model_args)
  (folder / 'config.json').write_text(json.dumps(config))
  return str(folder)


def test_inconsistent_files_are_refused(tmp_path):
  dst = str(tmp_path / 'out.npz')
  with pytest.raises(ValueError, match=r"config.json does not describe its "
                     r'weights: it says registers 4 \(weights: 0\)'):
    convert.convert(_edited(tmp_path, 'dinov2', reg_tokens=4), dst)
  state = load_file(os.path.join(SSL, 'dinov2', 'model.safetensors'))
  del state['blocks.1.ls2.gamma']
  with pytest.raises(ValueError, match='lacks what a vit_jax ViT has: '
                     'Transformer/encoderblock_1/ls2/scale'):
    converter._check_complete(convert.timm_to_npz(state, heads=2), "x")
  with pytest.raises(ValueError, match=r'--model_name=DeiT3-testing does not '
                     r'fit the checkpoint, which has patch \(14, 14\)'):
    convert.convert(os.path.join(SSL, 'dinov2'), dst, 'DeiT3-testing')
  assert not os.path.exists(dst)


def test_timm_names_of_the_new_layers(tmp_path):
  npz, _ = _converted(tmp_path, 'dinov2_reg4')
  flat = dict(np.load(npz))
  assert flat['reg'].shape == (1, 4, 32)
  assert flat['Transformer/posembed_input/pos_embedding'].shape == (1, 16, 32)
  assert flat['Transformer/encoderblock_1/ls2/scale'].shape == (32,)
  npz, _ = _converted(tmp_path, 'dinov2_swiglu')
  kernel = 'Transformer/encoderblock_0/MlpBlock_3/Dense_{}/kernel'
  assert np.load(npz)[kernel.format(0)].shape == (32, 128)
  assert np.load(npz)[kernel.format(1)].shape == (64, 32)


FULL = [('dinov2', 'DINOv2-S_14', 518, None),
        ('dinov2_reg4', 'DINOv2-S_14-reg4', 518, None),
        ('deit3', 'DeiT3-S_16', 224, 1000),
        ('mae', 'MAE-B_16', 224, None)]


@pytest.mark.skipif('VIT_JAX_SSL_FULL' not in os.environ,
                    reason='real-size timm folders, made outside CI by '
                    'scripts/make_ssl_golden.py --full_size')
@pytest.mark.parametrize('case,preset,side,head', FULL)
def test_full_size_gives_timms_outputs(tmp_path, case, preset, side, head):
  folder = os.environ['VIT_JAX_SSL_FULL']
  golden = np.load(os.path.join(folder, 'golden.npz'))
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(os.path.join(folder, case), npz) == preset
  sides = [(side, case)] + ([(224, 'dinov2_224')] if case == 'dinov2' else [])
  for size, key in sides:
    images = golden[f'images{size}']
    model = models.get_model(preset, num_classes=head)
    shapes = jax.eval_shape(
        lambda x: model.init(jax.random.key(0), x, train=False), images)
    params = loading.load_params(npz, init_params=shapes['params'],
                                    model_config=models.MODEL_CONFIGS[preset])
    got = np.asarray(model.apply({'params': params}, images, train=False))
    error = np.abs(got - golden[key]).max() / np.abs(golden[key]).max()
    print(f'{preset} at {size} px: max |error| / max |output| = {error:.2e}')
    assert error < 1e-4
