"""SigLIP 2's recipe on the mesh: 1 and 8 devices train the same; a crash
then a resume equals the uninterrupted run (the runs: `siglip2_runs`,
tests/tasks/conftest.py, whose 1-device steps test_siglip2_terms.py reads)."""

import chex
from flax import traverse_util
import numpy as np
import pytest

from vit_jax import models
from vit_jax.models import lit

pytestmark = pytest.mark.xdist_group('siglip2')  # `siglip2_runs` once


def test_one_device_equals_eight_and_a_crash_resumes(siglip2_runs):
  """Self-distillation switches on halfway (steps 2 and 3)."""
  runs = siglip2_runs
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
