"""timm <-> .npz conversion, against logits that timm computed itself.

The golden files come from `scripts/make_timm_golden.py` (torch and timm);
these tests need neither.
"""

import os
import subprocess
import sys

from flax import traverse_util
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from vit_jax import checkpoint
from vit_jax import convert
from vit_jax import models

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = np.load(os.path.join(DATA, 'timm_logits.npz'))


def _logits(model, params):
  return np.asarray(model.apply({'params': params}, GOLDEN['images'],
                                train=False))


@pytest.mark.parametrize('name,preset', [('timm_vit', 'testing'),
                                         ('timm_mixer', 'Mixer-testing')])
def test_timm_to_npz_gives_timms_logits(tmp_path, name, preset):
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(os.path.join(DATA, f'{name}.safetensors'),
                         npz) == preset  # inferred from the shapes
  model = models.get_model(preset, num_classes=5)
  np.testing.assert_allclose(_logits(model, checkpoint.load(npz)),
                             GOLDEN[name], rtol=1e-4, atol=1e-5)


def test_gap_model(tmp_path):
  """Mean pooling of the encoder-normed tokens (timm: fc_norm=False)."""
  state = load_file(os.path.join(DATA, 'timm_vit_gap.safetensors'))
  flat = convert.timm_to_npz(state, heads=2)
  npz = tmp_path / 'gap.npz'
  checkpoint.save(traverse_util.unflatten_dict(flat, sep='/'), npz)
  model = models.get_model('testing', num_classes=5, classifier='gap')
  np.testing.assert_allclose(_logits(model, checkpoint.load(npz)),
                             GOLDEN['timm_vit_gap'], rtol=1e-4, atol=1e-5)
  assert flat.keys() >= {'Transformer/encoder_norm/scale', 'embedding/kernel'}
  assert 'cls' not in flat


def test_hybrid(tmp_path):
  """timm's ResNetV2 backbone -> conv_root, gn_root, block1/unit1/...

  timm standardizes kernels by sqrt(var + 1e-8) and normalizes groups with
  eps 1e-5, the original by std + 1e-5 and eps 1e-6: with kernels of
  std 0.3 the logits still agree to 1e-6 here.
  """
  state = load_file(os.path.join(DATA, 'timm_hybrid.safetensors'))
  flat = convert.timm_to_npz(state, heads=2)
  assert flat['block1/unit1/conv_proj/kernel'].shape == (1, 1, 64, 256)
  npz = tmp_path / 'hybrid.npz'
  checkpoint.save(traverse_util.unflatten_dict(flat, sep='/'), npz)
  assert np.load(npz)['gn_root/scale'].shape == (1, 1, 1, 64)  # published
  model = models.VisionTransformer(
      num_classes=5, patches={'size': (1, 1)}, hidden_size=32,
      transformer={'mlp_dim': 32, 'num_heads': 2, 'num_layers': 1,
                   'dropout_rate': 0., 'attention_dropout_rate': 0.},
      resnet={'num_layers': (1,), 'width_factor': 1})
  logits = np.asarray(model.apply({'params': checkpoint.load(npz)},
                                  GOLDEN['images64'], train=False))
  want = GOLDEN['timm_hybrid']
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
  back = convert.npz_to_timm(checkpoint.published_flat(checkpoint.load(npz)))
  assert sorted(back) == sorted(state)
  for key in state:
    np.testing.assert_array_equal(back[key], state[key], err_msg=key)


@pytest.mark.parametrize('name', ['timm_vit', 'timm_mixer'])
def test_npz_to_timm_round_trip(tmp_path, name):
  """Back to timm's layout: the same keys (none missing for timm's loader)
  and the same arrays as timm's own state dict."""
  source = os.path.join(DATA, f'{name}.safetensors')
  convert.convert(source, str(tmp_path / 'model.npz'))
  back = tmp_path / 'back.safetensors'
  convert.convert(str(tmp_path / 'model.npz'), str(back))
  want, got = load_file(source), load_file(str(back))
  assert sorted(got) == sorted(want)
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_command_line_and_errors(tmp_path):
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.convert',
       os.path.join(DATA, 'timm_vit.safetensors'), str(tmp_path / 'v.npz')],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert result.returncode == 0, result.stderr
  assert '(testing)' in result.stdout
  assert 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/' \
         'kernel' in np.load(tmp_path / 'v.npz').files
  with pytest.raises(ValueError, match='expected a .safetensors'):
    convert.read_timm(str(tmp_path / 'v.npz.txt'))
  state = load_file(os.path.join(DATA, 'timm_vit.safetensors'))
  state['fc_norm.weight'] = np.ones(10, np.float32)
  with pytest.raises(ValueError, match="'fc_norm.weight' has no counterpart"):
    convert.timm_to_npz(state, heads=2)
  flat = convert.timm_to_npz(load_file(os.path.join(
      DATA, 'timm_vit.safetensors')), heads=2)
  flat['embedding/kernel'] = np.zeros((3, 3, 3, 10), np.float32)
  with pytest.raises(ValueError, match='No preset has these shapes'):
    convert.infer_preset(flat)


def test_hub_name_fails_fast_offline(monkeypatch):
  import socket  # pylint: disable=g-import-not-at-top

  def unreachable(*args, **kw):
    raise OSError('Network is unreachable')

  monkeypatch.setattr(socket, 'create_connection', unreachable)
  with pytest.raises(ConnectionError, match='Cannot reach huggingface.co'):
    convert.convert('timm/vit_base_patch16_224.augreg_in21k', 'x.npz')


def test_what_timm_cannot_hold_is_refused(tmp_path):
  """timm's ViT has no representation layer: a .npz with pre_logits (the
  published i21k files) cannot go back to timm's layout, and says why."""
  convert.convert(os.path.join(DATA, 'timm_vit.safetensors'),
                  str(tmp_path / 'v.npz'))
  flat = dict(np.load(tmp_path / 'v.npz'))
  flat['pre_logits/kernel'] = np.zeros((10, 10), np.float32)
  with pytest.raises(ValueError, match="'pre_logits/kernel' has no "
                     'counterpart in timm'):
    convert.npz_to_timm(flat)


@pytest.mark.parametrize('name', ['ViT-B_16', 'ViT-S_16-gap-norep',
                                  'R26+ViT-S_32', 'R+ViT-Ti_16',
                                  'Mixer-B_16'])
def test_infer_preset_from_published_shapes(name):
  model = models.get_model(name, num_classes=10)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros((1, 224, 224, 3), np.float32),
      train=False))['params']
  flat = checkpoint.published_flat(shapes)
  assert convert.infer_preset(flat) == name


def test_pth_reads_tensors_and_refuses_pickled_objects(tmp_path):
  """Only where torch is installed (not in CI: it is an optional extra). In a
  process of its own: torch imported after TensorFlow can crash."""
  pytest.importorskip('torch')
  script = f"""
import torch, numpy as np, pytest
from safetensors.numpy import load_file
from vit_jax import convert
state = load_file({os.path.join(DATA, 'timm_vit.safetensors')!r})
torch.save({{k: torch.from_numpy(v) for k, v in state.items()}}, 'model.pth')
read = convert.read_timm('model.pth')
assert sorted(read) == sorted(state)
assert all(np.array_equal(read[k], state[k]) for k in state)
class Unsafe: pass
torch.save({{'model': state, 'extra': Unsafe()}}, 'unsafe.pth')
with pytest.raises(ValueError, match='pickled Python objects'):
  convert.read_timm('unsafe.pth')
print('ok')
"""
  result = subprocess.run([sys.executable, '-c', script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
  assert result.stdout.strip().endswith('ok'), result.stderr[-2000:]
