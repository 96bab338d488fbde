"""benchmarks/gpu.py on the CPU with the `testing` preset: its rows under
its section of a copy of docs/performance.md, and neither TensorFlow nor
torch imported (a lent GPU's image has no TensorFlow)."""

import os
import re
import shutil
import subprocess
import sys

import jax

from tests import helpers

SECTION = '## One GPU (`benchmarks/gpu.py`)'


def test_rows_are_appended_without_tensorflow(tmp_path):
  doc = tmp_path / 'performance.md'
  shutil.copy(os.path.join(helpers.ROOT, 'docs', 'performance.md'), doc)
  before = doc.read_text()
  run = subprocess.run(
      [sys.executable, '-X', 'importtime', 'benchmarks/gpu.py',
       '--models=testing,testing', '--size=32', '--batch=4',
       '--dtype=float32', '--rounds=1', '--steps=1', f'--doc={doc}'],
      capture_output=True, text=True, timeout=300, cwd=helpers.ROOT,
      check=True)
  imported = {line.rsplit('|', 1)[-1].strip().split('.')[0]
              for line in run.stderr.splitlines()
              if line.startswith('import time:')}
  assert 'jax' in imported and not imported & {'tensorflow', 'torch'}
  text = doc.read_text()
  assert text.startswith(before.rstrip('\n')) and text.count(SECTION) == 1
  table = text[text.index(SECTION):].split('\n')
  rows = [line for line in table if line.startswith('| 20')]
  row = (r'\| \d{4}-\d\d-\d\d \| cpu \| ' + re.escape(jax.__version__) +
         r' \| testing \| float32 \| 32 \| 4 \| \d+ \| - \| \d+ \| - \| - \| '
         r'\d+ \|')
  assert len(rows) == 2 and all(re.fullmatch(row, r) for r in rows)
  assert table.index(rows[0]) + 1 == table.index(rows[1])
