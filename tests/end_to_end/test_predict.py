"""`python -m vit_jax.predict`, against timm.

timm's probabilities of tests/data/predict_image.jpg come from
scripts/make_predict_golden.py (torch and timm); these tests need neither.
PIL decodes the JPEG here as it did there (pillow is pinned).
"""

import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from tests import helpers
from tests.helpers import random_params
from vit_jax.checkpoints import files
from vit_jax import convert
from vit_jax import models
from vit_jax import predict
from vit_jax.convert import transform


DATA = helpers.DATA
IMAGE, GOLDEN, RECORD = helpers.predict_golden()
# One worker runs the tests of `cli`'s process, so that it starts once.
pytestmark = pytest.mark.xdist_group('predict_cli')
SQUASH_FLAGS = ['--crop_mode=squash', '--crop_pct=1', '--interpolation=bilinear',
                '--mean=0.5', '--std=0.5']


def _checkpoint(tmp_path, num_classes, size=48, **kw):
  """A random 'testing' ViT at `size` px with a head of `num_classes`."""
  model = models.get_model('testing', num_classes=num_classes, **kw)
  params = random_params(model, jnp.zeros((1, size, size, 3)), train=False,
                         scale=0.3)
  path = tmp_path / f'testing_{num_classes}.npz'
  files.save(params, path)
  return path, model, params


@pytest.fixture(scope='module')
def timm_npz(tmp_path_factory):
  """The golden timm ViT converted to .npz, with timm's transform beside
(converted here: the command line's conversion is `cli`'s 'convert
bare')."""
  path = tmp_path_factory.mktemp('timm') / 'timm_predict.npz'
  assert convert.convert(os.path.join(DATA, 'timm_predict_vit.safetensors'),
                         str(path), 'testing') == 'testing'
  shutil.copy(os.path.join(DATA, 'timm_predict.transform.json'),
              transform.transform_path(path))
  return path


CLIP = 8  # frames of the test's clips, of 16 px: 2 views of 4 frames


def _video_model():
  """A random ViViT-testing of 5 classes at 16 px."""
  model = models.get_model('ViViT-testing', num_classes=5)
  return model, random_params(model, jnp.zeros((1, 4, 16, 16, 3)),
                              train=False, scale=0.3)


def _video_checkpoint(root):
  """`_video_model` recorded as a video run's export: 4 frames a view,
  stride 1, 2 views."""
  model, params = _video_model()
  path = root / 'vivit.npz'
  files.save(params, path)
  transform.save_transform(path, dict(
      model_name='ViViT-testing', input_size=[3, 16, 16], crop_pct=1.0,
      crop_mode='squash', interpolation='bilinear', mean=[0.5] * 3,
      std=[0.5] * 3, num_frames=4, frame_stride=1, test_views=2))
  return path, model, params


def _clip_frames():
  """CLIP frames of 16 px, of few colours (a GIF holds them exactly)."""
  rng = np.random.default_rng(2)
  palette = rng.integers(0, 256, (6, 3), np.uint8)
  return palette[rng.integers(0, 6, (CLIP, 16, 16))]


@pytest.fixture(scope='module')
def cli(timm_npz, tmp_path_factory):
  """{test: (exit code, stdout, stderr, its folder)} of the command lines
  below, run in one process (`helpers.cli_runs`)."""
  root = tmp_path_factory.mktemp('cli')
  (root / 'notes.txt').write_text('not an image')
  path, _, _ = _checkpoint(root, 1000)
  Image.fromarray(np.random.default_rng(1).integers(
      0, 256, (30, 30), np.uint8)).save(root / 'gray.png')
  bare = root / 'bare.npz'
  vivit, _, _ = _video_checkpoint(root)
  frames = [Image.fromarray(f) for f in _clip_frames()]
  frames[0].save(root / 'clip.gif', save_all=True, append_images=frames[1:])
  (root / 'frames').mkdir()
  for i, frame in enumerate(frames):
    frame.save(root / 'frames' / f'{i:02d}.png')
  predict = lambda *args: ('vit_jax.predict', ['--model_name=testing', *args])
  runs = {
      'record': predict(f'--checkpoint={timm_npz}', IMAGE, root / 'notes.txt',
                        root / 'missing.jpg'),
      'flags': predict(f'--checkpoint={timm_npz}', *SQUASH_FLAGS, IMAGE),
      'convert bare': ('vit_jax.convert', [
          os.path.join(DATA, 'timm_predict_vit.safetensors'), bare]),
      'bare': predict(f'--checkpoint={bare}', '--crop_pct=0.9',
                      '--interpolation=bicubic', IMAGE),
      'no record': predict(f'--checkpoint={path}', '--size=64',
                           root / 'gray.png'),
      'clips': ('vit_jax.predict', [f'--checkpoint={vivit}', root / 'clip.gif',
                                    root / 'frames', root / 'gray.png']),
      'clip, image model': predict(f'--checkpoint={path}', '--size=64',
                                   root / 'clip.gif'),
  }
  results = helpers.cli_runs(runs.values())
  return {name: (r['code'], r['stdout'], r['stderr'], root)
          for name, r in zip(runs, results)}


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


def test_probabilities_match_timm(timm_npz):
  """timm's transform and exact GELU, from the record, give timm's
  probabilities; the tanh GELU of Google's checkpoints does not."""
  model, params, size = predict.load_classifier(
      'testing', str(timm_npz), transform.recorded_size(RECORD), RECORD)
  image = predict.read_image(IMAGE, transform.resolve(size, RECORD))
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


def test_command_line_uses_the_record(cli):
  code, stdout, stderr, _ = cli['record']
  assert code == 1, stderr  # two files failed
  out = stdout.splitlines()
  assert out[0] == f'{IMAGE}:' and len(out) == 6
  _assert_top5_is(stdout, GOLDEN['center_probs'], atol=1e-4)
  assert ('Preprocessing: resize short side to 73 (bicubic), center crop 64, '
          'mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) '
          '[from timm_predict.transform.json]\n') in stderr
  assert 'notes.txt is not an image' in stderr
  assert 'missing.jpg: no such file' in stderr


def test_flags_override_the_record(cli):
  code, stdout, stderr, _ = cli['flags']
  assert code == 0, stderr
  _assert_top5_is(stdout, GOLDEN['squash_probs'], atol=1e-4)
  assert ('Preprocessing: resize to 64 x 64 (bilinear), mean (0.5, 0.5, 0.5), '
          'std (0.5, 0.5, 0.5) [from timm_predict.transform.json; '
          '--crop_pct, --crop_mode, --interpolation, --mean, --std given]'
          ) in stderr


def test_bare_timm_file_predicts_as_timm(cli):
  """Weights without config.json are recorded with timm's eval transform;
  `--crop_pct` and `--interpolation` then give timm's `create_transform`
  with those two arguments."""
  code, _, stderr, root = cli['convert bare']
  assert code == 0, stderr
  code, stdout, stderr, _ = cli['bare']
  assert code == 0, stderr
  _assert_top5_is(stdout, GOLDEN['bare_probs'], atol=1e-3)
  assert ('Preprocessing: resize short side to 71 (bicubic), center crop 64, '
          'mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) '
          '[from bare.transform.json; --crop_pct, --interpolation given]'
          ) in stderr
  np.testing.assert_allclose(
      transform.prepare(IMAGE, transform.resolve(
          64, transform.load_transform(root / 'bare.npz'), crop_pct=0.9)),
      GOLDEN['bare'], atol=1e-6)


def test_command_line_without_a_record(cli):
  code, stdout, stderr, _ = cli['no record']
  assert code == 0, stderr
  out = stdout.splitlines()
  assert out[0].endswith('gray.png:') and len(out) == 6
  probs = [p for p, _ in _top5(out)]
  assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
  assert all(name in predict.class_names(1000) for _, name in _top5(out))
  assert ('Preprocessing: resize to 64 x 64 (bilinear), mean (0.5, 0.5, 0.5), '
          "std (0.5, 0.5, 0.5) [the original release's: no .transform.json "
          'beside the checkpoint]') in stderr
  assert 'resized pos_embedding from (1, 10, 10) to (1, 17, 10)' in stderr


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


def test_bare_npz_without_a_record_asks_for_its_preset(tmp_path):
  path, _, _ = _checkpoint(tmp_path, 3)
  with pytest.raises(ValueError, match=f'{path} has no record of its model '
                     r'\(no .*\): name its preset'):
    predict.load_classifier(None, str(path))


def test_a_video_model_predicts_clips(cli):
  """A GIF and a folder of its frames: the mean logits of the record's two
  views (frames 0-3 and 4-7), as the video evaluator scores a clip; a
  still image is refused in one line, and a clip to an image model."""
  code, stdout, stderr, root = cli['clips']
  assert code == 1, stderr  # the still image
  model, params = _video_model()
  clip = (_clip_frames().astype(np.float32) / 255 - 0.5) / 0.5
  views = np.stack([clip[0:4], clip[4:8]])
  logits = np.asarray(model.apply({'params': params}, views, train=False))
  want = np.exp(logits.mean(0) - logits.mean(0).max())
  want /= want.sum()
  blocks = stdout.split(f'{root}')
  assert len(blocks) == 3  # two clips printed
  for block in blocks[1:]:
    _assert_top5_is(block.split(':', 1)[1], want, atol=1e-4)
  assert ('Clips: 2 view(s) of 4 frames 1 apart; their logits averaged.'
          in stderr)
  assert 'gray.png is a still image, not a clip' in stderr
  code, _, stderr, _ = cli['clip, image model']
  assert code == 1 and stderr.count('Error:') == 1
  assert 'clip.gif is a clip, and ' in stderr and 'an image model' in stderr
