"""Few-shot linear evaluation: the closed form against scikit-learn's ridge,
the shot draws, the pre-logits, the training hook and trainer='fewshot'."""

import json
import os
import sys

import numpy as np
import pytest
from sklearn import linear_model

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import models
from vit_jax import launch
from vit_jax.evaluators import fewshot
from vit_jax.platform import sharding
from vit_jax.tasks import classification

sys.path.insert(0, helpers.ROOT)
from scripts import collect_results  # pylint: disable=g-import-not-at-top


@pytest.mark.parametrize('n, d', [(40, 6), (6, 40)])  # primal and dual
def test_lsr_matches_ridge_on_whitened_features(n, d):
  rng = np.random.default_rng(0)
  x = rng.normal(3, 2, (n, d))
  labels = np.arange(n) % 3
  mean, std, weights = fewshot.fit_lsr(x, labels, 3, l2_reg=7.)
  # The reference: ridge without intercept on the standardized features
  # plus a constant 100 column, fit to {-1, 1} one-hot targets.
  z = (x - x.mean(0)) / (x.std(0) + 1e-5)
  z = np.concatenate([z, np.full((n, 1), 100.)], 1)
  y = np.where(np.eye(3)[labels] > 0, 1., -1.)
  ridge = linear_model.Ridge(alpha=7., fit_intercept=False).fit(z, y)
  np.testing.assert_allclose(weights, ridge.coef_.T, rtol=1e-6, atol=1e-9)
  x_test = rng.normal(3, 2, (5, d))
  z_test = np.concatenate([(x_test - mean) / std, np.full((5, 1), 100.)], 1)
  np.testing.assert_array_equal(
      fewshot.predict_lsr((mean, std, weights), x_test),
      ridge.predict(z_test).argmax(1))


def test_separated_classes_are_classified():
  rng = np.random.default_rng(1)
  centres = np.eye(4, 16) * 20
  labels = np.tile(np.arange(4), 30)
  x = centres[labels] + rng.normal(0, 1, (120, 16))
  per_seed = fewshot.accuracies((x[:80], labels[:80]), (x[80:], labels[80:]),
                                4, shots=(5, 10), seeds=2, l2_reg=1.)
  assert per_seed == {5: [1., 1.], 10: [1., 1.]}


def test_pick_shots():
  labels = np.array([0, 1, 0, 1, 0, 1, 2, 2])
  idx = fewshot.pick_shots(labels, 3, 2, seed=0)
  np.testing.assert_array_equal(np.bincount(labels[idx]), [2, 2, 2])
  draws = {tuple(fewshot.pick_shots(labels, 3, 1, seed=s)) for s in range(8)}
  assert len(draws) > 1
  with pytest.raises(ValueError, match='Class 2 has 2 training examples'):
    fewshot.pick_shots(labels, 3, 3, seed=0)


def test_headless_model_outputs_the_pre_logits():
  model = models.get_model('testing', num_classes=3)
  images = np.random.default_rng(2).normal(0, .5, (2, 32, 32, 3))
  params = helpers.random_params(model, images[:1], train=False)
  logits = model.apply({'params': params}, images, train=False)
  headless = models.get_model('testing', num_classes=0)
  features = headless.apply(
      {'params': {k: v for k, v in params.items() if k != 'head'}}, images,
      train=False)
  np.testing.assert_allclose(
      features @ params['head']['kernel'] + params['head']['bias'], logits,
      rtol=1e-4, atol=1e-5)


def _fewshot_config(tiny_config, **kw):
  tiny_config.evals.fewshot.update(dict(shots=(1, 2), seeds=2, **kw))
  return tiny_config


def _evaluator(config):
  return fewshot.Evaluator('fewshot', config.evals.fewshot, config=config,
                           model=classification.make_model(config, 10),
                           mesh=sharding.make_mesh(config.mesh))


def test_training_hook_writes_fewshot_accuracy(tiny_config, tmp_path, capsys):
  config = _fewshot_config(tiny_config, every=3)
  launch.train_and_evaluate(config, str(tmp_path))
  with open(tmp_path / 'results.json') as f:
    results = json.load(f)
  assert len(results['fewshot_2shot_per_seed']) == 2
  assert 0 <= results['fewshot_1shot'] <= 1 and 'accuracy' in results
  out = capsys.readouterr().out
  assert out.count('few-shot linear accuracy on fashion_mnist_local') == 2


def test_trainer_fewshot(tiny_config, tmp_path):
  config = _fewshot_config(tiny_config)
  model = classification.make_model(config, 10)
  params = helpers.random_params(model, np.zeros((1, 32, 32, 3)),
                                 train=False)
  files.save(params, tmp_path / 'testing.npz')
  config.trainer, config.pretrained_dir = 'fewshot', str(tmp_path)
  metrics = launch.evaluate(config, str(tmp_path / 'fs'))
  with open(tmp_path / 'fs' / 'results.json') as f:
    results = json.load(f)
  assert results['fewshot_1shot'] == metrics['fewshot_1shot']
  assert results['dataset'] == 'fashion_mnist_local'
  # Features of every example: the fake test split has 37.
  evaluator = _evaluator(config)
  feats, labels = evaluator.features(params, config.pp.test)
  assert feats.shape == (37, 10) and len(labels) == 37

  config.pretrained_dir = str(tmp_path / 'none')
  with pytest.raises(FileNotFoundError, match='none/testing.npz'):
    launch.evaluate(config, str(tmp_path / 'fs'))
  config.evals.fewshot.shots = (0,)
  with pytest.raises(ValueError, match='positive integers'):
    _evaluator(config)


def test_collector_table(tmp_path):
  runs = {'a/ft0': dict(accuracy=.90), 'a/ft1': dict(accuracy=.94),
          'a/fs': dict(fewshot_1shot=.5, fewshot_1shot_per_seed=[.4, .6]),
          'b/ft0': dict(accuracy=.8, pretrained=None)}
  for name, results in runs.items():
    os.makedirs(tmp_path / name)
    with open(tmp_path / name / 'results.json', 'w') as f:
      json.dump(dict(results, model_name='M', dataset='d',
                     pretrained=results.get('pretrained', 'x.npz')), f)
  table = collect_results.table(collect_results.read_runs(
      [str(tmp_path / name) for name in runs]))
  # Two values: mean 92, standard error 4 / sqrt(2) / sqrt(2) = 2 points.
  assert table.splitlines() == [
      '| model | d fine-tune | d 1-shot |', '|---|---|---|',
      '| M | 92.0 ± 2.0 | 50.0 ± 10.0 |',
      '| M, from scratch | 80.0 | – |']
  by_folder = collect_results.table(collect_results.read_runs(
      [str(tmp_path / name) for name in runs]), rows='parent')
  assert '| b | 80.0 | – |' in by_folder
