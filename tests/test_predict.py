"""`python -m vit_jax.predict`: top-k classes of image files."""

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

from helpers import random_params
from vit_jax import checkpoint
from vit_jax import models
from vit_jax import predict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _checkpoint(tmp_path, num_classes, size=48, **kw):
  """A random 'testing' ViT at `size` px with a head of `num_classes`."""
  model = models.get_model('testing', num_classes=num_classes, **kw)
  params = random_params(model, jnp.zeros((1, size, size, 3)), train=False,
                         scale=0.3)
  path = tmp_path / f'testing_{num_classes}.npz'
  checkpoint.save(params, path)
  return path, model, params


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
  shapes = jax_shapes(hybrid, 96)
  assert predict.image_size(shapes, models.MODEL_CONFIGS['R+ViT-Ti_16']) == 96
  assert params['head']['kernel'].shape == (10, 5)


def jax_shapes(model, size):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, size, size, 3)), train=False))['params']


def test_probabilities_match_the_model(tmp_path):
  """An image already at the model's size: preprocessing is x / 127.5 - 1."""
  path, model, params = _checkpoint(tmp_path, 7)
  pixels = np.random.default_rng(0).integers(0, 256, (48, 48, 3), np.uint8)
  Image.fromarray(pixels).save(tmp_path / 'a.png')
  image = predict.read_image(str(tmp_path / 'a.png'), 48)
  np.testing.assert_allclose(image, pixels / 127.5 - 1, atol=1e-6)
  loaded_model, loaded, _ = predict.load_classifier('testing', str(path))
  probs = predict.predict(loaded_model, loaded, [image])[0]
  logits = np.asarray(model.apply({'params': params}, image[None],
                                  train=False))[0]
  want = np.exp(logits - logits.max())
  np.testing.assert_allclose(probs, want / want.sum(), rtol=1e-5)


def test_command_line(tmp_path):
  path, _, _ = _checkpoint(tmp_path, 1000)
  rng = np.random.default_rng(1)
  Image.fromarray(rng.integers(0, 256, (60, 80, 3), np.uint8)).save(
      tmp_path / 'photo.jpg')
  Image.fromarray(rng.integers(0, 256, (30, 30), np.uint8)).save(
      tmp_path / 'gray.png')
  (tmp_path / 'notes.txt').write_text('not an image')
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.predict', '--model_name=testing',
       f'--checkpoint={path}', str(tmp_path / 'photo.jpg'),
       str(tmp_path / 'notes.txt'), str(tmp_path / 'gray.png'),
       str(tmp_path / 'missing.jpg')],
      capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert result.returncode == 1  # some files failed, the others printed
  out = result.stdout.splitlines()
  assert out[0].endswith('photo.jpg:') and out[6].endswith('gray.png:')
  probs = [float(line.split()[0]) for line in out[1:6]]
  assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
  names = predict.class_names(1000)
  assert all(line.split('  ', 2)[2] in names for line in out[1:6])
  assert 'notes.txt is not an image' in result.stderr
  assert 'missing.jpg: no such file' in result.stderr


def test_labels_file_must_match_the_head(tmp_path):
  labels = tmp_path / 'labels.txt'
  labels.write_text('cat\ndog\n')
  assert predict.class_names(2, str(labels)) == ['cat', 'dog']
  with pytest.raises(ValueError, match='names 2 classes, but the head has 3'):
    predict.class_names(3, str(labels))
