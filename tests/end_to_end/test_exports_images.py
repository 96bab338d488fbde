"""Every output is an input (1 of 3): the exports of classification runs
(the default job's custom model, a preset, fine-tuning from a workdir,
distillation), LiT and NaViT, each opened by its workdir's path alone in
every tool that takes a checkpoint (`exports.py`: the matrix)."""

import os
import re
import subprocess
import sys

import pytest

from tests import helpers
from tests.end_to_end import exports

pytestmark = pytest.mark.xdist_group('exports_images')
KINDS = ('default', 'finetune', 'preset', 'distill', 'lit', 'navit')


@pytest.mark.parametrize('consumer', exports.CONSUMERS)
@pytest.mark.parametrize('kind', KINDS)
def test_cell(made, kind, consumer, tmp_path):  # `made`: conftest.py's
  exports.check(made, kind, consumer, tmp_path)


def test_predict_on_the_default_jobs_workdir(made, tmp_path):
  """The README's second command after its first: five classes of an
  image, from the workdir alone; a broken image is one line naming it;
  no TensorFlow noise, no flag listing."""
  workdir = made('default')
  broken = tmp_path / 'broken.png'
  broken.write_text('not an image')
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.predict', f'--checkpoint={workdir}',
       exports.IMAGE, str(broken)], capture_output=True, text=True,
      timeout=300, cwd=helpers.ROOT,
      env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS='1'))
  assert result.returncode == 1, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0] == f'{exports.IMAGE}:' and len(lines) == 6, result.stdout
  assert all(re.fullmatch(r'  0\.\d{4}  \d', line) for line in lines[1:])
  errors = [l for l in result.stderr.splitlines()
            if not l.startswith('Preprocessing: ')]
  assert errors == [f'Error: {broken} is not an image that PIL can '
                    'decode.'], result.stderr
  missing = subprocess.run(
      [sys.executable, '-m', 'vit_jax.predict', f'--checkpoint={workdir}'],
      capture_output=True, text=True, timeout=300, cwd=helpers.ROOT)
  assert missing.stderr.splitlines() == ['Error: Give one or more image '
                                         'files.'], missing.stderr


def test_the_models_face_imports_no_entry_point():
  """`vit_jax.models` offers `from_pretrained` without importing it (it
  reads and converts files, floors above the models)."""
  code = ('import sys; from vit_jax import models; '
          "print(sorted(m for m in sys.modules if m.startswith("
          "('vit_jax.pretrained', 'vit_jax.convert')))); "
          'from vit_jax import pretrained; '
          'print(models.from_pretrained is pretrained.from_pretrained, '
          "'from_pretrained' in dir(models))")
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=120, cwd=helpers.ROOT)
  assert result.stdout.splitlines() == ['[]', 'True True'], result.stderr
