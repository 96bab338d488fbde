"""Several JAX processes on 127.0.0.1, as on a pod: `vit_jax.main --distributed`.

A run with 2 processes of 4 CPU devices each must match 1 process with 8,
resume across the two topologies, agree on the step to save when only one
process gets SIGTERM, and stop in bounded time when a process is lost.
The runs of 1 process with 8 devices that are no process's test (the
uninterrupted references, the run a SIGTERM preempts before 2 processes
resume it, the resumes that finish a run) run in this pytest process,
which has 8 CPU devices: the same command's config and code path as
`vit_jax.main`, without a process start and its compiles.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import helpers
from tests.conftest import FAST_COMPILE
from tests.conftest import interrupt_at
from vit_jax.configs import default
from vit_jax.configs import siglip_fmnist
from vit_jax.data import captions
from vit_jax.data import pipeline
from vit_jax.data import tokenizers

pytestmark = pytest.mark.xdist_group('multihost')  # one `reference` run

ROOT = helpers.ROOT
STEPS = 24  # checkpoints every 6; the signals come at steps 10 and 15
# The default job's ViT at one block of width 32: what is checked (the
# processes' agreement, saves and resumes) does not depend on its size, and
# each process compiles it in a fraction of the time.
SMALL = ['--config.model.hidden_size=32',
         '--config.model.transformer.mlp_dim=64',
         '--config.model.transformer.num_layers=1']


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _command(workdir, fmnist_dirs, extra=()):
  manual, data = fmnist_dirs
  return [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py',
          f'--workdir={workdir}', f'--config.tfds_manual_dir={manual}',
          f'--config.tfds_data_dir={data}', '--config.batch=32',
          '--config.batch_eval=16', f'--config.total_steps={STEPS}',
          '--config.warmup_steps=5', '--config.checkpoint_every=6',
          '--config.progress_every=5', '--config.evals.test.every=0',
          '--config.shuffle_buffer=100', *SMALL, *extra]


def _start(workdir, fmnist_dirs, num_processes, extra=(), command=None):
  """Starts the run's processes (`command`: `_command`'s signature); their
  output goes to files in `workdir`."""
  command = command or _command
  os.makedirs(workdir, exist_ok=True)
  port, procs = _free_port(), []
  for i in range(num_processes):
    flags = list(extra)
    if num_processes > 1:
      flags += ['--distributed', f'--coordinator_address=127.0.0.1:{port}',
                f'--num_processes={num_processes}', f'--process_id={i}']
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count='
               f'{8 // num_processes} {FAST_COMPILE}')
    out = open(os.path.join(workdir, f'log{i}.txt'), 'a')
    procs.append(subprocess.Popen(
        command(workdir, fmnist_dirs, flags), cwd=ROOT, env=env, text=True,
        stdout=out, stderr=subprocess.STDOUT))
  return procs


def _log(workdir, i=0) -> str:
  with open(os.path.join(workdir, f'log{i}.txt')) as f:
    return f.read()


def _wait(procs, timeout=300):
  for p in procs:
    p.wait(timeout=timeout)
  return [p.returncode for p in procs]


def _run(workdir, fmnist_dirs, num_processes):
  codes = _wait(_start(workdir, fmnist_dirs, num_processes))
  assert codes == [0] * num_processes, _log(workdir)


def _run_here(workdir, fmnist_dirs, command=None, get_config=None):
  """`command`'s run (1 process, 8 devices) in this process, as
  `vit_jax.main` runs it (`helpers.run_here`)."""
  helpers.run_here((command or _command)(workdir, fmnist_dirs), get_config)


def _signal_when(procs, workdir, line, target, sig):
  """Sends `sig` to `procs[target]` once process 0 has printed `line`."""
  deadline = time.time() + 300
  while line not in _log(workdir):
    assert time.time() < deadline and procs[0].poll() is None, _log(workdir)
    time.sleep(0.2)
  procs[target].send_signal(sig)


def _assert_same_params(workdir, reference):
  expected = np.load(os.path.join(reference, 'ViT-fmnist.npz'))
  got = np.load(os.path.join(workdir, 'ViT-fmnist.npz'))
  assert sorted(got.files) == sorted(expected.files)
  for key in expected.files:
    if key.endswith('key/bias'):
      # Softmax ignores a bias added to every key: its true gradient is 0 and
      # AdamW scales float noise (which depends on the reduction order) up.
      assert np.abs(got[key]).max() < 1e-4, key
      continue
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)


@pytest.fixture(scope='module')
def prepared(fmnist_dirs):
  """The tiny dataset, prepared once before processes start to read it."""
  config = default.get_config()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  pipeline.get_builder(config)
  return fmnist_dirs


@pytest.fixture(scope='module')
def reference(prepared, tmp_path_factory):
  """An uninterrupted run: 1 process, 8 devices."""
  fmnist_dirs = prepared
  workdir = str(tmp_path_factory.mktemp('reference'))
  _run_here(workdir, fmnist_dirs)
  return workdir


def test_two_processes_equal_one(reference, fmnist_dirs, tmp_path):
  _run(str(tmp_path), fmnist_dirs, 2)
  _assert_same_params(str(tmp_path), reference)
  with open(tmp_path / 'results.json') as f:
    two = json.load(f)
  with open(os.path.join(reference, 'results.json')) as f:
    one = json.load(f)
  assert two['count'] == one['count'] == 37  # every test image, once
  assert two['accuracy'] == one['accuracy']


def test_preempted_runs_resume_across_topologies(reference, fmnist_dirs,
                                                 tmp_path, monkeypatch,
                                                 capsys):
  """1 process (this one) saves on SIGTERM and 2 resume it; SIGTERM to one
  of those 2: both save the step the sync point names, and 1 process
  finishes the run as the uninterrupted one did."""
  workdir = str(tmp_path)
  interrupt_at(monkeypatch, 10,
               lambda batch: os.kill(os.getpid(), signal.SIGTERM))
  _run_here(workdir, fmnist_dirs)
  monkeypatch.undo()
  assert 'Preempted: saved step 11' in capsys.readouterr().out
  procs = _start(workdir, fmnist_dirs, 2)
  _signal_when(procs, workdir, '[15/', target=1, sig=signal.SIGTERM)
  assert _wait(procs) == [0, 0], _log(workdir, 1)
  saved = {_log(workdir, i).split('Preempted: saved step ')[-1].split()[0]
           for i in range(2)}
  assert len(saved) == 1, saved
  assert 15 <= int(saved.pop()) < STEPS
  _run_here(workdir, fmnist_dirs)
  _assert_same_params(workdir, reference)


def _kill_one(workdir, fmnist_dirs, line, lost):
  """kill -9 of process `lost` once `line` is printed; returns the other's
  log after it stopped, failing unless it did so within a minute."""
  procs = _start(workdir, fmnist_dirs, 2, ['--heartbeat_timeout=5'])
  _signal_when(procs, workdir, line, target=lost, sig=signal.SIGKILL)
  killed, survivor = time.time(), 1 - lost
  procs[survivor].wait(timeout=120)
  assert time.time() - killed < 60
  assert procs[survivor].returncode != 0
  return _log(workdir, survivor)


def test_lost_process_stops_the_others(reference, fmnist_dirs, tmp_path):
  """kill -9 of process 1: process 0 stops within the heartbeat timeout,
  naming the lost process, and the last complete checkpoint resumes."""
  workdir = str(tmp_path)
  log = _kill_one(workdir, fmnist_dirs, '[15/', lost=1)
  assert 'tasks are unhealthy' in log and '\n1\n' in log, log[-2000:]
  _run_here(workdir, fmnist_dirs)
  _assert_same_params(workdir, reference)


def test_lost_coordinator_stops_the_others(prepared, tmp_path):
  """kill -9 of process 0, which runs JAX's coordination service."""
  log = _kill_one(str(tmp_path), prepared, '[10/', lost=0)
  assert 'coordination service' in log


def _siglip_command(vocab):
  """configs/siglip_fmnist.py, its towers one block deep, SGD."""
  def command(workdir, fmnist_dirs, extra=()):
    manual, data = fmnist_dirs
    return [sys.executable, '-m', 'vit_jax.main',
            '--config=configs/siglip_fmnist.py:siglip', f'--workdir={workdir}',
            f'--config.tfds_manual_dir={manual}',
            f'--config.tfds_data_dir={data}', f'--config.lit.vocab_path={vocab}',
            '--config.batch=32', '--config.batch_eval=16',
            '--config.total_steps=6', '--config.warmup_steps=0',
            '--config.checkpoint_every=0', '--config.progress_every=3',
            '--config.evals.zeroshot.every=0', '--config.shuffle_buffer=100',
            '--config.optimizer=sgd', '--config.weight_decay=0',
            '--config.model.image.transformer.num_layers=1',
            '--config.model.text.num_layers=1', *extra]
  return command


def test_siglip_ring_across_processes(prepared, tmp_path):
  """The chunked sigmoid loss passes captions around the ring of all 8
  devices, across the 2 processes: the same parameters as 1 process."""
  vocab = str(tmp_path / 'vocab.model')
  tokenizers.train_sentencepiece(
      captions.all_captions(siglip_fmnist.get_config()), vocab, 256)
  _run_here(tmp_path / '1', prepared, _siglip_command(vocab),
            lambda: siglip_fmnist.get_config('siglip'))
  workdir = str(tmp_path / '2')
  codes = _wait(_start(workdir, prepared, 2, command=_siglip_command(vocab)))
  assert codes == [0, 0], _log(workdir)
  name = 'LiT-fmnist-siglip-scratch.npz'
  one, two = (np.load(tmp_path / str(n) / name) for n in (1, 2))
  assert sorted(one.files) == sorted(two.files)
  for key in one.files:
    np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-6,
                               err_msg=key)
