"""transformers' depth models -> vit_jax's `models.dpt.DPT`, against their
own `predicted_depth`: tests/data/depth, from scripts/make_depth_golden.py
(a tiny random DepthAnythingForDepthEstimation on a 4-block DINOv2 at 56 px,
and a DPTForDepthEstimation on a 4-block ViT at 32 px and 48 px, readout
'project');
and `python -m vit_jax.predict --task=depth` on the converted one."""

import json
import os
import shutil

import numpy as np
from PIL import Image
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import converter
from vit_jax.convert import transform

DATA = os.path.join(helpers.DATA, 'depth')
GOLDEN = np.load(os.path.join(DATA, 'golden.npz'))
IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
# case: (folder, its processor's mean and std, the record's dpt head)
CASES = {
    'da': ('depth_anything', IMAGENET,
           dict(readout='ignore', fusion='next', head_hidden=4,
                depth_type='relative')),
    'dpt': ('dpt', ([0.5] * 3, [0.5] * 3),
            dict(readout='project', fusion='x2', head_projection=False)),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """case -> .npz, each golden folder converted with no flags."""
  folder = tmp_path_factory.mktemp('depth')
  out = {}
  for case, (name, _, _) in CASES.items():
    out[case] = str(folder / f'{case}.npz')
    convert.convert(os.path.join(DATA, name), out[case])
  return out


@pytest.mark.parametrize('case', CASES)
def test_converted_gives_predicted_depth(converted, case):
  """The record (the processor's size, mean and std; the head; the four
  blocks), and from_pretrained's output (N, H, W) on the golden inputs
  within 1e-4 of transformers' `predicted_depth`."""
  _, (mean, std), head = CASES[case]
  record = transform.load_transform(converted[case])
  images, want = GOLDEN[f'images_{case}'], GOLDEN[f'depth_{case}']
  side = images.shape[1]
  assert record['input_size'] == [3, side, side]
  assert (record['mean'], record['std']) == (mean, std)
  assert record['dpt']['indices'] == [0, 1, 2, 3]
  assert record['dpt']['norm'] == (case == 'da')  # Dinov2Backbone's norm
  assert head.items() <= record['dpt']['head'].items()
  found = models.from_pretrained(converted[case], image_size=side)
  got = np.asarray(found.model.apply({'params': found.params}, images))
  assert got.shape == want.shape
  assert np.abs(got - want).max() < 1e-4 * max(1., np.abs(want).max())
  assert np.abs(got - want).max() < 1e-6  # measured: 1e-8


def test_dpt_resizes_its_table_as_transformers(converted):
  """DPT's ViT resizes its table bilinearly (torch's) to each input: at
  48 px, 4 x 4 -> 6 x 6, its output (1, 96, 96) within 1e-4."""
  assert transform.load_transform(converted['dpt'])['posemb_resize'] == (
      'bilinear_torch')
  found = models.from_pretrained(converted['dpt'], image_size=48)
  got = np.asarray(found.model.apply({'params': found.params},
                                     GOLDEN['images_dpt48']))
  assert got.shape == GOLDEN['depth_dpt48'].shape == (1, 96, 96)
  assert np.abs(got - GOLDEN['depth_dpt48']).max() < 1e-6


@pytest.mark.parametrize('case', CASES)
def test_written_back_in_transformers_layout(converted, case, tmp_path):
  """--layout=transformers: the source's weights, exactly (but the unused
  residual unit of the first fusion block, zeros, and DINOv2's mask token,
  which inference never reads), its config's settings, its processor's
  size, mean and std. (transformers 5.23 loads both folders and gives the
  same predicted_depth: measured once, 0.0 apart.)"""
  src = os.path.join(DATA, CASES[case][0])
  dst = str(tmp_path / case)
  convert.convert(converted[case], dst, layout='transformers')
  want, got = (converter.read_timm(os.path.join(folder, 'model.safetensors'))
               for folder in (src, dst))
  assert set(got) == {k for k in want if 'mask_token' not in k}
  for key, value in got.items():
    if 'layers.0.residual_layer1' not in key:
      np.testing.assert_array_equal(value, want[key], err_msg=key)
  source, written = _json(src, 'config.json'), _json(dst, 'config.json')
  for key in ('architectures', 'neck_hidden_sizes', 'reassemble_factors',
              'fusion_hidden_size', 'readout_type', 'backbone_out_indices',
              'head_hidden_size', 'depth_estimation_type', 'max_depth',
              'hidden_size', 'num_hidden_layers', 'patch_size'):
    if key in source:
      assert written[key] == source[key], key
  if source.get('backbone_config'):
    for key in ('out_indices', 'hidden_size', 'num_hidden_layers',
                'image_size', 'layerscale_value', 'apply_layernorm'):
      assert written['backbone_config'][key] == source['backbone_config'][key]
  source, written = (_json(src, 'preprocessor_config.json'),
                     _json(dst, 'preprocessor_config.json'))
  for key in ('size', 'image_mean', 'image_std', 'keep_aspect_ratio'):
    assert written[key] == source[key], key


def _json(folder, name):
  with open(os.path.join(folder, name)) as f:
    return json.load(f)


def test_dpt_hybrid_is_refused(tmp_path):
  folder = tmp_path / 'hybrid'
  shutil.copytree(os.path.join(DATA, 'dpt'), folder)
  config = json.loads((folder / 'config.json').read_text())
  (folder / 'config.json').write_text(json.dumps(dict(config, is_hybrid=True)))
  with pytest.raises(ValueError, match='is_hybrid'):
    convert.convert(str(folder), str(tmp_path / 'hybrid.npz'))


def test_a_depth_npz_has_no_timm_layout(converted, tmp_path):
  with pytest.raises(ValueError, match='layout=transformers'):
    convert.convert(converted['da'], str(tmp_path / 'da.safetensors'))


def test_predict_depth_writes_npy_and_png(converted, tmp_path):
  """One process: the depth model's maps (the .npy the model's output on
  the prepared image, the .png it scaled to 0-255); a classifier, a depth
  run without --output_dir and a depth model without --task=depth each
  refused with one Error line."""
  image = os.path.join(helpers.DATA, 'predict_image.jpg')
  predict = lambda npz, out: ('vit_jax.predict', [
      '--task=depth', f'--checkpoint={npz}', f'--output_dir={out}', image])
  depth, classifier, no_folder, no_task = helpers.cli_runs([
      predict(converted['da'], tmp_path / 'maps'),
      predict(os.path.join(helpers.DATA, 'timm_predict.npz'),
              tmp_path / 'none'),
      ('vit_jax.predict', ['--task=depth', f'--checkpoint={converted["da"]}',
                           image]),
      ('vit_jax.predict', [f'--checkpoint={converted["da"]}', image])])
  assert depth['code'] == 0, depth['stderr']
  npy = np.load(tmp_path / 'maps' / 'predict_image.npy')
  found = models.from_pretrained(converted['da'])
  x = transform.prepare(image, found.transform)[None]
  want = np.asarray(found.model.apply({'params': found.params}, x))[0]
  assert npy.shape == (56, 56)
  np.testing.assert_allclose(npy, want, atol=1e-5)
  png = np.asarray(Image.open(tmp_path / 'maps' / 'predict_image.png'))
  scaled = (npy - npy.min()) / (npy.max() - npy.min()) * 255
  assert png.dtype == np.uint8 and png.min() == 0 and png.max() == 255
  assert np.abs(png - scaled).max() <= 0.5 + 1e-3
  assert classifier['code'] == 1
  errors = [l for l in classifier['stderr'].splitlines()
            if l.startswith('Error:')]
  assert len(errors) == 1 and 'not a depth model' in errors[0]
  assert not (tmp_path / 'none').exists()
  # A depth run with nowhere to write, and a depth model asked for classes.
  for run, message in ((no_folder, 'into --output_dir'),
                       (no_task, 'is a depth model: give --task=depth')):
    errors = [l for l in run['stderr'].splitlines() if l.startswith('Error:')]
    assert run['code'] == 1 and len(errors) == 1, run['stderr']
    assert message in errors[0], errors
