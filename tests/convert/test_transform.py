"""`vit_jax.convert.transform`: how a checkpoint's source prepares an image
for evaluation, against timm.

timm's prepared pixels of tests/data/predict_image.jpg come from
scripts/make_predict_golden.py (torch and timm); these tests need neither.
PIL decodes the JPEG here as it did there (pillow is pinned).
"""

import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

from tests import helpers
from vit_jax import models
from vit_jax.convert import transform
from vit_jax.models import registry


ROOT = helpers.ROOT
DATA = helpers.DATA
IMAGE, GOLDEN, RECORD = helpers.predict_golden()
# The arguments of timm's transforms in the script.
TIMM_TRANSFORMS = {
    'center': dict(crop_pct=0.875, interpolation='bicubic', crop_mode='center',
                   mean=transform.IMAGENET_MEAN, std=transform.IMAGENET_STD),
    'squash': transform.GOOGLE,
    'border': dict(crop_pct=0.95, interpolation='lanczos', crop_mode='border',
                   mean=transform.IMAGENET_MEAN, std=transform.IMAGENET_STD),
}


@pytest.mark.parametrize('name', sorted(TIMM_TRANSFORMS))
def test_prepare_gives_timms_pixels(name):
  """center: short side 200 -> 73, crop at (22.5, 4.5) rounded half to even;
  border: long side 300 -> 67, padded with the mean; squash: 64 x 64."""
  spec = transform.Transform(size=64, **TIMM_TRANSFORMS[name])
  pixels = transform.prepare(IMAGE, spec)
  assert pixels.shape == (64, 64, 3) and pixels.dtype == np.float32
  np.testing.assert_allclose(pixels, GOLDEN[name], atol=1e-5)
  with open(IMAGE, 'rb') as f:  # the file's bytes: the same pixels
    np.testing.assert_array_equal(transform.prepare(f.read(), spec),
                                  pixels)


def test_squash_and_center_against_numpy(tmp_path):
  rng = np.random.default_rng(0)
  pixels = rng.integers(0, 256, (7, 10, 3), np.uint8)  # 10 wide, 7 high
  Image.fromarray(pixels).save(tmp_path / 'a.png')
  google = transform.resolve(7)
  assert google == transform.Transform(7, **transform.GOOGLE)
  # At the model's size nothing is resampled: x / 127.5 - 1.
  Image.fromarray(pixels[:, :7]).save(tmp_path / 'square.png')
  np.testing.assert_allclose(
      transform.prepare(tmp_path / 'square.png', google),
      pixels[:, :7] / 127.5 - 1, atol=1e-6)
  squashed = np.asarray(Image.fromarray(pixels).resize(
      (7, 7), Image.Resampling.BILINEAR), np.float64)
  np.testing.assert_allclose(transform.prepare(tmp_path / 'a.png', google),
                             squashed / 127.5 - 1, atol=1e-6)
  # Short side 7 already: columns round((10 - 7) / 2) = 2 to 8.
  center = transform.Transform(7, crop_pct=1.0, crop_mode='center',
                                mean=(0.1, 0.2, 0.3), std=(0.5, 0.25, 2.0))
  want = (pixels[:, 2:9] / 255 - [0.1, 0.2, 0.3]) / [0.5, 0.25, 2.0]
  np.testing.assert_allclose(transform.prepare(tmp_path / 'a.png', center),
                             want, atol=1e-6)


def test_pixel_limit_read_from_the_header(tmp_path, monkeypatch):
  Image.new('RGB', (20, 10)).save(tmp_path / 'a.png')
  data = (tmp_path / 'a.png').read_bytes()
  # The file up to its first pixel data chunk, cut short: a header alone.
  (tmp_path / 'header.png').write_bytes(data[:data.index(b'IDAT') + 6])
  with pytest.raises(ValueError, match='header.png is 20 x 10 pixels, over '
                     'the limit of 199: downscale it first'):
    transform.prepare(tmp_path / 'header.png', transform.resolve(8),
                       max_pixels=199)
  with pytest.raises(ValueError, match='header.png cannot be decoded'):
    transform.prepare(tmp_path / 'header.png', transform.resolve(8))
  assert transform.prepare(data, transform.resolve(8),
                            max_pixels=200).shape == (8, 8, 3)
  # PIL itself refuses over twice its limit while opening.
  monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 50)
  with pytest.raises(ValueError, match='The image is over the limit of 500 '
                     r'pixels: downscale it first. PIL: Image size \(200 '):
    transform.prepare(data, transform.resolve(8), max_pixels=500)
  assert transform.MAX_PIXELS == 89_478_485


def test_unreadable_files(tmp_path):
  (tmp_path / 'notes.txt').write_text('not an image')
  with pytest.raises(ValueError, match='notes.txt is not an image'):
    transform.prepare(tmp_path / 'notes.txt', transform.resolve(8))
  with pytest.raises(FileNotFoundError, match='missing.jpg: no such file'):
    transform.prepare(tmp_path / 'missing.jpg', transform.resolve(8))


def test_transform_from_record_defaults_and_overrides():
  record = {'input_size': [3, 64, 64], 'interpolation': 'bilinear'}
  assert transform.recorded_size(record) == 64
  assert transform.recorded_size(None) is None
  assert transform.resolve(64, record) == transform.Transform(
      64, crop_pct=0.875, crop_mode='center', interpolation='bilinear',
      mean=transform.IMAGENET_MEAN, std=transform.IMAGENET_STD)
  given = transform.resolve(224, record, crop_pct=0.9, mean=[0.5], std=None)
  assert given.crop_pct == 0.9 and given.mean == (0.5, 0.5, 0.5)
  assert given.std == transform.IMAGENET_STD
  assert transform.summary(given, '/a/m.transform.json', ['crop_pct']) == (
      'Preprocessing: resize short side to 248 (bilinear), center crop 224, '
      'mean (0.5, 0.5, 0.5), std (0.229, 0.224, 0.225) '
      '[from m.transform.json; --crop_pct given]')
  assert transform.resolve(224).describe() == (
      'resize to 224 x 224 (bilinear), mean (0.5, 0.5, 0.5), '
      'std (0.5, 0.5, 0.5)')
  # A record of model settings alone (weights converted without timm's
  # config.json) says nothing of the transform: the original's is used.
  assert transform.resolve(224, {'model': {'classifier': 'gap'}}) == (
      transform.resolve(224))
  # --crop_pct alone means timm's center crop, unless a mode is recorded.
  assert transform.resolve(64, crop_pct=0.9).crop_mode == 'center'
  assert transform.resolve(64, crop_pct=0.9, crop_mode='squash').crop_mode == (
      'squash')
  assert transform.resolve(64, {'crop_mode': 'squash'}, crop_pct=0.9
                            ).crop_mode == 'squash'
  assert transform.resolve(64).crop_mode == 'squash'
  with pytest.raises(ValueError, match="interpolation 'bicubc'; did you "
                     'mean bicubic'):
    transform.resolve(64, record, interpolation='bicubc')
  with pytest.raises(ValueError, match='not square'):
    transform.recorded_size({'input_size': [3, 64, 48]})


def test_record_round_trip_keeps_model_overrides(tmp_path):
  transform.save_transform(tmp_path / 'm.npz', dict(RECORD, other=1))
  assert transform.load_transform(tmp_path / 'm.npz') == RECORD
  config = transform.model_config(models.MODEL_CONFIGS['testing'], RECORD)
  assert config['transformer']['gelu_approximate'] is False
  assert config['transformer']['num_heads'] == 2  # the preset's, kept


def test_preprocess_imports_neither_tensorflow_nor_torch():
  code = ('import sys; import vit_jax.convert.transform; '
          "print([m for m in ('tensorflow', 'torch') if m in sys.modules])")
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, check=True).stdout
  assert out.strip() == '[]'


def test_the_presets_normalization_without_a_record():
  """DeiT's weights expect ImageNet's mean and std, Google's [-1, 1]; a
  recorded transform or a flag says otherwise."""
  imagenet = registry.input_normalization('DeiT-Ti_16-distilled')
  assert imagenet == (transform.IMAGENET_MEAN, transform.IMAGENET_STD)
  assert registry.input_normalization('ViT-B_16') == ((0.5,) * 3,) * 2
  deit = transform.resolve(224, None, imagenet)
  assert (deit.mean, deit.std) == imagenet and deit.crop_mode == 'squash'
  recorded = transform.resolve(224, {'mean': [0.5] * 3, 'std': [0.5] * 3},
                                imagenet)
  assert recorded.mean == (0.5, 0.5, 0.5)
  assert transform.resolve(224, None, imagenet, mean=[0.1]).mean == (0.1,) * 3
