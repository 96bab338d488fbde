"""The original release's `vit_jax.ipynb` itself, every code cell, offline.

The notebook is not in this repository: give its path (from a checkout of
google-research/vision_transformer) to run this test.

  VIT_JAX_ORIGINAL_NOTEBOOK=/path/to/vit_jax.ipynb pytest tests/original/test_notebook.py

Only what reaches the network is dropped: the `!` lines (pip, git, gsutil,
wget). What they would have fetched is made here: a prepared tfds `cifar10`
(fake images, tfds' default data_dir), the `.npz` files as `testing`-preset
checkpoints in the published layout, the ImageNet class names and a picture.
Colab's form values become a `testing` model, batch 16, 3 steps and
`accum_steps=2`; `google.colab` (its file viewer) is a stub.
"""

import os
import shutil
import sys

import nbclient
import nbformat
import numpy as np
from PIL import Image
import pytest

from tests import helpers
from vit_jax import checkpoint
from vit_jax import models
from vit_jax import predict

NOTEBOOK = os.environ.get('VIT_JAX_ORIGINAL_NOTEBOOK')
pytestmark = pytest.mark.skipif(
    not NOTEBOOK, reason='set VIT_JAX_ORIGINAL_NOTEBOOK to the original '
    "release's vit_jax.ipynb")

FORM_VALUES = {"model_name = 'ViT-B_32'": "model_name = 'testing'",
               'batch_size = 512': 'batch_size = 16',
               'total_steps = 100': 'total_steps = 3',
               'accum_steps = 8': 'accum_steps = 2'}
LABELS = os.path.join(predict.DATA, 'imagenet2012_labels.txt')


def _offline(nb):
  """The notebook without its `!` lines (each a `pass`, which keeps an
  `if` whole), with this run's form values."""
  found = set()
  for cell in nb.cells:
    if cell.cell_type != 'code':
      continue
    source = '\n'.join(
        line[:len(line) - len(line.lstrip())] + 'pass'
        if line.lstrip().startswith('!') else line
        for line in cell.source.splitlines())
    for old, new in FORM_VALUES.items():
      if old in source:
        source, _ = source.replace(old, new), found.add(old)
    cell.source = source
  assert found == set(FORM_VALUES), f'form values not found: {FORM_VALUES}'
  return nb


def _downloads(folder):
  """What the dropped lines would have fetched, in the notebook's folder."""
  for name, classes, side in (('testing', 21843, 224),
                              ('testing_imagenet2012', 1000, 384)):
    model = models.get_model('testing', num_classes=classes)
    checkpoint.save(helpers.random_params(model, np.zeros((1, side, side, 3)),
                                          train=False, scale=0.1),
                    folder / f'{name}.npz')
  shutil.copy(LABELS, folder / 'ilsvrc2012_wordnet_lemmas.txt')
  picture = np.random.default_rng(0).integers(0, 256, (384, 384, 3), np.uint8)
  Image.fromarray(picture).save(folder / 'picsum.jpg')
  colab = folder / 'stubs' / 'google' / 'colab'
  colab.mkdir(parents=True)
  (colab / '__init__.py').write_text(
      'import types\nfiles = types.SimpleNamespace(view=lambda path: None)\n')
  return str(folder / 'stubs')


def test_every_cell_runs(cifar10_dir, tmp_path, monkeypatch):
  nb = _offline(nbformat.read(NOTEBOOK, as_version=4))
  stubs = _downloads(tmp_path)
  monkeypatch.setenv('TFDS_DATA_DIR', cifar10_dir)
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join(
      [stubs, *sys.path]))
  nbclient.NotebookClient(nb, timeout=900, kernel_name='python3',
                          resources={'metadata': {'path': str(tmp_path)}}
                          ).execute()
  outputs = [o for c in nb.cells if c.cell_type == 'code' for o in c.outputs]
  assert not [o for o in outputs if o.output_type == 'error']
  # The last cell prints the ten most likely ImageNet classes.
  assert nb.cells[-1].outputs[0].text.count(' : ') == 10
