"""`--layout=transformers`: transformers' golden folders read into .npz and
written back, against the folders themselves; what transformers cannot
compute refused before anything is written.

The golden folders (tests/data/transformers) come from
scripts/make_transformers_golden.py; scripts/check_transformers_export.py
loads the written folders with transformers itself. These tests need
neither torch nor transformers.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax.convert import transform
from vit_jax.convert import transformers_config

FOLDERS = os.path.join(helpers.DATA, 'transformers')
_COMMON = ('architectures', 'model_type', 'num_channels', 'layer_norm_eps',
           'hidden_act', 'patch_size')
_VIT = _COMMON + ('hidden_size', 'num_hidden_layers', 'num_attention_heads',
                  'image_size')
_LABELS = ('id2label', 'label2id')
# golden folder: the config.json keys that the round trip keeps.
CASES = {
    'vit': _VIT + ('intermediate_size', 'qkv_bias') + _LABELS,
    'vit_model': _VIT + ('intermediate_size', 'qkv_bias',
                         'pooler_output_size', 'pooler_act'),
    'deit': _VIT + ('intermediate_size', 'qkv_bias') + _LABELS,
    'dinov2': _VIT + ('mlp_ratio', 'qkv_bias', 'use_swiglu_ffn'),
    'dinov2_registers': _VIT + ('mlp_ratio', 'qkv_bias', 'use_swiglu_ffn',
                                'num_register_tokens'),
    'clip_vision': _VIT + ('intermediate_size',),
    'clip_vision_projection': _VIT + ('intermediate_size', 'projection_dim'),
    'siglip_vision': _VIT + ('intermediate_size', 'vision_use_head'),
    'mae': _VIT + ('intermediate_size', 'qkv_bias'),
    # Its image_size is the eval side (the record's); it sizes no weights.
    'swin': _COMMON + ('embed_dim', 'depths', 'num_heads', 'window_size',
                       'mlp_ratio', 'qkv_bias', 'use_absolute_embeddings',
                       'hidden_size', 'num_layers') + _LABELS,
}
# What reading drops: DINOv2's mask token (its config says it has none).
DROPPED = {'dinov2': {'embeddings.mask_token'}}
# The registers' class entry, folded into the class token on reading and
# written back as zeros; their mask token, written as zeros.
FOLDED = ('embeddings.cls_token', 'embeddings.position_embeddings',
          'embeddings.mask_token')


def _read_json(folder, name):
  with open(os.path.join(folder, name)) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def exported(tmp_path_factory):
  """folder -> (.npz read from the golden folder, the folder written from
  it), each made once."""
  made = {}

  def export(folder):
    if folder not in made:
      work = tmp_path_factory.mktemp(folder)
      npz, out = str(work / f'{folder}.npz'), str(work / 'out')
      name = convert.convert(os.path.join(FOLDERS, folder), npz)
      assert convert.convert(npz, out, layout='transformers') == name
      made[folder] = npz, out
    return made[folder]

  return export


@pytest.mark.parametrize('folder', CASES)
def test_weights_come_back(exported, folder):
  """The same names (less what reading drops) and values."""
  _, out = exported(folder)
  original = load_file(os.path.join(FOLDERS, folder, 'model.safetensors'))
  written = load_file(os.path.join(out, 'model.safetensors'))
  assert written.keys() == original.keys() - DROPPED.get(folder, set())
  for key, value in written.items():
    assert value.dtype == np.float32, key
    if folder == 'dinov2_registers' and key in FOLDED:
      continue
    np.testing.assert_allclose(value, original[key], rtol=1e-6, atol=0,
                               err_msg=key)


def test_registers_class_entry_is_folded(exported):
  """Class token plus its table entry: the same sum, the entry now zero;
  the mask token (unused without masking) zero."""
  _, out = exported('dinov2_registers')
  original = load_file(os.path.join(FOLDERS, 'dinov2_registers',
                                    'model.safetensors'))
  written = load_file(os.path.join(out, 'model.safetensors'))
  table, token = 'embeddings.position_embeddings', 'embeddings.cls_token'
  np.testing.assert_allclose(
      written[token][:, 0] + written[table][:, 0],
      original[token][:, 0] + original[table][:, 0], rtol=1e-6, atol=1e-7)
  np.testing.assert_array_equal(written[table][:, 0], 0)
  np.testing.assert_array_equal(written[table][:, 1:], original[table][:, 1:])
  np.testing.assert_array_equal(written['embeddings.mask_token'], 0)


@pytest.mark.parametrize('folder', CASES)
def test_config_comes_back(exported, folder):
  _, out = exported(folder)
  keys = CASES[folder]
  written = _read_json(out, 'config.json')
  original = _read_json(os.path.join(FOLDERS, folder), 'config.json')
  assert {k: written.get(k) for k in keys} == {k: original[k] for k in keys}


@pytest.mark.parametrize('folder', CASES)
def test_preprocessor_comes_back(exported, folder):
  """The written processor reads as the recorded eval transform, which the
  golden processor's is."""
  npz, out = exported(folder)
  written = transformers_config.eval_transform(
      _read_json(out, 'preprocessor_config.json'))
  original = transformers_config.eval_transform(
      _read_json(os.path.join(FOLDERS, folder), 'preprocessor_config.json'))
  recorded = transform.load_transform(npz)
  assert written == original
  assert written == {k: recorded[k] for k in written}


def _copy(npz, dst_dir, name, **model):
  """`npz` and its record, as `name`, with `model` overrides recorded."""
  dst = os.path.join(dst_dir, f'{name}.npz')
  shutil.copy(npz, dst)
  record = transform.load_transform(npz)
  record['model'] = dict(record.get('model') or {}, **model)
  transform.save_transform(dst, record)
  return dst


@pytest.mark.parametrize('override,named', [
    ({'classifier': 'gap'}, "classifier='gap'"),
    ({'fc_norm': True}, 'fc_norm=True'),
    ({'transformer': {'qkv_bias': 'qv'}}, "transformer.qkv_bias='qv'"),
    ({'transformer': {'layerscale_init': 0.1}},
     'transformer.layerscale_init=0.1'),
    ({'posemb': 'sincos2d'}, "posemb='sincos2d'"),
])
def test_refuses_what_transformers_cannot_compute(exported, tmp_path,
                                                  override, named):
  """One ValueError naming the setting; no folder."""
  npz, _ = exported('vit')
  vit = _copy(npz, tmp_path, 'vit', **override)
  out = tmp_path / 'out'
  with pytest.raises(ValueError, match='testing') as error:
    convert.convert(vit, str(out), layout='transformers')
  assert named in str(error.value)
  assert not out.exists()


def test_refuses_a_family_without_architecture(tmp_path):
  npz = str(tmp_path / 'mixer.npz')
  convert.convert(os.path.join(helpers.DATA, 'timm_mixer.safetensors'), npz)
  with pytest.raises(ValueError, match='Mixer-testing is of the Mixer family'):
    convert.convert(npz, str(tmp_path / 'out'), layout='transformers')
  assert not (tmp_path / 'out').exists()


def test_refuses_a_projection_with_bias(exported, tmp_path):
  """CLIP's visual_projection has no bias."""
  npz, _ = exported('clip_vision_projection')
  with np.load(npz) as z:
    flat = dict(z)
  flat['head/bias'] = np.ones_like(flat['head/bias'])
  biased = str(tmp_path / 'biased.npz')
  np.savez(biased, **flat)
  shutil.copy(transform.transform_path(npz), transform.transform_path(biased))
  with pytest.raises(ValueError, match='a head bias'):
    convert.convert(biased, str(tmp_path / 'out'), layout='transformers')


def test_layout_needs_an_npz(tmp_path):
  with pytest.raises(ValueError, match='is no .npz'):
    convert.convert(os.path.join(FOLDERS, 'vit'), str(tmp_path / 'out'),
                    layout='transformers')


def test_vit_without_head_or_pooler(exported, tmp_path):
  """A ViTModel whose config has no pooler (add_pooling_layer=False)."""
  npz, _ = exported('vit')
  with np.load(npz) as z:
    flat = {k: z[k] for k in z.files if not k.startswith('head/')}
  headless = str(tmp_path / 'headless.npz')
  np.savez(headless, **flat)
  shutil.copy(transform.transform_path(npz),
              transform.transform_path(headless))
  out = str(tmp_path / 'out')
  convert.convert(headless, out, layout='transformers')
  config = _read_json(out, 'config.json')
  assert config['architectures'] == ['ViTModel']
  assert 'pooler_output_size' not in config and 'id2label' not in config
  written = load_file(os.path.join(out, 'model.safetensors'))
  assert not any(k.startswith(('pooler.', 'classifier.')) for k in written)


def test_without_record_the_presets_transform(exported, tmp_path):
  """No record: the preset's settings, normalization and native side."""
  npz, _ = exported('siglip_vision')
  bare = str(tmp_path / 'bare.npz')
  shutil.copy(npz, bare)
  out = str(tmp_path / 'out')
  assert convert.convert(bare, out, layout='transformers') == 'SigLIP-testing'
  processor = transformers_config.eval_transform(
      _read_json(out, 'preprocessor_config.json'))
  assert processor == dict(input_size=[3, 224, 224], crop_pct=1.0,
                           crop_mode='squash', interpolation='bilinear',
                           mean=[0.5] * 3, std=[0.5] * 3)
  assert _read_json(out, 'config.json')['hidden_act'] == 'gelu_pytorch_tanh'


def test_border_crop_is_refused():
  spec = transform.Transform(size=224, crop_pct=0.9, crop_mode='border')
  with pytest.raises(ValueError, match="crop_mode 'border'"):
    transformers_config.preprocessor_json(spec)


def test_command_line(exported, tmp_path):
  npz, _ = exported('swin')
  out = tmp_path / 'swin'
  subprocess.run([sys.executable, '-m', 'vit_jax.convert', npz, str(out),
                  '--layout=transformers'], check=True, cwd=helpers.ROOT,
                 capture_output=True)
  assert sorted(os.listdir(out)) == ['config.json', 'model.safetensors',
                                     'preprocessor_config.json']
  assert _read_json(out, 'config.json')['architectures'] == [
      'SwinForImageClassification']
