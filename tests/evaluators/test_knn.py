"""Weighted k-NN evaluation: the vote by hand and against scikit-learn's
KNeighborsClassifier, the evaluator on every test example, trainer='evaluate'
on a headless encoder, and the settings refused."""

import json

import numpy as np
import pytest
from sklearn import neighbors

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import launch
from vit_jax.configs import common as configs_common
from vit_jax.evaluators import common
from vit_jax.evaluators import knn
from vit_jax.platform import sharding
from vit_jax.tasks import classification


def test_vote_by_hand():
  # Cosine similarities to the query: 1, .8, 0, -1 (the norms do not count).
  bank = np.array([[2., 0.], [2.4, 1.8], [0., .5], [-1., 0.]], np.float32)
  labels = np.array([0, 1, 1, 2])
  query = np.array([[3., 0.]], np.float32)
  votes = knn.knn_predict(bank, labels, query, 3, k=3, temperature=1.)
  # The nearest is of class 0, but the next two outweigh it: e < e^.8 + 1.
  expected = np.array([np.e, np.exp(.8) + 1, 0.])
  np.testing.assert_allclose(votes[0], expected / expected.sum(), rtol=1e-6)
  votes = knn.knn_predict(bank, labels, query, 3, k=1, temperature=1.)
  np.testing.assert_array_equal(votes, [[1., 0., 0.]])
  votes = knn.knn_predict(bank, labels, query, 3, k=4, temperature=.5)
  expected = np.exp(np.array([2., np.logaddexp(1.6, 0.), -2.]))
  np.testing.assert_allclose(votes[0], expected / expected.sum(), rtol=1e-5)


def _sklearn(bank, labels, queries, k, temperature):
  """scikit-learn's votes: cosine distance is 1 - similarity."""
  clf = neighbors.KNeighborsClassifier(
      n_neighbors=k, metric='cosine', algorithm='brute',
      weights=lambda d: np.exp((1 - d) / temperature)).fit(bank, labels)
  return clf.predict(queries), clf.predict_proba(queries)


def _clear(bank, queries, votes, k):
  """The queries whose answer float rounding cannot change: a gap after
  the k-th neighbour, and between the two largest votes."""
  bank = bank / np.linalg.norm(bank, axis=1, keepdims=True)
  queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
  sims = -np.sort(-(np.float64(queries) @ np.float64(bank).T), axis=1)
  top2 = -np.sort(-votes, axis=1)[:, :2]
  return (sims[:, k - 1] - sims[:, k] > 1e-5) & (top2[:, 0] - top2[:, 1] >
                                                 1e-4)


@pytest.mark.parametrize('k, temperature', [(1, .07), (5, .07), (20, .07),
                                            (20, 1.)])
def test_matches_sklearn(k, temperature):
  rng = np.random.default_rng(k)
  centres = rng.normal(0, 1, (4, 16))
  bank_labels = np.arange(200) % 4
  bank = centres[bank_labels] + rng.normal(0, 1.5, (200, 16))
  test_labels = rng.integers(0, 4, 300)  # 3 chunks, the last one partial
  queries = centres[test_labels] + rng.normal(0, 1.5, (300, 16))
  bank, queries = bank.astype(np.float32), queries.astype(np.float32)
  votes = knn.scores(bank, bank_labels, queries, 4, k, temperature)
  predicted, proba = _sklearn(bank, bank_labels, queries, k, temperature)
  clear = _clear(bank, queries, votes, k)
  assert clear.mean() > .9
  np.testing.assert_array_equal(votes.argmax(1)[clear], predicted[clear])
  np.testing.assert_allclose(votes[clear], proba[clear], atol=1e-4)
  assert 0.4 < np.mean(predicted == test_labels) < 1  # not a trivial task


def test_top5_correct():
  votes = np.array([[.5, .3, .2, 0, 0, 0, 0],
                    [.1, .1, .1, .1, .1, .1, .4]])
  np.testing.assert_array_equal(knn.top5_correct(votes, np.array([2, 0])),
                                [True, True])
  # No vote: never among the top 5, however few classes have one.
  np.testing.assert_array_equal(knn.top5_correct(votes, np.array([3, 6])),
                                [False, True])


def _knn_config(tiny_config, **kw):
  tiny_config.evals.knn = configs_common.knn_evaluator()
  tiny_config.evals.knn.update({'k': 5, **kw})
  return tiny_config


def _evaluator(config, model):
  return knn.Evaluator('knn', config.evals.knn, config=config, model=model,
                       mesh=sharding.make_mesh(config.mesh))


def _distinct_features_params(model):
  """Random parameters whose pre-logits differ by more than float rounding:
  random ones map every fake image, a bright band on a flat background,
  to almost one direction (similarities 1 - 1e-7). A patch kernel blind to
  the background and no common bias after the norm spread them."""
  params = helpers.random_params(model, np.zeros((1, 32, 32, 3)),
                                 train=False)
  kernel = params['embedding']['kernel']
  params['embedding']['kernel'] = kernel - kernel.mean((0, 1, 2))
  norm = params['Transformer']['encoder_norm']
  norm['bias'] = np.zeros_like(norm['bias'])
  return params


def test_evaluator_counts_every_test_example_once(tiny_config):
  config = _knn_config(tiny_config)
  model = classification.make_model(config, 10)
  params = _distinct_features_params(model)
  metrics = _evaluator(config, model)(params)
  # The fake test split has 37 examples: a last batch of 5 of batch_eval 8.
  assert metrics['knn_count'] == 37 and 37 % config.batch_eval
  mesh = sharding.make_mesh(config.mesh)
  apply = common.pre_logits_fn(model)
  bank, bank_labels = common.features(
      apply, params, *common.split_data(config, '', 'train'), mesh)
  test, labels = common.features(
      apply, params, *common.split_data(config, '', 'test'), mesh)
  assert bank.shape == (96, 10) and test.shape == (37, 10)
  predicted, proba = _sklearn(bank, bank_labels, test, 5, .07)
  assert _clear(bank, test, proba, 5).all()
  assert metrics['knn_accuracy'] == np.mean(predicted == labels)
  assert 0 <= metrics['knn_top5_accuracy'] <= 1


@pytest.mark.parametrize('num_classes, every', [(None, None), (10, 0)])
def test_trainer_evaluate(tiny_config, tmp_path, capsys, num_classes, every):
  """A headless encoder: the classification evaluator gives way to the k-NN
  one (the only one of the two kinds in the config). A checkpoint with a
  head: both run, the k-NN one as training's `every=0` would."""
  config = _knn_config(tiny_config, every=every)
  del config.evals['fewshot']
  model = classification.make_model(config, num_classes)
  params = helpers.random_params(model, np.zeros((1, 32, 32, 3)),
                                 train=False)
  files.save(params, tmp_path / 'encoder.npz')
  config.trainer = 'evaluate'
  config.pretrained_path = str(tmp_path / 'encoder.npz')
  metrics = launch.evaluate(config, str(tmp_path / 'eval'))
  with open(tmp_path / 'eval' / 'results.json') as f:
    results = json.load(f)
  assert results['knn_accuracy'] == metrics['knn_accuracy']
  assert results['knn_count'] == 37
  assert ('accuracy' in results) == (num_classes is not None)
  out = capsys.readouterr()
  assert ('has no head. The few-shot and k-NN evaluators run' in out.err) == (
      num_classes is None)
  assert '5-NN accuracy on fashion_mnist_local: top-1' in out.out


@pytest.mark.parametrize('key, value, match', [
    ('k', 0, r'config.evals.knn.k=0: expected a positive integer'),
    ('k', 97, r'config.evals.knn.k=97: more than the 96 examples of the '
     r'memory bank fashion_mnist_local:train \(config.evals.knn.train\)'),
    ('temperature', 0., r'config.evals.knn.temperature=0.0: expected > 0'),
    ('temperature', -1., r'config.evals.knn.temperature=-1.0: expected > 0'),
])
def test_bad_settings(tiny_config, key, value, match):
  config = _knn_config(tiny_config, **{key: value})
  with pytest.raises(ValueError, match=match):
    _evaluator(config, classification.make_model(config, 10))
