"""`python -m vit_jax.predict` and `vit_jax.convert.transform`, against timm.

timm's prepared pixels and probabilities of tests/data/predict_image.jpg
come from scripts/make_predict_golden.py (torch and timm); these tests need
neither. PIL decodes the JPEG here as it did there (pillow is pinned).
"""

import json
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from tests import helpers
from tests.helpers import random_params
from vit_jax import checkpoint
from vit_jax import models
from vit_jax import predict
from vit_jax.convert import transform as preprocess
from vit_jax.models import presets as model_configs

ROOT = helpers.ROOT
DATA = helpers.DATA
IMAGE = os.path.join(DATA, 'predict_image.jpg')  # 300 x 200
GOLDEN = np.load(os.path.join(DATA, 'timm_predict.npz'))
with open(os.path.join(DATA, 'timm_predict.transform.json')) as f:
  RECORD = json.load(f)
# The arguments of timm's transforms in the script.
TIMM_TRANSFORMS = {
    'center': dict(crop_pct=0.875, interpolation='bicubic', crop_mode='center',
                   mean=preprocess.IMAGENET_MEAN, std=preprocess.IMAGENET_STD),
    'squash': preprocess.GOOGLE,
    'border': dict(crop_pct=0.95, interpolation='lanczos', crop_mode='border',
                   mean=preprocess.IMAGENET_MEAN, std=preprocess.IMAGENET_STD),
}
SQUASH_FLAGS = ['--crop_mode=squash', '--crop_pct=1', '--interpolation=bilinear',
                '--mean=0.5', '--std=0.5']


def _checkpoint(tmp_path, num_classes, size=48, **kw):
  """A random 'testing' ViT at `size` px with a head of `num_classes`."""
  model = models.get_model('testing', num_classes=num_classes, **kw)
  params = random_params(model, jnp.zeros((1, size, size, 3)), train=False,
                         scale=0.3)
  path = tmp_path / f'testing_{num_classes}.npz'
  checkpoint.save(params, path)
  return path, model, params


@pytest.fixture(scope='module')
def timm_npz(tmp_path_factory):
  """The golden timm ViT converted to .npz, with timm's transform beside."""
  path = tmp_path_factory.mktemp('timm') / 'timm_predict.npz'
  subprocess.run(
      [sys.executable, '-m', 'vit_jax.convert', '--model_name=testing',
       os.path.join(DATA, 'timm_predict_vit.safetensors'), str(path)],
      check=True, capture_output=True, timeout=300, cwd=ROOT)
  shutil.copy(os.path.join(DATA, 'timm_predict.transform.json'),
              preprocess.transform_path(path))
  return path


def _predict_cli(*args):
  return subprocess.run(
      [sys.executable, '-m', 'vit_jax.predict', *map(str, args)],
      capture_output=True, text=True, timeout=300, cwd=ROOT)


def _top5(stdout_lines):
  """[(probability, name)] of the five lines after an image's path."""
  return [(float(line.split()[0]), line.split('  ', 2)[2])
          for line in stdout_lines[1:6]]


def _assert_top5_is(stdout, probs, atol):
  """The five lines after the image's path are `probs`' top five."""
  want = np.argsort(-probs)[:5]
  top5 = _top5(stdout.splitlines())
  assert [name for _, name in top5] == [str(i) for i in want]
  np.testing.assert_allclose([p for p, _ in top5], probs[want], atol=atol)


def test_class_names_ship_with_the_package():
  names = predict.class_names(1000)
  assert len(names) == 1000 and names[207] == 'golden retriever'
  assert names[0] == 'tench, Tinca tinca'
  assert len(predict.class_names(21843)) == 21843
  assert predict.class_names(3) == ['0', '1', '2']


def test_image_size_from_the_position_embedding(tmp_path):
  path, _, _ = _checkpoint(tmp_path, 5, size=48)  # 3x3 patches of 16
  _, params, size = predict.load_classifier('testing', str(path))
  assert size == 48
  hybrid = models.get_model('R+ViT-Ti_16', num_classes=2)
  shapes = jax.eval_shape(lambda: hybrid.init(
      jax.random.key(0), jnp.zeros((1, 96, 96, 3)), train=False))['params']
  assert predict.image_size(shapes, models.MODEL_CONFIGS['R+ViT-Ti_16']) == 96
  assert params['head']['kernel'].shape == (10, 5)


@pytest.mark.parametrize('name', sorted(TIMM_TRANSFORMS))
def test_prepare_gives_timms_pixels(name):
  """center: short side 200 -> 73, crop at (22.5, 4.5) rounded half to even;
  border: long side 300 -> 67, padded with the mean; squash: 64 x 64."""
  transform = preprocess.Transform(size=64, **TIMM_TRANSFORMS[name])
  pixels = preprocess.prepare(IMAGE, transform)
  assert pixels.shape == (64, 64, 3) and pixels.dtype == np.float32
  np.testing.assert_allclose(pixels, GOLDEN[name], atol=1e-5)
  with open(IMAGE, 'rb') as f:  # the file's bytes: the same pixels
    np.testing.assert_array_equal(preprocess.prepare(f.read(), transform),
                                  pixels)


def test_squash_and_center_against_numpy(tmp_path):
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, (7, 10, 3), np.uint8)  # 10 wide, 7 high
  Image.fromarray(pixels).save(tmp_path / 'a.png')
  google = preprocess.resolve(7)
  assert google == preprocess.Transform(7, **preprocess.GOOGLE)
  # At the model's size nothing is resampled: x / 127.5 - 1.
  Image.fromarray(pixels[:, :7]).save(tmp_path / 'square.png')
  np.testing.assert_allclose(
      preprocess.prepare(tmp_path / 'square.png', google),
      pixels[:, :7] / 127.5 - 1, atol=1e-6)
  squashed = np.asarray(Image.fromarray(pixels).resize(
      (7, 7), Image.Resampling.BILINEAR), np.float64)
  np.testing.assert_allclose(preprocess.prepare(tmp_path / 'a.png', google),
                             squashed / 127.5 - 1, atol=1e-6)
  # Short side 7 already: columns round((10 - 7) / 2) = 2 to 8.
  center = preprocess.Transform(7, crop_pct=1.0, crop_mode='center',
                                mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 2.0))
  want = (pixels[:, 2:9] / 255 - [0.1, 0.2, 0.3]) / [0.5, 0.25, 2.0]
  np.testing.assert_allclose(preprocess.prepare(tmp_path / 'a.png', center),
                             want, atol=1e-6)


def test_pixel_limit_read_from_the_header(tmp_path, monkeypatch):
  Image.new('RGB', (20, 10)).save(tmp_path / 'a.png')
  data = (tmp_path / 'a.png').read_bytes()
  # The file up to its first pixel data chunk, cut short: a header alone.
  (tmp_path / 'header.png').write_bytes(data[:data.index(b'IDAT') + 6])
  with pytest.raises(ValueError, match='header.png is 20 x 10 pixels, over '
                     'the limit of 199: downscale it first'):
    preprocess.prepare(tmp_path / 'header.png', preprocess.resolve(8),
                       max_pixels=199)
  with pytest.raises(ValueError, match='header.png cannot be decoded'):
    preprocess.prepare(tmp_path / 'header.png', preprocess.resolve(8))
  assert preprocess.prepare(data, preprocess.resolve(8),
                            max_pixels=200).shape == (8, 8, 3)
  # PIL itself refuses over twice its limit while opening.
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 50)
  with pytest.raises(ValueError, match='The image is over the limit of 500 '
                     r'pixels: downscale it first. PIL: Image size \(200 '):
    preprocess.prepare(data, preprocess.resolve(8), max_pixels=500)
  assert preprocess.MAX_PIXELS == 89_478_485


def test_unreadable_files(tmp_path):
  (tmp_path / 'notes.txt').write_text('not an image')
  with pytest.raises(ValueError, match='notes.txt is not an image'):
    preprocess.prepare(tmp_path / 'notes.txt', preprocess.resolve(8))
  with pytest.raises(FileNotFoundError, match='missing.jpg: no such file'):
    preprocess.prepare(tmp_path / 'missing.jpg', preprocess.resolve(8))


def test_transform_from_record_defaults_and_overrides():
  record = {'input_size': [3, 64, 64], 'interpolation': 'bilinear'}
  assert preprocess.recorded_size(record) == 64
  assert preprocess.recorded_size(None) is None
  assert preprocess.resolve(64, record) == preprocess.Transform(
      64, crop_pct=0.875, crop_mode='center', interpolation='bilinear',
      mean=preprocess.IMAGENET_MEAN, std=preprocess.IMAGENET_STD)
  given = preprocess.resolve(224, record, crop_pct=0.9, mean=[0.5], std=None)
  assert given.crop_pct == 0.9 and given.mean == (0.5, 0.5, 0.5)
  assert given.std == preprocess.IMAGENET_STD
  assert preprocess.summary(given, '/a/m.transform.json', ['crop_pct']) == (
      'Preprocessing: resize short side to 248 (bilinear), center crop 224, '
      'mean (0.5, 0.5, 0.5), std (0.229, 0.224, 0.225) '
      '[from m.transform.json; --crop_pct given]')
  assert preprocess.resolve(224).describe() == (
      'resize to 224 x 224 (bilinear), mean (0.5, 0.5, 0.5), '
      'std (0.5, 0.5, 0.5)')
  # A record of model settings alone (weights converted without timm's
  # config.json) says nothing of the transform: the original's is used.
  assert preprocess.resolve(224, {'model': {'classifier': 'gap'}}) == (
      preprocess.resolve(224))
  # --crop_pct alone means timm's center crop, unless a mode is recorded.
  assert preprocess.resolve(64, crop_pct=0.9).crop_mode == 'center'
  assert preprocess.resolve(64, crop_pct=0.9, crop_mode='squash').crop_mode == (
      'squash')
  assert preprocess.resolve(64, {'crop_mode': 'squash'}, crop_pct=0.9
                            ).crop_mode == 'squash'
  assert preprocess.resolve(64).crop_mode == 'squash'
  with pytest.raises(ValueError, match="interpolation 'bicubc'; did you "
                     'mean bicubic'):
    preprocess.resolve(64, record, interpolation='bicubc')
  with pytest.raises(ValueError, match='not square'):
    preprocess.recorded_size({'input_size': [3, 64, 48]})


def test_record_round_trip_keeps_model_overrides(tmp_path):
  preprocess.save_transform(tmp_path / 'm.npz', dict(RECORD, other=1))
  assert preprocess.load_transform(tmp_path / 'm.npz') == RECORD
  config = preprocess.model_config(models.MODEL_CONFIGS['testing'], RECORD)
  assert config['transformer']['gelu_approximate'] is False
  assert config['transformer']['num_heads'] == 2  # the preset's, kept


def test_probabilities_match_timm(timm_npz):
  """timm's transform and exact GELU, from the record, give timm's
  probabilities; the tanh GELU of Google's checkpoints does not."""
  model, params, size = predict.load_classifier(
      'testing', str(timm_npz), preprocess.recorded_size(RECORD), RECORD)
  image = predict.read_image(IMAGE, preprocess.resolve(size, RECORD))
  probs = predict.predict(model, params, [image])[0]
  np.testing.assert_allclose(probs, GOLDEN['center_probs'], atol=1e-5)
  tanh_model, _, _ = predict.load_classifier('testing', str(timm_npz))
  tanh = predict.predict(tanh_model, params, [image])[0]
  assert np.abs(tanh - GOLDEN['center_probs']).max() > 1e-5


def test_size_resizes_the_position_embedding(tmp_path, capfd):
  path, _, _ = _checkpoint(tmp_path, 4, size=48)  # a 3x3 grid
  model, params, size = predict.load_classifier('testing', str(path), 96)
  assert size == 96
  assert 'resized pos_embedding from (1, 10, 10) to (1, 37, 10)' in (
      capfd.readouterr().err)
  probs = predict.predict(model, params, [predict.read_image(IMAGE, 96)])[0]
  assert probs.shape == (4,) and abs(probs.sum() - 1) < 1e-5


def test_command_line_uses_the_record(timm_npz, tmp_path):
  (tmp_path / 'notes.txt').write_text('not an image')
  result = _predict_cli('--model_name=testing', f'--checkpoint={timm_npz}',
                        IMAGE, tmp_path / 'notes.txt', tmp_path / 'missing.jpg')
  assert result.returncode == 1, result.stderr  # two files failed
  out = result.stdout.splitlines()
  assert out[0] == f'{IMAGE}:' and len(out) == 6
  _assert_top5_is(result.stdout, GOLDEN['center_probs'], atol=1e-4)
  assert ('Preprocessing: resize short side to 73 (bicubic), center crop 64, '
          'mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) '
          '[from timm_predict.transform.json]\n') in result.stderr
  assert 'notes.txt is not an image' in result.stderr
  assert 'missing.jpg: no such file' in result.stderr


def test_flags_override_the_record(timm_npz):
  result = _predict_cli('--model_name=testing', f'--checkpoint={timm_npz}',
                        *SQUASH_FLAGS, IMAGE)
  assert result.returncode == 0, result.stderr
  _assert_top5_is(result.stdout, GOLDEN['squash_probs'], atol=1e-4)
  assert ('Preprocessing: resize to 64 x 64 (bilinear), mean (0.5, 0.5, 0.5), '
          'std (0.5, 0.5, 0.5) [from timm_predict.transform.json; '
          '--crop_pct, --crop_mode, --interpolation, --mean, --std given]'
          ) in result.stderr


def test_bare_timm_file_predicts_as_timm(tmp_path):
  """Weights without config.json are recorded with timm's eval transform;
  `--crop_pct` and `--interpolation` then give timm's `create_transform`
  with those two arguments."""
  npz = tmp_path / 'bare.npz'
  subprocess.run(
      [sys.executable, '-m', 'vit_jax.convert',
       os.path.join(DATA, 'timm_predict_vit.safetensors'), str(npz)],
      check=True, capture_output=True, timeout=300, cwd=ROOT)
  result = _predict_cli('--model_name=testing', f'--checkpoint={npz}',
                        '--crop_pct=0.9', '--interpolation=bicubic', IMAGE)
  assert result.returncode == 0, result.stderr
  _assert_top5_is(result.stdout, GOLDEN['bare_probs'], atol=1e-3)
  assert ('Preprocessing: resize short side to 71 (bicubic), center crop 64, '
          'mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) '
          '[from bare.transform.json; --crop_pct, --interpolation given]'
          ) in result.stderr
  np.testing.assert_allclose(
      preprocess.prepare(IMAGE, preprocess.resolve(
          64, preprocess.load_transform(npz), crop_pct=0.9)),
      GOLDEN['bare'], atol=1e-6)


def test_command_line_without_a_record(tmp_path):
  path, _, _ = _checkpoint(tmp_path, 1000)
  rng = np.random.default_rng(1)
  Image.fromarray(rng.integers(0, 256, (30, 30), np.uint8)).save(
      tmp_path / 'gray.png')
  result = _predict_cli('--model_name=testing', f'--checkpoint={path}',
                        '--size=64', tmp_path / 'gray.png')
  assert result.returncode == 0, result.stderr
  out = result.stdout.splitlines()
  assert out[0].endswith('gray.png:') and len(out) == 6
  probs = [p for p, _ in _top5(out)]
  assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
  assert all(name in predict.class_names(1000) for _, name in _top5(out))
  assert ('Preprocessing: resize to 64 x 64 (bilinear), mean (0.5, 0.5, 0.5), '
          "std (0.5, 0.5, 0.5) [the original release's: no .transform.json "
          'beside the checkpoint]') in result.stderr
  assert 'resized pos_embedding from (1, 10, 10) to (1, 17, 10)' in (
      result.stderr)


def test_unknown_model_name(tmp_path):
  path, _, _ = _checkpoint(tmp_path, 3)
  with pytest.raises(ValueError, match="Unknown model 'testin'; did you mean "
                     'testing'):
    predict.load_classifier('testin', str(path))


def test_labels_file_must_match_the_head(tmp_path):
  labels = tmp_path / 'labels.txt'
  labels.write_text('cat\ndog\n')
  assert predict.class_names(2, str(labels)) == ['cat', 'dog']
  with pytest.raises(ValueError, match='names 2 classes, but the head has 3'):
    predict.class_names(3, str(labels))


def test_preprocess_imports_neither_tensorflow_nor_torch():
  code = ('import sys; import vit_jax.convert.transform; '
          "print([m for m in ('tensorflow', 'torch') if m in sys.modules])")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, check=True).stdout
  assert out.strip() == '[]'


def test_the_presets_normalization_without_a_record():
  """DeiT's weights expect ImageNet's mean and std, Google's [-1, 1]; a
  recorded transform or a flag says otherwise."""
  imagenet = model_configs.input_normalization('DeiT-Ti_16-distilled')
  assert imagenet == (preprocess.IMAGENET_MEAN, preprocess.IMAGENET_STD)
  assert model_configs.input_normalization('ViT-B_16') == ((0.5,) * 3,) * 2
  deit = preprocess.resolve(224, None, imagenet)
  assert (deit.mean, deit.std) == imagenet and deit.crop_mode == 'squash'
  recorded = preprocess.resolve(224, {'mean': [0.5] * 3, 'std': [0.5] * 3},
                                imagenet)
  assert recorded.mean == (0.5, 0.5, 0.5)
  assert preprocess.resolve(224, None, imagenet, mean=[0.1]).mean == (0.1,) * 3
