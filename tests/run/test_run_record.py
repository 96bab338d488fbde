"""A workdir keeps its run: changed settings refused, evaluation beside
training's results, no empty workdir after a failure, progress lines."""

import hashlib
import json
import os
import shutil

import pytest

from tests.conftest import interrupt_at
from tests.conftest import make_tiny_config
from vit_jax import launch
from vit_jax.run import run_record


@pytest.fixture(scope='module')
def finished(tmp_path_factory, fmnist_dirs):
  """A finished 6-step run and its workdir."""
  config = make_tiny_config(fmnist_dirs)
  workdir = str(tmp_path_factory.mktemp('finished'))
  launch.train_and_evaluate(config, workdir)
  return config, workdir


def _digests(workdir):
  """sha256 of every file under `workdir`, by relative path."""
  out = {}
  for root, _, files in os.walk(workdir):
    for name in files:
      path = os.path.join(root, name)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, workdir)] = hashlib.sha256(
            f.read()).hexdigest()
  return out


def test_config_is_recorded(finished):
  config, workdir = finished
  with open(os.path.join(workdir, 'config.json')) as f:
    recorded = json.load(f)
  assert recorded['dataset'] == 'fashion_mnist_local'
  assert recorded['model']['hidden_size'] == config.model.hidden_size
  assert recorded['total_steps'] == 6


def test_changed_dataset_is_refused_and_nothing_changes(finished):
  config, workdir = finished
  before = _digests(workdir)
  other = config.copy_and_resolve_references()
  other.dataset, other.base_lr = 'mnist5k', 0.5
  with pytest.raises(ValueError, match=(
      r"(?s)other settings.*base_lr: 0.01 -> 0.5\n"
      r"  dataset: 'fashion_mnist_local' -> 'mnist5k'.*allow_config_change")):
    launch.train_and_evaluate(other, workdir)
  assert _digests(workdir) == before


def test_free_settings_may_change_on_resume(finished, capsys):
  config, workdir = finished
  other = config.copy_and_resolve_references()
  other.progress_every, other.batch_eval, other.evals.test.every = 1, 16, 2
  run_record.check_config(other, workdir)  # no error
  launch.train_and_evaluate(other, workdir)
  assert 'nothing to train' in capsys.readouterr().out


def test_allowed_change_resumes_and_is_recorded(fmnist_dirs, tmp_path, capsys):
  config = make_tiny_config(fmnist_dirs)
  config.total_steps = 4
  launch.train_and_evaluate(config, str(tmp_path))
  config.total_steps = 6
  with pytest.raises(ValueError, match='total_steps: 4 -> 6'):
    launch.train_and_evaluate(config, str(tmp_path))
  launch.train_and_evaluate(config, str(tmp_path), allow_config_change=True)
  out = capsys.readouterr().out
  assert f'Resuming from step 4 in {tmp_path}' in out
  assert 'Done: 6 steps' in out
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['total_steps'] == 6


def test_evaluation_writes_beside_training_results(finished, tmp_path):
  config, workdir = finished
  with open(os.path.join(workdir, 'results.json'), 'rb') as f:
    trained = f.read()
  config = config.copy_and_resolve_references()
  config.trainer = 'evaluate'
  result = launch.train_and_evaluate(config, workdir)
  with open(os.path.join(workdir, 'results.json'), 'rb') as f:
    assert f.read() == trained  # the training's figures are kept
  with open(os.path.join(workdir, 'eval_results.json')) as f:
    assert json.load(f)['accuracy'] == result['accuracy']
  # In its own workdir, evaluation writes results.json.
  config.pretrained_path = os.path.join(workdir, 'testing.npz')
  launch.train_and_evaluate(config, str(tmp_path / 'own'))
  assert os.listdir(tmp_path / 'own') == ['results.json'] or (
      'results.json' in os.listdir(tmp_path / 'own') and
      'eval_results.json' not in os.listdir(tmp_path / 'own'))


def test_failed_first_run_leaves_no_workdir(tiny_config, tmp_path,
                                            monkeypatch):
  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, 0, crash)
  workdir = tmp_path / 'new'
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(tiny_config, str(workdir))
  assert not workdir.exists()
  # A workdir that existed before is left as it was found, files included.
  workdir.mkdir()
  (workdir / 'notes.txt').write_text('mine')
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(tiny_config, str(workdir))
  assert (workdir / 'notes.txt').read_text() == 'mine'


def test_a_short_run_reports_its_first_and_last_step(tiny_config, tmp_path,
                                                     capsys):
  tiny_config.progress_every, tiny_config.total_steps = 100, 3
  tiny_config.checkpoint_every = 0  # a save reports too
  launch.train_and_evaluate(tiny_config, str(tmp_path))
  lines = [l for l in capsys.readouterr().out.splitlines() if ' loss ' in l
           and 'img/s' in l]
  assert [l.split(']')[0] for l in lines] == ['[1/3', '[3/3']


def test_keys_of_another_version_are_not_a_change(finished, tmp_path):
  """A workdir recorded before a setting existed resumes: a key that one
  side lacks was added or removed by the code, not by the user."""
  config, workdir = finished
  with open(os.path.join(workdir, 'config.json')) as f:
    recorded = json.load(f)
  del recorded['pp']['flip']
  recorded['removed_since'] = 1
  other = tmp_path / 'w'
  shutil.copytree(workdir, other)
  with open(other / 'config.json', 'w') as f:
    json.dump(recorded, f)
  run_record.check_config(config, str(other))  # no error
  changed = config.copy_and_resolve_references()
  changed.pp.crop = 48
  with pytest.raises(ValueError, match='pp.crop: 32 -> 48'):
    run_record.check_config(changed, str(other))
