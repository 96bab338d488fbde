"""Learning-rate schedule and optimizer of every task (imports no data stack).

Clip by global norm, then SGD with momentum or AdamW, with micro-batch
accumulation. Parameters a task labels 'frozen' get no update and keep no
optimizer state (`optax.multi_transform` with `set_to_zero`).
"""

from typing import Callable, Optional

import jax.numpy as jnp
import optax

FROZEN, TRAINED = 'frozen', 'trained'


def warmup_steps(config) -> int:
  """`warmup_steps`, or a tenth of a run too short for it (a debug run)."""
  if config.warmup_steps < config.total_steps:
    return config.warmup_steps
  return config.total_steps // 10


def make_schedule(config) -> optax.Schedule:
  """Linear warmup from 0 to base_lr, then cosine or linear decay to 0."""
  warmup = warmup_steps(config)
  if config.decay_type == 'cosine':
    return optax.warmup_cosine_decay_schedule(
        0.0, config.base_lr, warmup, config.total_steps)
  return optax.join_schedules([
      optax.linear_schedule(0.0, config.base_lr, warmup),
      optax.linear_schedule(config.base_lr, 0.0, config.total_steps - warmup),
  ], [warmup])


def make_optimizer(config, labels: Optional[Callable] = None
                   ) -> optax.GradientTransformation:
  """Clip by global norm -> SGD momentum or AdamW; accumulate micro-batches.

  The momentum (AdamW: the first moment) is kept in `config.momentum_dtype`;
  bfloat16, as the original release, halves its memory. `labels(params)`
  names each parameter `FROZEN` or `TRAINED`; None trains them all.
  """
  schedule = make_schedule(config)
  momentum_dtype = jnp.dtype(config.momentum_dtype)
  if config.optimizer == 'sgd':
    opt = optax.sgd(schedule, momentum=0.9, accumulator_dtype=momentum_dtype)
  else:
    opt = optax.adamw(schedule, b1=0.9, b2=0.999, mu_dtype=momentum_dtype,
                      weight_decay=config.weight_decay)
  if config.grad_norm_clip:
    opt = optax.chain(optax.clip_by_global_norm(config.grad_norm_clip), opt)
  if labels is not None:
    opt = optax.multi_transform({TRAINED: opt, FROZEN: optax.set_to_zero()},
                                labels)
  if config.accum_steps == 1:
    return opt  # MultiSteps would keep a float32 copy of the gradients
  return optax.MultiSteps(opt, every_k_schedule=config.accum_steps)
