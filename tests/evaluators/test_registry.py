"""Evaluators from config.evals: the errors that must come before any
compilation (the metrics themselves are tested with the trainers)."""

import numpy as np
import pytest

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import launch
from vit_jax.tasks import classification


@pytest.mark.parametrize('key,value,match', [
    ('type', 'regression', "config.evals.test.type='regression'; expected "
     "one of \\('classification', 'fewshot', 'knn', 'zeroshot', "
     "'segmentation', 'captioning', 'scoring', 'codebook', "
     "'video_classification', 'locca', 'depth'\\)"),
    ('every', -1, r'config.evals.test.every=-1: expected a number of steps'),
])
def test_bad_evaluator_settings(tiny_config, tmp_path, key, value, match):
  tiny_config.evals.test[key] = value
  with pytest.raises(ValueError, match=match):
    launch.train_and_evaluate(tiny_config, str(tmp_path))


def test_unknown_trainer(tiny_config, tmp_path):
  tiny_config.trainer = 'ibot'
  with pytest.raises(ValueError, match="config.trainer='ibot'; expected"):
    launch.train_and_evaluate(tiny_config, str(tmp_path))


@pytest.fixture
def five_class_npz(tiny_config, tmp_path):
  """A 'testing' ViT with a 5-class head, while the data has 10 classes."""
  model = classification.make_model(tiny_config, 5)
  params = helpers.random_params(model, np.zeros((1, 32, 32, 3)),
                                 train=False)
  path = str(tmp_path / 'five.npz')
  files.save(params, path)
  return path


def test_head_that_does_not_fit_the_test_data(tiny_config, tmp_path,
                                              five_class_npz, capsys):
  """trainer='evaluate' says so, then evaluates the features few-shot."""
  tiny_config.trainer, tiny_config.pretrained_path = 'evaluate', five_class_npz
  tiny_config.evals.fewshot.update(dict(shots=(1, 2), seeds=1))
  metrics = launch.evaluate(tiny_config, str(tmp_path / 'eval'))
  assert ('config.evals.test: the test data has 10 classes; the model has a '
          'head of 5. The few-shot and k-NN evaluators run instead.'
          in capsys.readouterr().err)
  assert 'fewshot_2shot' in metrics and 'accuracy' not in metrics


def test_alias_without_its_evaluator(tiny_config, tmp_path, five_class_npz):
  tiny_config.trainer, tiny_config.pretrained_path = 'zeroshot', five_class_npz
  with pytest.raises(ValueError, match='lists no evaluator of type'):
    launch.evaluate(tiny_config, str(tmp_path / 'eval'))
