"""Test set-up: 8 simulated CPU devices, quiet TensorFlow without GPUs;
tiny offline data; one JAX compilation cache for the whole run."""

import atexit
import gzip
import os
import shutil
import struct
import tempfile

# The tests' programs are small and many: compiling them is most of the
# suite's time, running them little. LLVM's optimization of the CPU code
# (not XLA's own passes: fusion, layout, buffers) is left out for them, and
# XLA:CPU emits fusions with its elemental emitter rather than the MLIR
# fusion emitters: a tiny model's training step compiles in a third to a
# half of the time, to the same results within float32 rounding.
FAST_COMPILE = ('--xla_backend_optimization_level=0 '
                '--xla_cpu_use_fusion_emitters=false')
os.environ.setdefault(
    'XLA_FLAGS', f'--xla_force_host_platform_device_count=8 {FAST_COMPILE}')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('CUDA_VISIBLE_DEVICES', '')
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# Many tests compile the same steps, in this process, in the other pytest
# worker and in the commands they start: JAX's persistent cache, made here
# by the first process (pytest's, before its workers start, which inherit
# the variable), serves them all and goes with that process.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _cache = tempfile.mkdtemp(prefix='vit_jax_tests_jax_cache_')
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.2')

import numpy as np  # pylint: disable=g-import-not-at-top,g-bad-import-order
import pytest
import tensorflow_datasets as tfds

from vit_jax.configs import common
from vit_jax.data import pipeline

from tests import suite_cost


def write_idx(path, array):
  """Writes `array` (uint8) in the gzipped idx format of the MNIST family."""
  header = struct.pack('>BBBB', 0, 0, 8, array.ndim)
  header += struct.pack(f'>{array.ndim}I', *array.shape)
  with gzip.open(path, 'wb') as f:
    f.write(header + array.astype(np.uint8).tobytes())


def fake_fashion_mnist(root, n_train=96, n_test=37, seed=0):
  """Tiny idx files; the class is readable from the image (a bright band)."""
  rng = np.random.default_rng(seed)
  for prefix, n in (('train', n_train), ('t10k', n_test)):
    labels = np.arange(n) % 10
    images = rng.integers(0, 60, (n, 28, 28))
    for i, label in enumerate(labels):
      images[i, 2 * label + 4:2 * label + 7] = 250
    write_idx(f'{root}/{prefix}-images-idx3-ubyte.gz', images)
    write_idx(f'{root}/{prefix}-labels-idx1-ubyte.gz', labels)
  return root


@pytest.fixture(scope='session')
def fmnist_dirs(tmp_path_factory):
  """(manual_dir with tiny idx files, tfds data_dir shared by the tests)."""
  manual = fake_fashion_mnist(str(tmp_path_factory.mktemp('fmnist_manual')))
  return manual, str(tmp_path_factory.mktemp('tfds'))


CIFAR_NAMES = ('airplane', 'automobile', 'bird', 'cat', 'deer', 'dog', 'frog',
               'horse', 'ship', 'truck')


def _cifar_batch(path, n, seed):
  """CIFAR's binary format: a label byte, then 32x32 R, G and B planes; the
  class is readable from the image (bright row 3 * class)."""
  rng = np.random.default_rng(seed)
  records = []
  for i in range(n):
    image = rng.integers(0, 100, (3, 32, 32), np.uint8)
    image[:, 3 * (i % 10)] = 250
    records.append(bytes([i % 10]) + image.tobytes())
  path.write_bytes(b''.join(records))


@pytest.fixture(scope='session')
def cifar10_dir(tmp_path_factory):
  """A tfds data_dir with `cifar10` prepared from fake files: 5 x 16
  training and 520 test images (the original's notebook evaluates in
  batches of 512)."""
  root = tmp_path_factory.mktemp('cifar_download')
  files = root / 'cifar-10-batches-bin'
  files.mkdir()
  (files / 'batches.meta.txt').write_text('\n'.join(CIFAR_NAMES) + '\n')
  for i in range(1, 6):
    _cifar_batch(files / f'data_batch_{i}.bin', 16, i)
  _cifar_batch(files / 'test_batch.bin', 520, 0)
  data_dir = str(tmp_path_factory.mktemp('tfds'))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tfds.download.DownloadManager, 'download_and_extract',
                  lambda self, url: str(root))
    tfds.builder('cifar10', data_dir=data_dir).download_and_prepare()
  return data_dir


@pytest.fixture
def tiny_config(fmnist_dirs):
  return make_tiny_config(fmnist_dirs)


def make_tiny_config(fmnist_dirs):
  """The `testing` ViT on 32x32 tiny Fashion-MNIST; a few steps, 8 devices."""
  config = common.get_config()
  config.dataset = 'fashion_mnist_local'
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.pp.crop = 32
  common.with_model(config, 'testing')
  config.total_steps = 6
  config.warmup_steps = 1
  config.batch = 8
  config.batch_eval = 8
  config.base_lr = 0.01
  config.shuffle_buffer = 100
  config.progress_every = 2
  config.evals.test.every = 0
  config.checkpoint_every = 2
  return config


def interrupt_at(monkeypatch, batch_index, action, stream=pipeline):
  """Runs `action(batch)` when the training stream (`stream.train_iterator`:
  the image pipeline's, or e.g. `data.video`'s) hands out batch
  `batch_index` (a crash, a SIGTERM, a poisoned batch)."""
  original = stream.train_iterator

  def wrapped(*args, **kw):
    for i, batch in enumerate(original(*args, **kw)):
      if i == batch_index:
        action(batch)
      yield batch

  monkeypatch.setattr(stream, 'train_iterator', wrapped)


def crashed_and_resumed(config, workdir, monkeypatch, batch_index,
                        stream=pipeline):
  """The final parameters of `config` run in `workdir` after a run there
  crashed when its stream (`stream.train_iterator`, as `interrupt_at`'s)
  handed out batch `batch_index`: the caller compares them with the same
  config's run that never stopped."""
  from vit_jax import launch  # pylint: disable=g-import-not-at-top

  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, batch_index, crash, stream)
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(config, str(workdir))
  monkeypatch.undo()
  return launch.train_and_evaluate(config, str(workdir))


# The folders whose tests train, compile for a slice or start processes:
# seconds to a minute each, against a fraction of a second elsewhere.
LONG_FIRST = ('end_to_end', 'original', 'platform', 'run', 'tasks')


def pytest_collection_modifyitems(items):
  """The tests of an xdist group (one worker runs them all, one after the
  other: the longest stretch of the suite) first, so that the other worker
  shares out the rest meanwhile rather than waiting for them at the end;
  then the long folders' tests, so that the end is many short tests, which
  the two workers share out evenly, rather than a long one alone."""
  items.sort(key=lambda item: (
      item.get_closest_marker('xdist_group') is None,
      item.path.parent.name not in LONG_FIRST))


# The suite's cost (tests/suite_cost.py): each file's CPU seconds against the
# budget of docs/testing.md, and per test detail for scripts/test_timings.py.
_PHASE_CPU = suite_cost.PhaseCpu()
_FILE_BUDGET = suite_cost.FileBudget()
_TEST_COST = None


def pytest_configure(config):
  global _TEST_COST
  if os.environ.get(suite_cost.TIMINGS_VAR):
    worker = getattr(config, 'workerinput', {}).get('workerid', 'main')
    _TEST_COST = suite_cost.TestCost(os.environ[suite_cost.TIMINGS_VAR],
                                     worker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
  if _TEST_COST is None:
    return (yield)
  around = _TEST_COST.around(item)
  next(around)
  try:
    return (yield)
  finally:
    next(around, None)


def pytest_runtest_logstart():
  _PHASE_CPU.logstart()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport():
  return _PHASE_CPU.makereport((yield))


def pytest_runtest_logreport(report):
  _FILE_BUDGET.logreport(report)


def pytest_sessionfinish(session):
  if not hasattr(session.config, 'workerinput'):
    _FILE_BUDGET.sessionfinish(session)


def pytest_terminal_summary(terminalreporter):
  _FILE_BUDGET.summary(terminalreporter)
