"""The optimizer (`optim`): a short run's warmup, the optimizer state's
dtypes."""

import jax
import numpy as np
import optax

from vit_jax.run import checks
from vit_jax.run import optim


def test_warmup_longer_than_a_short_run_is_clamped(tiny_config):
  """A debug run shorter than the warmup warms up for a tenth of it."""
  tiny_config.total_steps, tiny_config.warmup_steps = 60, 200
  checks.validate(tiny_config, 8)
  schedule = optim.make_schedule(tiny_config)
  assert optim.warmup_steps(tiny_config) == 6
  np.testing.assert_allclose(float(schedule(6)), tiny_config.base_lr)
  assert float(schedule(3)) < float(schedule(6)) > float(schedule(30)) > 0
  tiny_config.warmup_steps = 5
  assert optim.warmup_steps(tiny_config) == 5


def test_momentum_dtype_sets_the_optimizer_state(tiny_config):
  params = {'w': np.zeros((4, 3), np.float32)}
  dtypes = {}
  for optimizer in ('sgd', 'adamw'):
    for dtype in ('float32', 'bfloat16'):
      tiny_config.optimizer, tiny_config.momentum_dtype = optimizer, dtype
      state = optim.make_optimizer(tiny_config).init(params)
      dtypes[optimizer, dtype] = sorted(
          {str(x.dtype) for x in jax.tree.leaves(state) if x.ndim})
  # AdamW's second moment stays float32.
  assert dtypes['sgd', 'float32'] == ['float32']
  assert dtypes['sgd', 'bfloat16'] == ['bfloat16']
  assert dtypes['adamw', 'float32'] == ['float32']
  assert dtypes['adamw', 'bfloat16'] == ['bfloat16', 'float32']
  state = optim.make_optimizer(tiny_config).init(params)
  assert optax.tree_utils.tree_get(state, 'mu')['w'].dtype == jax.numpy.bfloat16
  assert optax.tree_utils.tree_get(state, 'nu')['w'].dtype == np.float32
  # Accumulating micro-batches adds a float32 sum of the gradients.
  tiny_config.accum_steps = 2
  state = optim.make_optimizer(tiny_config).init(params)
  assert state.acc_grads['w'].dtype == np.float32
