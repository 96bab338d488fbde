"""SigLIP 2's recipe on the mesh: 1 and 8 devices train the same; a crash
then a resume equals the uninterrupted run; the 1-device run's steps show
self-distillation switch on at `ssl_start`, its terms the equations."""

import chex
from flax import traverse_util
import jax
import numpy as np
import pytest

from tests.conftest import interrupt_at
from tests.tasks import siglip2_common
from tests.tasks import siglip2_reference
from vit_jax import launch
from vit_jax import models
from vit_jax.data import locca
from vit_jax.models import lit
from vit_jax.run import loop
from vit_jax.tasks import siglip2


@pytest.fixture(scope='module')
def dirs(tmp_path_factory, fmnist_dirs):
  return siglip2_common.prepare(tmp_path_factory, fmnist_dirs)


@pytest.fixture(scope='module')
def runs(dirs, tmp_path_factory):
  """The 'siglip2' arm, 4 steps, self-distillation from step 2 (no evals,
  checkpoints every 2): on 8 devices; crashed at step 3 and resumed; on 1
  device, each of its steps recorded (`siglip2_common.StepRecorder`)."""
  assert jax.device_count() == 8
  root = tmp_path_factory.mktemp('siglip2_runs')
  config = siglip2_common.small_config('siglip2', dirs, ssl_start=0.5)
  config.evals = config.evals.__class__()  # none
  config.checkpoint_every = 2
  out = {'config': config, 'eight': root / 'eight'}
  out['p8'] = launch.train_and_evaluate(config, str(root / 'eight'))

  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  with pytest.MonkeyPatch.context() as patch:
    interrupt_at(patch, 3, crash, locca)  # after the checkpoint of step 2
    with pytest.raises(RuntimeError, match='simulated crash'):
      launch.train_and_evaluate(config, str(root / 'resumed'))
  out['resumed'] = launch.train_and_evaluate(config, str(root / 'resumed'))

  recorder = siglip2_common.StepRecorder(loop.jit_train_step)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
    patch.setattr(loop, 'jit_train_step', recorder)
    out['p1'] = launch.train_and_evaluate(config, str(root / 'one'))
  out['task'], out['steps'] = recorder.task, recorder.steps
  return out


def test_one_device_equals_eight_and_a_crash_resumes(runs):
  """Self-distillation switches on halfway (steps 2 and 3)."""
  p8, config = runs['p8'], runs['config']
  chex.assert_trees_all_close(runs['resumed'], p8, rtol=1e-6, atol=1e-7)
  # A key bias adds one logit to all keys of a query, which the softmax
  # cancels: its gradient is round-off, which Adam turns into steps.
  drop = lambda tree: {k: v for k, v in traverse_util.flatten_dict(
      tree, sep='/').items() if not k.endswith('key/bias')}
  chex.assert_trees_all_close(drop(runs['p1']), drop(p8), rtol=1e-4,
                              atol=1e-4)
  assert not np.allclose(p8['center'], 0)  # the teacher's part ran
  # The export: SigLIP's towers, without the recipe's training aids.
  towers = models.from_pretrained(str(runs['eight']))
  assert isinstance(towers.model, lit.LitModel)
  assert 'mask_token' not in towers.params['img']
  np.testing.assert_array_equal(towers.params['img']['MAPHead_0']['probe'],
                                p8['student']['img_pool']['probe'])
  assert (runs['eight'] / f'{config.model_name}.decoder.npz').exists()


def test_self_distillation_switches_on_at_its_step(runs):
  """Before `ssl_start` (steps 0 and 1) the teacher is the student and the
  heads wait; from it (step 2), the teacher is the EMA and the centre
  moves; that step's terms are the equations
  (`siglip2_reference.check_terms`)."""
  config, task, steps = runs['config'], runs['task'], runs['steps']
  assert len(steps) == 4 and siglip2.ssl_start_step(config) == 2
  start = steps[0][0].params['student']
  heads0 = {k: start[k] for k in ('silc', 'tips')}
  for _, _, after, metrics in steps[:2]:
    assert float(metrics['ssl_active']) == 0 and metrics['silc_loss'] == 0
    student = after.params['student']
    chex.assert_trees_all_equal(
        after.params['teacher'],
        {k: student[k] for k in siglip2.TEACHER_KEYS})
    chex.assert_trees_all_equal({k: student[k] for k in heads0}, heads0)
    np.testing.assert_array_equal(student['img']['mask_token'],
                                  start['img']['mask_token'])
    np.testing.assert_array_equal(after.params['center'], 0)
  assert not np.allclose(student['img']['embedding']['kernel'],
                         start['img']['embedding']['kernel'])

  one, batch, two, metrics = steps[2]
  assert float(metrics['ssl_active']) == 1 and metrics['silc_loss'] > 0
  rng = jax.random.split(jax.random.key(config.seed))[1]  # the loop's
  siglip2_reference.check_terms(config, task, one, batch, metrics, rng)
  m = config.siglip2.momentum_teacher  # the cosine's start, at the switch
  assert float(metrics['teacher_momentum']) == pytest.approx(m)
  new = two.params['student']
  chex.assert_trees_all_close(
      two.params['teacher'],
      jax.tree.map(lambda t, s: m * t + (1 - m) * s, one.params['teacher'],
                   {k: new[k] for k in siglip2.TEACHER_KEYS}),
      rtol=1e-5, atol=1e-7)
  assert not np.allclose(new['silc']['Dense_0']['kernel'],
                         heads0['silc']['Dense_0']['kernel'])
  assert not np.allclose(two.params['center'], 0)
