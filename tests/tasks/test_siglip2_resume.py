"""SigLIP 2's recipe on the mesh: 1 and 8 devices train the same; a crash
then a resume equals the uninterrupted run."""

import chex
from flax import traverse_util
import jax
import numpy as np
import pytest

from tests.conftest import interrupt_at
from tests.tasks import siglip2_common
from vit_jax import launch
from vit_jax import models
from vit_jax.data import locca
from vit_jax.models import lit


@pytest.fixture(scope='module')
def dirs(tmp_path_factory, fmnist_dirs):
  return siglip2_common.prepare(tmp_path_factory, fmnist_dirs)


def test_one_device_equals_eight_and_a_crash_resumes(dirs, tmp_path,
                                                     monkeypatch):
  """Self-distillation switches on halfway (steps 2 and 3)."""
  assert jax.device_count() == 8
  config = siglip2_common.small_config('siglip2', dirs, ssl_start=0.5)
  config.evals = config.evals.__class__()  # none
  config.checkpoint_every = 2
  p8 = launch.train_and_evaluate(config, str(tmp_path / 'eight'))

  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  with monkeypatch.context() as patch:
    interrupt_at(patch, 3, crash, locca)  # after the checkpoint of step 2
    with pytest.raises(RuntimeError, match='simulated crash'):
      launch.train_and_evaluate(config, str(tmp_path / 'resumed'))
  resumed = launch.train_and_evaluate(config, str(tmp_path / 'resumed'))
  chex.assert_trees_all_close(resumed, p8, rtol=1e-6, atol=1e-7)

  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  p1 = launch.train_and_evaluate(config, str(tmp_path / 'one'))
  # A key bias adds one logit to all keys of a query, which the softmax
  # cancels: its gradient is round-off, which Adam turns into steps.
  drop = lambda tree: {k: v for k, v in traverse_util.flatten_dict(
      tree, sep='/').items() if not k.endswith('key/bias')}
  chex.assert_trees_all_close(drop(p1), drop(p8), rtol=1e-4, atol=1e-4)
  assert not np.allclose(p8['center'], 0)  # the teacher's part ran
  # The export: SigLIP's towers, without the recipe's training aids.
  towers = models.from_pretrained(str(tmp_path / 'eight'))
  assert isinstance(towers.model, lit.LitModel)
  assert 'mask_token' not in towers.params['img']
  np.testing.assert_array_equal(towers.params['img']['MAPHead_0']['probe'],
                                p8['student']['img_pool']['probe'])
  assert (tmp_path / 'eight' / f'{config.model_name}.decoder.npz').exists()
