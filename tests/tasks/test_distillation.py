"""Distillation from a frozen teacher (DeiT): losses against numpy, and runs
through the shared loop."""

import chex
import jax
import numpy as np
import pytest

from tests.conftest import make_tiny_config
from vit_jax import launch
from vit_jax.tasks import distillation

pytestmark = pytest.mark.xdist_group('distillation')  # one `teacher` run


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_hard_and_soft_losses_against_numpy():
  rng = np.random.default_rng(0)
  student, teacher = rng.normal(size=(2, 4, 6)) * 2
  hard = distillation.distillation_loss(student, teacher, 'hard', 1.)
  want = -_log_softmax(student)[np.arange(4), teacher.argmax(-1)]
  np.testing.assert_allclose(hard, want, rtol=1e-5)
  t = 3.
  p = np.exp(_log_softmax(teacher / t))
  want = (p * (np.log(p) - _log_softmax(student / t))).sum(-1) * t**2
  soft = distillation.distillation_loss(student, teacher, 'soft', t)
  np.testing.assert_allclose(soft, want, rtol=1e-5)


class _Stub(distillation.Task):

  def __init__(self, config):  # pylint: disable=super-init-not-called
    self.config = config


def test_two_heads_split_the_loss_in_halves(tiny_config):
  rng = np.random.default_rng(1)
  logits, dist, teacher = rng.normal(size=(3, 4, 5))
  labels = np.eye(5)[[0, 3, 1, 1]]
  tiny_config.distill.alpha = 0.9  # not used: two heads weigh 1/2 each
  got = _Stub(tiny_config).loss((logits, dist), labels, teacher)
  want = 0.5 * -(labels * _log_softmax(logits)).sum(-1) + 0.5 * -_log_softmax(
      dist)[np.arange(4), teacher.argmax(-1)]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  one_head = _Stub(tiny_config).loss(logits, labels, teacher)
  want = 0.1 * -(labels * _log_softmax(logits)).sum(-1) + 0.9 * -_log_softmax(
      logits)[np.arange(4), teacher.argmax(-1)]
  np.testing.assert_allclose(one_head, want, rtol=1e-5)


@pytest.fixture(scope='module')
def teacher(tmp_path_factory, fmnist_dirs):
  """A trained tiny classifier's .npz, and the plain run of its config."""
  config = make_tiny_config(fmnist_dirs)
  workdir = str(tmp_path_factory.mktemp('teacher'))
  params = launch.train_and_evaluate(config, workdir)
  return f'{workdir}/testing.npz', jax.device_get(params)


def _distill_config(fmnist_dirs, teacher_path, alpha):
  config = make_tiny_config(fmnist_dirs)
  config.trainer = 'distill'
  config.distill.teacher_path = teacher_path
  config.distill.teacher_model = 'testing'
  config.distill.alpha = alpha
  return config


def test_without_the_teachers_weight_it_is_plain_training(
    teacher, fmnist_dirs, tmp_path):
  path, plain = teacher
  params = launch.train_and_evaluate(
      _distill_config(fmnist_dirs, path, 0.), str(tmp_path))
  chex.assert_trees_all_close(jax.device_get(params), plain, rtol=1e-6,
                              atol=1e-7)


def test_the_teacher_changes_what_is_learned(teacher, fmnist_dirs, tmp_path,
                                             capsys):
  path, plain = teacher
  params = jax.device_get(launch.train_and_evaluate(
      _distill_config(fmnist_dirs, path, 1.), str(tmp_path)))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  assert not np.allclose(params['head']['kernel'], plain['head']['kernel'])
  assert 'Done: 6 steps, test accuracy' in capsys.readouterr().out
  assert (tmp_path / 'results.json').exists()


def test_bad_distill_settings(teacher, fmnist_dirs, tmp_path):
  path, _ = teacher
  config = _distill_config(fmnist_dirs, path, 0.5)
  config.distill.kind = 'medium'
  with pytest.raises(ValueError, match="distill.kind='medium'"):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = _distill_config(fmnist_dirs, '', 0.5)
  with pytest.raises(ValueError, match='needs a teacher'):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
  config = _distill_config(fmnist_dirs, path, 0.5)
  config.distill.teacher_model = 'ViT-Ti16'
  with pytest.raises(ValueError, match='did you mean ViT-Ti_16'):
    launch.train_and_evaluate(config, str(tmp_path / 'c'))


def test_deit_fmnist_arms_run(fmnist_dirs, tmp_path):
  """configs/deit_fmnist.py: the teacher, then each arm, as short jobs on
  tiny offline data; each writes results.json."""
  from vit_jax.configs import deit_fmnist  # pylint: disable=g-import-not-at-top
  for arm in ('teacher', 'plain', 'augreg', 'deit'):
    config = deit_fmnist.get_config(arm).unlock()
    config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
    config.total_steps, config.batch, config.batch_eval = 3, 8, 8
    config.shuffle_buffer, config.evals.test.every = 100, 0
    # One block, one ResNet stage: each arm's recipe runs all the same.
    if arm == 'teacher':
      config.model.num_layers = (1,)
    else:
      config.model.transformer.num_layers = 1
    if arm == 'deit':
      config.distill.teacher_path = str(tmp_path / 'teacher' /
                                        'BiT-fmnist.npz')
    launch.train_and_evaluate(config, str(tmp_path / arm))
    assert (tmp_path / arm / 'results.json').exists(), arm
