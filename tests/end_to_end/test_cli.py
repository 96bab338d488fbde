"""Errors a user can fix read as a line or two, with the closest names."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import helpers
from vit_jax import models
from vit_jax.data import pipeline
from vit_jax.platform import tf_startup

ROOT = helpers.ROOT
# One worker runs the tests of `cli_results`' process, so that it starts
# once.
pytestmark = pytest.mark.xdist_group('cli')


# oneDNN's custom ops on, as AVX-512 CPUs have them by default: TensorFlow's
# import then writes its C++ start-up lines, which must not reach the user.
ONEDNN = dict(os.environ, TF_ENABLE_ONEDNN_OPTS='1')


def _run(*args, **kw):
  kw.setdefault('env', ONEDNN)
  return subprocess.run([sys.executable, *args], capture_output=True,
                        text=True, timeout=300, cwd=ROOT, **kw)


def _main(tmp_path, *flags):
  return _run('-m', 'vit_jax.main', '--config=configs/default.py',
              f'--workdir={tmp_path}/w', *flags)


BAD_FLAGS = [
    ('--config.foo=1', "Unknown config key 'foo'; expected one of "),
    ('--config.pp.crp=3', "Unknown config key 'pp.crp'; did you mean pp.crop"),
    ('--config.evals.tset.every=3', "'evals.tset'; did you mean evals.test"),
    ('--config.batch=abc', 'flag --config.batch=abc: invalid literal'),
    # The original's name for base_lr (was test_main's own process).
    ('--config.learning_rate=0.1', "Unknown config key 'learning_rate'"),
]
EARLY_ERRORS = ['--config.foo=1', '--config.trainer=trian',
                '--config.optimizer=adamx',
                '--config.pretrained_path=missing.npz']

# Command lines whose checks need no fresh process each: `vit_jax.models`'
# and `vit_jax.predict`'s, after main's (those check that TensorFlow is not
# imported yet).
OTHER_RUNS = {
    'unknown preset': ('vit_jax.models', ['--name=ViT-Ti16']),
    'ViT-L_16': ('vit_jax.models', ['--name=ViT-L_16']),
    'ViViT-B_16x2': ('vit_jax.models', ['--name=ViViT-B_16x2',
                                        '--num_classes=400']),
}


@pytest.fixture(scope='module')
def cli_results(tmp_path_factory):
  """{name: (exit code, stdout, stderr, TensorFlow imported?, workdir)}, all
  run in one process (`helpers.cli_runs`): main with each flag of BAD_FLAGS
  and EARLY_ERRORS (named by the flag; errors said before TensorFlow loads,
  whose start-up lines a run of its own filters), main with a BEiT config's
  bad mask ratio ('beit ratio'), then OTHER_RUNS, then predict on a corrupt
  checkpoint ('corrupt')."""
  flags = list(dict.fromkeys([f for f, _ in BAD_FLAGS] + EARLY_ERRORS))
  root = tmp_path_factory.mktemp('cli_results')
  bad = root / 'bad.npz'
  bad.write_bytes(b'PK\x03\x04 not really a zip archive')
  image = os.path.join(ROOT, 'tests', 'data', 'predict_image.jpg')
  runs = {flag: ('vit_jax.main', ['--config=configs/default.py',
                                  f'--workdir={root / str(i) / "w"}', flag])
          for i, flag in enumerate(flags)}
  runs['beit ratio'] = ('vit_jax.main', [
      '--config=configs/beit_fmnist.py:vqkd', f'--workdir={root / "beit"}',
      '--config.beit.mask_ratio=1.2'])
  runs.update(OTHER_RUNS)
  runs['corrupt'] = ('vit_jax.predict', ['--model_name=testing',
                                         f'--checkpoint={bad}', image])
  results = helpers.cli_runs(runs.values(), env=ONEDNN)
  out = {}
  for (name, (_, args)), r in zip(runs.items(), results):
    workdir = args[1][len('--workdir='):] if name in flags else None
    out[name] = (r['code'], r['stdout'], r['stderr'], r['tensorflow'],
                 workdir)
  out['corrupt'] += (bad,)
  return out


@pytest.mark.parametrize('flag,message', BAD_FLAGS)
def test_bad_config_flag_is_one_line(cli_results, flag, message):
  code, _, stderr, _, workdir = cli_results[flag]
  assert code == 1
  lines = stderr.splitlines()
  assert len(lines) == 2, stderr
  assert lines[0].startswith('Error: ') and message in lines[0]
  assert lines[1] == 'Pass --helpfull to see the flags.'
  assert not os.path.exists(workdir)


def test_tensorflow_import_is_quiet():
  """TensorFlow's start-up lines are filtered out, by whichever module
  imports it first (flax.io looks for it before importing it), and CUDA's
  failed start on a machine without a GPU; other lines pass."""
  result = _run('-c', 'import vit_jax, clu.metric_writers, tensorflow')
  assert result.returncode == 0 and result.stderr == '', result.stderr
  result = _run('-c', 'import vit_jax, flax.training.checkpoints; '
                'import tensorflow as tf; '
                "tf.config.set_visible_devices([], 'GPU')")
  assert result.returncode == 0 and result.stderr == '', result.stderr
  plain = _run('-c', 'import tensorflow')  # without vit_jax: the lines
  assert 'oneDNN custom operations are on' in plain.stderr


def test_filtered_stderr_keeps_what_is_not_noise(capfd):
  with tf_startup.filtered_stderr():
    os.write(2, b'WARNING: All log messages before absl::InitializeLog() is '
             b'called are written to STDERR\n'
             b'I0000 00:00:1796157084.382262    2123 port.cc:153] oneDNN\n'
             b'W0000 00:00:1796157084.4    2123 cpu_feature_guard.cc:227] x\n'
             b'To enable the following instructions: AVX2, in other\n'
             b'E0000 00:00:1796500136.364917   17038 cuda_platform.cc:52] '
             b'failed call to cuInit: INTERNAL: CUDA error: Failed call to '
             b'cuInit: UNKNOWN ERROR (303)\n'
             b'E0000 00:00:1796157084.5    2123 foo.cc:1] a real error\n'
             b'Traceback (most recent call last):\n')
  assert capfd.readouterr().err == (
      'E0000 00:00:1796157084.5    2123 foo.cc:1] a real error\n'
      'Traceback (most recent call last):\n')


@pytest.mark.parametrize('flag', EARLY_ERRORS)
def test_config_errors_come_before_tensorflow(cli_results, flag):
  """A bad key, value or file is said before the data stack is imported."""
  code, _, stderr, tensorflow, workdir = cli_results[flag]
  assert (code, tensorflow) == (1, False), stderr
  assert stderr.startswith('Error: '), stderr
  assert not os.path.exists(workdir)


def test_unknown_dataset_names_the_closest(tmp_path):
  result = _main(tmp_path, '--config.dataset=cifar11')
  assert result.returncode == 1
  assert "Unknown dataset 'cifar11'; did you mean" in result.stderr
  assert 'cifar10' in result.stderr
  assert len(result.stderr.strip().splitlines()) <= 2, result.stderr
  assert not os.path.exists(tmp_path / 'w')  # no empty workdir left


def test_unknown_dataset_error(tiny_config):
  tiny_config.dataset = 'fashion_mnist_locl'
  with pytest.raises(ValueError, match='did you mean fashion_mnist_local'):
    pipeline.get_builder(tiny_config)


def test_unknown_preset_names_the_closest(cli_results):
  with pytest.raises(ValueError, match="'ViT-Ti16'; did you mean ViT-Ti_16"):
    models.get_model('ViT-Ti16')
  with pytest.raises(KeyError):  # still a KeyError for dict-minded callers
    models.MODEL_CONFIGS['ViT-Ti16']  # pylint: disable=pointless-statement
  code, _, stderr, _, _ = cli_results['unknown preset']
  assert code == 1
  lines = stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      "Error: Unknown model preset 'ViT-Ti16'; did you mean ViT-Ti_16, ")


def test_traceback_only_with_verbosity(tmp_path):
  script = tmp_path / 'tool.py'
  script.write_text(textwrap.dedent('''
      from vit_jax import cli
      def main(argv):
        raise FileNotFoundError('x.npz: no such file.')
      cli.run(main)
  '''))
  quiet = _run(str(script))
  assert quiet.returncode == 1
  assert quiet.stderr.strip() == 'Error: x.npz: no such file.'
  loud = _run(str(script), '--verbosity=1')
  assert loud.returncode != 0 and 'Traceback' in loud.stderr


def test_models_cli_needs_no_compute(cli_results):
  code, stdout, stderr, _, _ = cli_results['ViT-L_16']
  assert code == 0, stderr
  assert stdout.strip() == ('ViT-L_16: 304,326,632 parameters; images '
                            '(2, 224, 224, 3) -> logits (2, 1000)')
  assert 'Unable to initialize backend' not in stderr


def test_models_cli_feeds_a_video_model_clips(cli_results):
  code, stdout, stderr, _, _ = cli_results['ViViT-B_16x2']
  assert code == 0, stderr
  assert stdout.strip() == (
      'ViViT-B_16x2: 88,954,000 parameters; clips (2, 32, 224, 224, 3) -> '
      'logits (2, 400)')


def test_two_first_runs_prepare_a_dataset_once(fmnist_dirs, tmp_path):
  """Two processes preparing the same dataset at once both succeed."""
  manual, _ = fmnist_dirs
  code = textwrap.dedent(f'''
      import time
      import ml_collections
      from vit_jax.data import pipeline
      from vit_jax.data import local_datasets
      # Slow enough that the two preparations overlap.
      generate = local_datasets.FashionMnistLocal._generate_examples
      def slow(self, *args):
        for example in generate(self, *args):
          time.sleep(0.02)
          yield example
      local_datasets.FashionMnistLocal._generate_examples = slow
      config = ml_collections.ConfigDict(dict(
          dataset='fashion_mnist_local', tfds_data_dir={str(tmp_path)!r},
          tfds_manual_dir={manual!r}, tfds_download=False))
      builder = pipeline.get_builder(config)
      print(builder.info.splits['train'].num_examples)
  ''')
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', CUDA_VISIBLE_DEVICES='')
  procs = [subprocess.Popen([sys.executable, '-c', code], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
    assert out.strip().splitlines()[-1] == '96'


def test_a_bad_beit_ratio_is_one_error_line(cli_results):
  """(Was tests/tasks/test_beit.py's, in a process of its own.)"""
  code, _, stderr, _, _ = cli_results['beit ratio']
  assert code != 0
  errors = [l for l in stderr.splitlines() if l.startswith('Error:')]
  assert errors == ['Error: config.beit.mask_ratio=1.2 must be in (0, 1).']


def test_corrupt_checkpoint_is_one_line(cli_results):
  code, _, stderr, _, _, bad = cli_results['corrupt']
  assert code == 1
  lines = stderr.strip().splitlines()
  assert len(lines) == 1, stderr
  assert lines[0].startswith(f'Error: Cannot read checkpoint {bad}: not an '
                             '.npz archive, or truncated or corrupt')
