"""`python -m vit_jax.main` as a user runs it: kill -9 mid-run, then the
same command, ends as an uninterrupted run. (Unknown config keys refused:
tests/end_to_end/test_cli.py.)"""

import os
import subprocess
import sys

from tests import helpers
from tests.conftest import FAST_COMPILE


def _main_command(workdir, fmnist_dirs, total_steps):
  manual, data = fmnist_dirs
  return [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py',
          f'--workdir={workdir}', f'--config.tfds_manual_dir={manual}',
          f'--config.tfds_data_dir={data}', '--config.batch=32',
          f'--config.total_steps={total_steps}', '--config.warmup_steps=5',
          '--config.checkpoint_every=10', '--config.progress_every=10',
          '--config.evals.test.every=0', '--config.shuffle_buffer=100',
          # One block: resuming does not depend on the depth.
          '--config.model.transformer.num_layers=1']


def test_kill_9_then_rerun_equals_uninterrupted(fmnist_dirs, tmp_path):
  """The README's promise, end to end: SIGKILL mid-run, same command again."""
  root = helpers.ROOT
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE)  # one device, as a user has
  steps = 40  # killed at 20, resumed from the checkpoint of step 10
  subprocess.run(_main_command(tmp_path / 'ref', fmnist_dirs, steps),
                 check=True, cwd=root, env=env, capture_output=True,
                 timeout=300)

  command = _main_command(tmp_path / 'run', fmnist_dirs, steps)
  rerun = helpers.kill_9_and_rerun(command, env, 20)
  assert 'Resuming from step ' in rerun
  assert 'Done: 40 steps' in rerun

  helpers.assert_npz_close(tmp_path / 'run' / 'ViT-fmnist.npz',
                           tmp_path / 'ref' / 'ViT-fmnist.npz')
