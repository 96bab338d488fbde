"""`tasks.registry` and `evaluators.registry`: plugins that declare
themselves; a name registered twice is refused."""

import pytest

from vit_jax import launch
from vit_jax.evaluators import common
from vit_jax.evaluators import registry as evaluators
from vit_jax.tasks import base
from vit_jax.tasks import classification
from vit_jax.tasks import registry


def test_trainers_come_from_the_tasks():
  assert registry.TASKS['train'] is classification.Task
  assert registry.TASKS['classification'] is classification.Task
  assert set(launch.trainers()) == set(registry.TASKS) | {
      'evaluate', 'fewshot', 'zeroshot'}


def test_task_registered_twice_is_refused():
  class Again(base.Task):
    trainers = ('mae',)

  with pytest.raises(ValueError, match="trainer='mae' is registered twice"):
    registry.register(Again)
  assert registry.TASKS['mae'] is not Again


def test_evaluators():
  assert evaluators.feature_types() == ('fewshot', 'knn')
  assert evaluators.config_types() == ('classification', 'fewshot', 'knn',
                                       'zeroshot', 'segmentation', 'captioning',
                                       'scoring', 'codebook',
                                       'video_classification', 'locca',
                                       'depth')
  assert {'navit_packed', 'navit_resized'} <= set(evaluators.EVALUATORS)

  with pytest.raises(ValueError, match="'knn' is registered twice"):
    evaluators.register('knn')(common.Evaluator)
