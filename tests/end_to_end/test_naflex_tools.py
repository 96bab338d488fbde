"""`predict` and `features` with `--max_num_patches=N` on a NaFlex tower
(timm's, converted, with a head): each image at SigLIP 2's size for it
(aspect kept, at most N patches), as the model computes it on the image
resized here."""

import os
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import features
from vit_jax import models
from vit_jax import predict
from vit_jax.checkpoints import files
from vit_jax.convert import transform
from vit_jax.data import packing

ROOT = helpers.ROOT
MAX_PATCHES = 24
CLASSES = 5


@pytest.fixture(scope='module')
def naflex(tmp_path_factory):
  """(checkpoint with a random head, a 70 x 230 image file)."""
  folder = tmp_path_factory.mktemp('naflex_tools')
  converted = str(folder / 'converted.npz')
  convert.convert(os.path.join(helpers.DATA, 'timm_naflex'), converted)
  params = files.load(converted)
  rng = np.random.default_rng(0)
  params['head'] = {'kernel': rng.normal(0, 0.3, (32, CLASSES)),
                    'bias': rng.normal(0, 0.3, (CLASSES,))}
  path = folder / 'naflex_head.npz'
  files.save(params, path)
  transform.save_transform(path, transform.load_transform(converted))
  image = folder / 'wide.png'
  Image.fromarray(rng.integers(0, 256, (70, 230, 3), np.uint8)).save(image)
  return path, image


def _resized_here(image_path):
  """The image at `naflex_grid`'s size, PIL's bilinear, in [-1, 1]."""
  image = np.asarray(Image.open(image_path).convert('RGB'))
  rows, cols = packing.naflex_grid(*image.shape[:2], 16, MAX_PATCHES)
  assert rows * cols <= MAX_PATCHES and (rows, cols) != (1, 1)
  resized = Image.fromarray(image).resize((cols * 16, rows * 16),
                                          Image.BILINEAR)
  return np.asarray(resized, np.float32) / 127.5 - 1


def _run(tool, *args):
  return subprocess.run([sys.executable, '-m', f'vit_jax.{tool}', *map(
      str, args)], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_predict_at_the_naflex_size(naflex):
  path, image = naflex
  pixels = _resized_here(image)
  m = models.from_pretrained(path, image_size=pixels.shape[:2])
  logits = m.model.apply({'params': m.params}, pixels[None], train=False)
  want = np.asarray(jax.nn.softmax(logits[0]))

  result = _run('predict', f'--checkpoint={path}',
                f'--max_num_patches={MAX_PATCHES}', image)
  assert result.returncode == 0, result.stderr
  assert 'at most 24 patches of 16 px' in result.stderr
  lines = result.stdout.splitlines()[1:]
  got = {int(line.split()[1]): float(line.split()[0]) for line in lines}
  assert len(got) == CLASSES
  for k, p in got.items():
    assert abs(p - want[k]) < 1e-4, (k, p, want[k])



def test_features_at_the_naflex_size(naflex):
  """`features --max_num_patches`'s extraction (in this process: the
  command line's flags are predict's, tested above)."""
  path, image = naflex
  pixels = _resized_here(image)
  m = models.from_pretrained(path, image_size=pixels.shape[:2])
  logits = m.model.apply({'params': m.params}, pixels[None], train=False)
  fn = features.feature_fn(m.model, None, 'pooled', False, False)
  spec = transform.resolve(224)  # [-1, 1], as the record's mean and std
  got = features.extract_naflex(fn, m.params, [('wide', image)] * 2, 2,
                                spec, 16, MAX_PATCHES)
  assert list(got['names']) == ['wide', 'wide']
  # The pooled features are the head's input: the head gives the logits.
  head = m.params['head']
  np.testing.assert_allclose(
      got['pooled'] @ head['kernel'] + head['bias'],
      np.repeat(logits, 2, axis=0), atol=1e-4)


def test_bad_max_num_patches_is_one_error_line(naflex):
  path, image = naflex
  result = _run('predict', f'--checkpoint={path}', '--max_num_patches=0',
                image)
  assert result.returncode == 1
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      'Error: --max_num_patches=0: give a positive'), result.stderr
  with pytest.raises(ValueError, match='give no --size'):
    predict.check_max_num_patches(16, size=64)
  not_naflex = models.get_model('SigLIP2-testing', num_classes=5)
  with pytest.raises(ValueError, match='is no NaFlex model'):
    predict.naflex_patch(not_naflex, 'x.npz')
