"""timm <-> .npz conversion, against logits that timm computed itself.

The golden files come from `scripts/make_timm_golden.py` (state dicts,
GELU's tanh form), `scripts/make_timm_config_golden.py` (folders written
by timm's `save_for_hf`, timm's default exact GELU) and
`scripts/make_deit_golden.py` (DeiT, plain and distilled), with torch and
timm; these tests need neither.
"""

import json
import os
import re
import shutil
import subprocess
import sys

from flax import traverse_util
import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import converter
from vit_jax.convert import preset_inference
from vit_jax.convert import transform

DATA = helpers.DATA
# One worker runs the tests of `cli`'s process, so that it starts once.
pytestmark = pytest.mark.xdist_group('convert_cli')
GOLDEN = np.load(os.path.join(DATA, 'timm_logits.npz'))


def _logits(model, params):
  return np.asarray(model.apply({'params': params}, GOLDEN['images'],
                                train=False))


@pytest.mark.parametrize('name,preset', [('timm_vit', 'testing'),
                                         ('timm_mixer', 'Mixer-testing')])
def test_timm_to_npz_gives_timms_logits(tmp_path, name, preset):
  """Weights alone; timm ran them with GELU's tanh form, the presets' own
  (the exact form, timm's default, is tested on the folders below)."""
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(os.path.join(DATA, f'{name}.safetensors'),
                         npz) == preset  # inferred from the shapes
  model = models.get_model(preset, num_classes=5)
  np.testing.assert_allclose(_logits(model, files.load(npz)),
                             GOLDEN[name], rtol=1e-4, atol=1e-5)


def test_gap_model(tmp_path):
  """Mean pooling of the encoder-normed tokens (timm: fc_norm=False)."""
  state = load_file(os.path.join(DATA, 'timm_vit_gap.safetensors'))
  flat = convert.timm_to_npz(state, heads=2)
  npz = tmp_path / 'gap.npz'
  files.save(traverse_util.unflatten_dict(flat, sep='/'), npz)
  model = models.get_model('testing', num_classes=5, classifier='gap')
  np.testing.assert_allclose(_logits(model, files.load(npz)),
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
  files.save(traverse_util.unflatten_dict(flat, sep='/'), npz)
  assert np.load(npz)['gn_root/scale'].shape == (1, 1, 1, 64)  # published
  model = models.VisionTransformer(
      num_classes=5, patches={'size': (1, 1)}, hidden_size=32,
      transformer={'mlp_dim': 32, 'num_heads': 2, 'num_layers': 1,
                   'dropout_rate': 0., 'attention_dropout_rate': 0.},
      resnet={'num_layers': (1,), 'width_factor': 1})
  logits = np.asarray(model.apply({'params': files.load(npz)},
                                  GOLDEN['images64'], train=False))
  want = GOLDEN['timm_hybrid']
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
  back = convert.npz_to_timm(files.published_flat(files.load(npz)))
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


def test_command_line_and_errors(cli, tmp_path):
  code, stdout, stderr, folder = cli['good']
  assert code == 0, stderr
  assert '(testing)' in stdout
  assert 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/' \
         'kernel' in np.load(folder / 'v.npz').files
  with pytest.raises(ValueError, match='expected a .safetensors'):
    convert.read_timm(str(tmp_path / 'v.npz.txt'))
  state = load_file(os.path.join(DATA, 'timm_vit.safetensors'))
  state['blocks.0.attn.norm.weight'] = np.ones(10, np.float32)
  with pytest.raises(ValueError, match="'blocks.0.attn.norm.weight' has no "
                     'counterpart'):
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


CLI_ERRORS = [
    # The README's command, offline.
    ('timm/vit_base_patch16_224.augreg2_in21k_ft_in1k', 'ViT-B_16.npz',
     'Error: Cannot reach huggingface.co to fetch timm/vit_base_patch16_224.'
     'augreg2_in21k_ft_in1k (HF_HUB_OFFLINE is set).'),
    ('corrupt.safetensors', 'v.npz',
     'Error: Cannot read corrupt.safetensors: not a safetensors file'),
    (os.path.join(DATA, 'timm_vit.safetensors'), 'nodir/v.npz',
     'Error: nodir/v.npz: the folder '),
    (os.path.join(DATA, 'timm_vit.safetensors'), 'v.safetensors',
     'Error: v.safetensors: converting '),
]


@pytest.fixture(scope='module')
def cli(tmp_path_factory):
  """{name: (exit code, stdout, stderr, its folder)} of convert's command
  lines, all in one process (`helpers.cli_runs`), offline: the good one
  ('good', into its folder), each of CLI_ERRORS in a folder of its own
  that holds a corrupt.safetensors (named by its destination), and the
  refusal of timm's qk_norm ('refused')."""
  runs, folders = {}, {}
  folders['good'] = tmp_path_factory.mktemp('good')
  runs['good'] = ('vit_jax.convert', [
      os.path.join(DATA, 'timm_vit.safetensors'), folders['good'] / 'v.npz'])
  for src, dst, _ in CLI_ERRORS:
    folders[dst] = tmp_path_factory.mktemp('error')
    (folders[dst] / 'corrupt.safetensors').write_bytes(
        b'not safetensors at all')
    runs[dst] = ('vit_jax.convert', [src, dst], folders[dst])
  folders['refused'] = tmp_path_factory.mktemp('refused')
  runs['refused'] = ('vit_jax.convert', [
      os.path.join(HF, 'qk_norm'), folders['refused'] / 'v.npz'])
  results = helpers.cli_runs(runs.values(), env=dict(
      os.environ, HF_HUB_OFFLINE='1', TF_ENABLE_ONEDNN_OPTS='1'))
  return {name: (r['code'], r['stdout'], r['stderr'], folders[name])
          for name, r in zip(runs, results)}


@pytest.mark.parametrize('src,dst,message', CLI_ERRORS)
def test_command_line_errors_are_one_line(cli, src, dst, message):
  del src  # the run's, in `cli`
  code, _, stderr, folder = cli[dst]
  assert code == 1
  lines = stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith(message), stderr
  assert os.listdir(folder) == ['corrupt.safetensors']


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
                                  'Mixer-B_16', 'DeiT-Ti_16-distilled'])
def test_infer_preset_from_published_shapes(name):
  model = models.get_model(name, num_classes=10)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros((1, 224, 224, 3), np.float32),
      train=False))['params']
  flat = files.published_flat(shapes)
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
with pytest.raises(ValueError, match='not only tensors'):
  convert.read_timm('unsafe.pth')
print('ok')
"""
  result = subprocess.run([sys.executable, '-c', script], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
  assert result.stdout.strip().endswith('ok'), result.stderr[-2000:]


# timm folders written by timm's own save_for_hf, and timm's logits
# (scripts/make_timm_config_golden.py); these use timm's default, exact GELU.
HF = os.path.join(DATA, 'timm_hf')
HF_GOLDEN = np.load(os.path.join(DATA, 'timm_hf_logits.npz'))


def _converted_logits(npz, model_name, gelu_approximate=None):
  """The converted file's logits, its model built as predict builds it:
  the preset with the recorded settings."""
  config = transform.model_config(models.MODEL_CONFIGS[model_name],
                                   transform.load_transform(npz))
  if gelu_approximate is not None:
    config['transformer']['gelu_approximate'] = gelu_approximate
  model = models.VisionTransformer(**dict(config, num_classes=5))
  return np.asarray(model.apply({'params': files.load(npz)},
                                HF_GOLDEN['images'], train=False))


@pytest.mark.parametrize('case,settings', [
    ('token', {'transformer': {'gelu_approximate': False}}),
    ('token_tanh', None),  # act_layer='gelu_tanh': the preset's own GELU
    ('token_fc_norm', {'transformer': {'gelu_approximate': False}}),
    ('gap', {'classifier': 'gap', 'transformer': {'gelu_approximate': False}}),
])
def test_timm_folder_gives_timms_logits(tmp_path, case, settings):
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(os.path.join(HF, case), npz) == 'testing'
  assert transform.load_transform(npz).get('model') == settings
  np.testing.assert_allclose(_converted_logits(npz, 'testing'),
                             HF_GOLDEN[case], rtol=1e-5, atol=1e-5)


def test_exact_gelu_is_needed(tmp_path):
  """timm's default GELU is the exact one: the tanh form misses its logits
  by far more than the tolerance that the exact one meets."""
  npz = str(tmp_path / 'model.npz')
  convert.convert(os.path.join(HF, 'token'), npz)
  tanh = _converted_logits(npz, 'testing', gelu_approximate=True)
  assert np.abs(tanh - HF_GOLDEN['token']).max() > 1e-4
  exact = _converted_logits(npz, 'testing')
  assert np.abs(exact - HF_GOLDEN['token']).max() < 1e-5


def test_avg_pooling_with_class_token(tmp_path):
  """timm averages the patch tokens and leaves out the class token:
  classifier 'token_gap' (EVA-02's and DINOv3's pooling) computes it; read
  without config.json, as token pooling, the logits are wrong."""
  npz = str(tmp_path / 'a.npz')
  assert convert.convert(os.path.join(HF, 'avg_cls'), npz) == 'testing'
  assert transform.load_transform(npz)['model']['classifier'] == 'token_gap'
  right = _converted_logits(npz, 'testing')
  assert np.abs(right - HF_GOLDEN['avg_cls']).max() < 1e-5
  shutil.copy(os.path.join(HF, 'avg_cls', 'model.safetensors'), tmp_path)
  npz = str(tmp_path / 'bare.npz')
  convert.convert(str(tmp_path / 'model.safetensors'), npz)
  wrong = _converted_logits(npz, 'testing')
  assert np.abs(wrong - HF_GOLDEN['avg_cls']).max() > 0.1


@pytest.mark.parametrize('case,setting', [
    ('qk_norm', 'qk_norm=True'),
    ('dynamic_img_size', 'dynamic_img_size=True'),
])
def test_what_vit_jax_cannot_compute_is_refused(tmp_path, case, setting):
  dst = tmp_path / 'model.npz'
  with pytest.raises(ValueError, match=re.escape(
      f'timm setting {setting} is not supported by vit_jax: ')):
    convert.convert(os.path.join(HF, case), str(dst))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('case,keys', [
    ('qk_norm', "'blocks.0.attn.q_norm.weight': a query/key norm .* "
                "config.json"),
    ('map', "'attn_pool.latent': attention pooling .* config.json"),
    ('pre_norm', "'norm_pre.weight': a pre-norm .* config.json"),
])
def test_weights_alone_name_what_has_no_counterpart(tmp_path, case, keys):
  shutil.copy(os.path.join(HF, case, 'model.safetensors'), tmp_path)
  with pytest.raises(ValueError, match=keys):
    convert.convert(str(tmp_path / 'model.safetensors'),
                    str(tmp_path / 'model.npz'))
  assert sorted(os.listdir(tmp_path)) == ['model.safetensors']


@pytest.mark.parametrize('case,want', [
    ('layerscale', {'transformer': {'layerscale_init': 1e-5}}),
    ('registers', {'num_registers': 1}),
    ('no_embed_class', {'posemb_prefix': False}),
    ('deit3', {'posemb_prefix': False,  # set by the architecture's entrypoint
               'transformer': {'layerscale_init': 1e-6}}),
    ('avg_fc_norm', {'classifier': 'gap', 'fc_norm': True}),  # timm's default
    # SigLIP's MAP head, CLIP's pre-norm and QuickGELU on a plain ViT (their
    # logits: tests/convert/test_families.py).
    ('map', {'classifier': 'map', 'transformer': {'gelu_approximate': False}}),
    ('pre_norm', {'patch_bias': False, 'transformer': {
        'gelu_approximate': False, 'pre_norm': True}}),
    ('quick_gelu', {'transformer': {'quick_gelu': True}}),
])
def test_timm_options_are_carried_over(case, want):
  """What used to be refused (LayerScale, registers, a table without the
  class entry, a norm after the mean, MAP, pre-norm, QuickGELU) maps to
  vit_jax's model options; the logits are checked on tests/data/timm_ssl
  and timm_families (tests/convert/test_ssl.py, test_families.py)."""
  with open(os.path.join(HF, case, 'config.json')) as f:
    got = convert.vit_overrides(convert.timm_settings(json.load(f)))
  for key, value in want.items():
    if isinstance(value, dict):
      assert {k: got[key][k] for k in value} == value
    else:
      assert got[key] == value


def test_weights_alone_without_a_class_position(tmp_path):
  """A square table with a class token: timm's no_embed_class."""
  shutil.copy(os.path.join(HF, 'no_embed_class', 'model.safetensors'),
              tmp_path)
  flat = convert.timm_to_npz(load_file(str(tmp_path / 'model.safetensors')),
                             heads=2)
  assert preset_inference.dims(flat)['posemb_prefix'] is False


def test_weights_alone_say_what_is_assumed(tmp_path, capsys):
  shutil.copy(os.path.join(HF, 'token', 'model.safetensors'), tmp_path)
  weights = str(tmp_path / 'model.safetensors')
  convert.convert(weights, str(tmp_path / 'model.npz'))
  err = capsys.readouterr().err
  assert f'Note: no config.json beside {weights}: assuming ' in err
  assert "global_pool='token'" in err and 'exact GELU' in err
  assert 'the 2 heads of testing' in err


def _edited_folder(tmp_path, case, **model_args):
  """A copy of timm folder `case`, its config.json's model_args changed."""
  folder = tmp_path / case
  root = DEIT if os.path.isdir(os.path.join(DEIT, case)) else HF
  shutil.copytree(os.path.join(root, case), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'].update(model_args)
  (folder / 'config.json').write_text(json.dumps(config))
  return str(folder)


def test_model_name_that_does_not_fit_writes_nothing(tmp_path):
  dst = tmp_path / 'out' / 'model.npz'
  dst.parent.mkdir()
  folder = os.path.join(HF, 'token')
  with pytest.raises(ValueError, match=r'--model_name=ViT-B_16 does not fit '
                     r'the checkpoint, which has width 10 \(ViT-B_16: 768\)'):
    convert.convert(folder, str(dst), 'ViT-B_16')
  with pytest.raises(ValueError, match='did you mean testing'):
    convert.convert(folder, str(dst), 'testin')
  # The heads, which the weights do not show, come from config.json.
  five_heads = _edited_folder(tmp_path, 'token', num_heads=5)
  with pytest.raises(ValueError, match=r'heads 5 \(testing: 2\)'):
    convert.convert(five_heads, str(dst), 'testing')
  assert not os.listdir(dst.parent)
  # No preset has 5 heads of width 10: a plain ViT, read as a custom one.
  assert convert.convert(five_heads, str(dst)) == 'ViT-custom'
  record = json.loads((dst.parent / 'model.transform.json').read_text())
  assert record['model']['transformer']['num_heads'] == 5


def test_config_that_timm_did_not_write_is_refused(tmp_path):
  dst = str(tmp_path / 'model.npz')
  with pytest.raises(ValueError, match='does not describe its weights: it '
                     r'says width 12 \(weights: 10\)'):
    convert.convert(_edited_folder(tmp_path, 'token', embed_dim=12), dst)
  with pytest.raises(ValueError, match=r"timm setting swap=1 is not supported"
                     " by vit_jax: vit_jax.convert does not know"):
    convert.convert(_edited_folder(tmp_path, 'gap', swap=1), dst)
  folder = tmp_path / 'siglip'
  shutil.copytree(os.path.join(HF, 'token'), folder)
  (folder / 'config.json').write_text(json.dumps(
      {'architecture': 'vit_base_patch16_rope_reg1_gap_256'}))
  with pytest.raises(ValueError, match="'vit_base_patch16_rope_reg1_gap_256' "
                     'is not one that vit_jax.convert knows'):
    convert.convert(str(folder), dst)
  mixer = tmp_path / 'mixer'
  mixer.mkdir()
  shutil.copy(os.path.join(DATA, 'timm_mixer.safetensors'),
              mixer / 'model.safetensors')
  (mixer / 'config.json').write_text(json.dumps(
      {'architecture': 'mixer_b16_224', 'model_args': {'num_blocks': 2}}))
  with pytest.raises(ValueError, match="act_layer='GELU' is not supported"):
    convert.convert(str(mixer), dst)
  assert not os.path.exists(dst)


def test_eval_transform_and_settings_are_recorded(tmp_path, capsys):
  dst = str(tmp_path / 'model.npz')
  convert.convert(os.path.join(HF, 'gap'), dst)
  recorded = transform.load_transform(dst)
  assert recorded['input_size'] == [3, 32, 32]
  assert recorded['crop_pct'] == 0.9 and recorded['interpolation'] == 'bicubic'
  assert recorded['mean'] == [0.5] * 3 and recorded['std'] == [0.5] * 3
  assert recorded['model'] == {'classifier': 'gap',
                               'transformer': {'gelu_approximate': False}}
  assert (f"Note: {dst} is testing with classifier='gap', "
          'transformer.gelu_approximate=False') in capsys.readouterr().err
  # Converted again, as a bare Mixer file: timm's default transform, and
  # nothing of the old record.
  convert.convert(os.path.join(DATA, 'timm_mixer.safetensors'), dst)
  assert transform.load_transform(dst) == {
      'crop_pct': 0.875, 'crop_mode': 'center', 'interpolation': 'bicubic',
      'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225],
      'model_name': 'Mixer-testing'}


def test_bin_needs_no_torch(monkeypatch, capfd):
  """torch's files are read without torch (`convert.torch_files`), as
  float32, without their position_ids buffers (an arange)."""
  monkeypatch.setitem(sys.modules, 'torch', None)
  state = convert.read_timm(os.path.join(DATA, 'torch_files', 'state.bin'))
  assert sorted(state) == ['bias', 'half', 'weight']
  assert all(v.dtype == np.float32 for v in state.values())
  assert '1 position_ids buffer(s) dropped' in capfd.readouterr().err


def test_refusal_on_the_command_line(cli):
  """One 'Error:' line, no traceback, nothing written."""
  code, _, stderr, folder = cli['refused']
  assert code == 1
  lines = [l for l in stderr.splitlines() if l.startswith('Error:')]
  assert lines == [l for l in stderr.splitlines()
                   if 'Traceback' in l or l.startswith('Error:')]
  assert lines[0].startswith('Error: timm setting qk_norm=True')
  assert not (folder / 'v.npz').exists()


# DeiT: timm's deit_tiny_patch16_224 and its distilled twin at the
# 'DeiT-testing' shapes, saved by save_for_hf (scripts/make_deit_golden.py).
DEIT = os.path.join(DATA, 'timm_deit')
DEIT_GOLDEN = np.load(os.path.join(DATA, 'timm_deit_logits.npz'))
DEIT_CASES = [('deit', 'DeiT-testing'),
              ('deit_distilled', 'DeiT-testing-distilled')]


def _deit_logits(npz, model_name):
  """Built as predict builds it: the preset, the recorded settings."""
  config = transform.model_config(models.MODEL_CONFIGS[model_name],
                                   transform.load_transform(npz))
  model = models.VisionTransformer(**dict(config, num_classes=5))
  return np.asarray(model.apply({'params': files.load(npz)},
                                DEIT_GOLDEN['images'], train=False))


@pytest.mark.parametrize('case,preset', DEIT_CASES)
def test_deit_folder_gives_timms_logits(tmp_path, case, preset):
  """The preset is inferred (the distillation token picks the distilled
  one) and computes as timm (exact GELU, the heads' mean): nothing to
  record beside the file but the transform."""
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(os.path.join(DEIT, case), npz) == preset
  assert 'model' not in transform.load_transform(npz)
  flat = np.load(npz)
  assert ('dist' in flat) == ('head_dist/kernel' in flat) == (
      case == 'deit_distilled')
  np.testing.assert_allclose(_deit_logits(npz, preset), DEIT_GOLDEN[case],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('case,preset', DEIT_CASES)
def test_deit_round_trip(tmp_path, case, preset):
  """.npz back to timm's layout: timm's own state dict, key for key."""
  npz = str(tmp_path / 'model.npz')
  convert.convert(os.path.join(DEIT, case), npz, preset)
  back = str(tmp_path / 'back.safetensors')
  assert convert.convert(npz, back) == preset
  want, got = load_file(os.path.join(DEIT, case, 'model.safetensors')), \
      load_file(back)
  assert sorted(got) == sorted(want)
  assert ('dist_token' in got) == (case == 'deit_distilled')
  for key in want:
    np.testing.assert_array_equal(got[key], want[key], err_msg=key)


def test_distilled_weights_alone(tmp_path):
  """Without config.json: the distillation token says how to pool."""
  shutil.copy(os.path.join(DEIT, 'deit_distilled', 'model.safetensors'),
              tmp_path)
  npz = str(tmp_path / 'model.npz')
  assert convert.convert(str(tmp_path / 'model.safetensors'),
                         npz) == 'DeiT-testing-distilled'
  np.testing.assert_allclose(
      _deit_logits(npz, 'DeiT-testing-distilled'),
      DEIT_GOLDEN['deit_distilled'], rtol=1e-5, atol=1e-5)


def test_distilled_or_not_must_fit(tmp_path):
  dst = str(tmp_path / 'model.npz')
  with pytest.raises(ValueError, match=r'--model_name=DeiT-testing does not '
                     r'fit the checkpoint, which has dist_token True '
                     r'\(DeiT-testing: False\)'):
    convert.convert(os.path.join(DEIT, 'deit_distilled'), dst, 'DeiT-testing')
  with pytest.raises(ValueError, match=r'dist_token False '
                     r'\(DeiT-testing-distilled: True\)'):
    convert.convert(os.path.join(DEIT, 'deit'), dst, 'DeiT-testing-distilled')
  folder = _edited_folder(tmp_path, 'deit_distilled', global_pool='avg')
  with pytest.raises(ValueError, match="timm setting global_pool='avg' is not "
                     'supported by vit_jax: the distilled heads read'):
    convert.convert(folder, dst)
  assert not os.path.exists(dst)


@pytest.mark.skipif('VIT_JAX_DEIT_FULL' not in os.environ,
                    reason='a real-size timm folder, made outside CI by '
                    'scripts/make_deit_golden.py --full_size')
def test_full_size_distilled_gives_timms_logits(tmp_path):
  folder = os.environ['VIT_JAX_DEIT_FULL']
  npz = str(tmp_path / 'deit.npz')
  convert.convert(folder, npz, 'DeiT-Ti_16-distilled')
  golden = np.load(os.path.join(folder, 'logits.npz'))
  model = models.get_model('DeiT-Ti_16-distilled', num_classes=1000)
  logits = np.asarray(model.apply({'params': files.load(npz)},
                                  golden['images'], train=False))
  want = golden['logits']
  print('max |error| / max |logit|:',
        np.abs(logits - want).max() / np.abs(want).max())
  np.testing.assert_allclose(logits, want, rtol=1e-4,
                             atol=1e-4 * np.abs(want).max())


def test_workdir_without_an_export_is_refused(tmp_path):
  """A run that wrote no `.npz` yet (stopped early): convert says so."""
  (tmp_path / 'config.json').write_text(json.dumps(
      {'model_name': 'testing', 'model': {}, 'pp': {}}))
  with pytest.raises(ValueError, match=f'{tmp_path} holds no export '
                     r'\(`{model_name}.npz`\): convert the one a finished'):
    converter.convert(str(tmp_path), str(tmp_path / 'out.safetensors'))
