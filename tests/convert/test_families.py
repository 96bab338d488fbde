"""timm's CLIP, SigLIP, EVA-02 and DINOv3 towers converted both ways, against
the outputs that timm computed itself; big_vision's SigLIP .npz read as
published.

The golden folders (tests/data/timm_families) and outputs
(tests/data/timm_families_golden.npz) come from
scripts/make_family_golden.py, with torch and timm; these tests need
neither.
"""

import json
import os
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import transform

DATA = helpers.DATA
FAMILIES = os.path.join(DATA, 'timm_families')
GOLDEN = np.load(os.path.join(DATA, 'timm_families_golden.npz'))
# timm.data's OPENAI_CLIP_MEAN/STD, IMAGENET_DEFAULT_*, and SigLIP's 0.5.
CLIP = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258,
                                              0.27577711])
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
HALF = ([0.5] * 3, [0.5] * 3)
# (golden folder, preset, image side, what config.json adds to the preset,
# mean and std recorded for predict).
CASES = [
    ('clip', 'CLIP-testing', 64, None, CLIP),
    ('clip_quickgelu', 'CLIP-testing-quickgelu', 64, None, CLIP),
    # timm computes SigLIP's GELU exactly; big_vision's weights, the tanh.
    ('siglip', 'SigLIP-testing', 64,
     {'transformer': {'gelu_approximate': False}}, HALF),
    ('siglip_gap', 'SigLIP-testing-gap', 64,
     {'transformer': {'gelu_approximate': False}}, HALF),
    ('eva02', 'EVA02-testing', 56, None, CLIP),
    ('eva02_mlpnorm', 'EVA02-testing', 56,
     {'transformer': {'mlp_norm': True}}, CLIP),
    ('dinov3', 'DINOv3-testing', 64, None, IMAGENET),
    ('dinov3_qkvb', 'DINOv3-testing-qkvb', 64, None, IMAGENET),
    # The original DINOv3's class token, as config.json says.
    ('dinov3_token', 'DINOv3-testing', 64, {'classifier': 'token'},
     IMAGENET),
]


def _config(preset, overrides):
  config = models.MODEL_CONFIGS[preset].to_dict()
  for key, value in (overrides or {}).items():
    config[key] = dict(config[key], **value) if isinstance(value,
                                                           dict) else value
  return config


def _outputs(npz, config, side):
  model, params, _ = loading.load_model(config, npz, side)
  return np.asarray(model.apply({'params': params},
                                GOLDEN['images'][:, :side, :side],
                                train=False))


@pytest.mark.parametrize('case,preset,side,overrides,normalization', CASES)
def test_gives_timms_outputs(tmp_path, case, preset, side, overrides,
                             normalization):
  """No flags: the preset from timm's architecture and the shapes; what
  config.json changes beside it recorded; timm's logits or features."""
  npz = str(tmp_path / f'{case}.npz')
  assert convert.convert(os.path.join(FAMILIES, case), npz) == preset
  recorded = transform.load_transform(npz)
  assert recorded.get('model') == overrides
  assert (recorded['mean'], recorded['std']) == normalization
  got = _outputs(npz, _config(preset, overrides), side)
  np.testing.assert_allclose(got, GOLDEN[case], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case', [c[0] for c in CASES])
def test_back_to_timm_bit_for_bit(tmp_path, case):
  """timm -> .npz -> timm gives timm's own state dict: its names (Eva's
  fused or separate projections, q and v biases, fc1_g/fc1_x) and values."""
  npz, back = str(tmp_path / 'w.npz'), str(tmp_path / 'w.safetensors')
  convert.convert(os.path.join(FAMILIES, case), npz)
  convert.convert(npz, back)
  want, got = load_file(os.path.join(FAMILIES, case, 'model.safetensors')), (
      load_file(back))
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


@pytest.mark.parametrize('case,setting,value,message', [
    ('eva02', 'qk_norm', True, 'qk_norm=True .* normalizes queries and keys'),
    ('eva02', 'rope_type', 'mixed', "rope_type='mixed'"),
    ('dinov3', 'use_post_norm', True, 'use_post_norm=True .* post-norm'),
    ('dinov3', 'attn_type', 'diff', "attn_type='diff'"),
    ('siglip', 'class_token', True, "class_token=True .* MAP head"),
    ('clip', 'qk_norm', True, 'qk_norm=True'),
    ('eva02', 'some_new_setting', 1, 'does not know what it changes'),
])
def test_settings_that_change_the_computation_are_refused(
    tmp_path, case, setting, value, message):
  folder = tmp_path / case
  shutil.copytree(os.path.join(FAMILIES, case), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'][setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'w.npz'))


def _big_vision_layout(flat):
  """Converted SigLIP names as big_vision publishes a two-tower model
  (models/vit.py, models/proj/image_text/two_towers.py): under params/img/,
  `pos_embedding` at the tower's top, Linen names in the blocks, stacked
  by `scan`; bfloat16 arrays."""
  linen = {'MultiHeadDotProductAttention_1': 'MultiHeadDotProductAttention_0',
           'LayerNorm_2': 'LayerNorm_1', 'MlpBlock_3': 'MlpBlock_0'}
  blocks, out = {}, {}
  for key, value in flat.items():
    if key == 'Transformer/posembed_input/pos_embedding':
      key = 'pos_embedding'
    parts = key.split('/')
    if len(parts) > 2 and parts[1].startswith('encoderblock_'):
      name = '/'.join([linen.get(parts[2], parts[2])] + parts[3:])
      blocks.setdefault(name, {})[int(parts[1].split('_')[1])] = value
    else:
      out[f'params/img/{key}'] = value
  for name, layers in blocks.items():
    out[f'params/img/Transformer/encoderblock/{name}'] = np.stack(
        [layers[i] for i in sorted(layers)])
  out.update({'params/txt/Embed_0/embedding': np.ones((7, 32)),
              'params/t': np.zeros(()), 'params/b': np.zeros(())})
  return {k: np.asarray(v).astype(ml_dtypes.bfloat16) for k, v in out.items()}


def test_big_vision_siglip_npz_as_published(tmp_path):
  """The image tower of big_vision's SigLIP .npz (bfloat16, scanned,
  params/img/) loads by the preset's name: its parameters are the
  converted timm ones rounded to bfloat16, and so are its features."""
  npz = str(tmp_path / 'timm.npz')
  convert.convert(os.path.join(FAMILIES, 'siglip'), npz)
  flat = files.published_flat(files.load(npz))
  big_vision = str(tmp_path / 'siglip_bv.npz')
  np.savez(big_vision, **_big_vision_layout(flat))
  assert np.load(big_vision)['params/t'].dtype == np.dtype('V2')

  config = _config('SigLIP-testing', {'transformer': {
      'gelu_approximate': False}})
  model, params, side = loading.load_model(config, big_vision)
  assert side == 64
  got = files.published_flat(params)
  assert sorted(got) == sorted(flat)
  for key, value in flat.items():
    rounded = value.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got[key], rounded, err_msg=key)
  # And on to timm: the image tower, as timm's SigLIP names it.
  back = str(tmp_path / 'siglip.safetensors')
  assert convert.convert(big_vision, back) == 'SigLIP-testing'
  want = load_file(os.path.join(FAMILIES, 'siglip', 'model.safetensors'))
  assert sorted(load_file(back)) == sorted(want)

  # timm's features, but for the weights' bfloat16 rounding (2**-9).
  features = model.apply({'params': params}, GOLDEN['images'], train=False)
  error = np.linalg.norm(features - GOLDEN['siglip'], axis=-1)
  assert np.all(error < 0.03 * np.linalg.norm(GOLDEN['siglip'], axis=-1))
