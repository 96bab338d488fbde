"""The original release's `vit_jax.utils`: its learning-rate schedule and
gradient accumulation, for code written against it (its notebooks call
`train.make_update_fn` with them)."""

import jax
import jax.numpy as jnp


def create_learning_rate_schedule(total_steps, base, decay_type, warmup_steps,
                                  linear_end=1e-5):
  """step -> learning rate, the original's formula: `base` decayed over
  progress = (step - warmup_steps) / (total_steps - warmup_steps), clipped
  to [0, 1] ('cosine' to 0, 'linear' to `linear_end`), times the warmup
  min(1, step / warmup_steps). (`optim.make_schedule` is the loop's.)"""
  if decay_type not in ('cosine', 'linear'):
    raise ValueError(f"Unknown decay_type {decay_type!r}; expected 'cosine' "
                     "or 'linear'.")

  def step_fn(step):
    progress = jnp.clip((step - warmup_steps) / float(total_steps -
                                                      warmup_steps), 0., 1.)
    if decay_type == 'linear':
      lr = linear_end + (base - linear_end) * (1. - progress)
    else:
      lr = base * 0.5 * (1. + jnp.cos(jnp.pi * progress))
    if warmup_steps:
      lr = lr * jnp.minimum(1., step / warmup_steps)
    return jnp.asarray(lr, jnp.float32)

  return step_fn


def accumulate_gradient(loss_and_grad_fn, params, images, labels,
                        accum_steps):
  """Mean (loss, gradient) of `loss_and_grad_fn(params, images, labels)`
  over `accum_steps` consecutive slices of the batch, one after the other
  (less memory); 0 or 1: the whole batch at once."""
  if not accum_steps or accum_steps == 1:
    return loss_and_grad_fn(params, images, labels)
  if images.shape[0] % accum_steps:
    raise ValueError(f'accum_steps={accum_steps} does not divide the batch '
                     f'of {images.shape[0]}.')
  micro = lambda x: x.reshape(accum_steps, -1, *x.shape[1:])

  def add(total, batch):
    return jax.tree.map(jnp.add, total, loss_and_grad_fn(params, *batch)), None

  zeros = jax.tree.map(
      lambda s: jnp.zeros(s.shape, s.dtype),
      jax.eval_shape(loss_and_grad_fn, params, micro(images)[0],
                     micro(labels)[0]))
  total, _ = jax.lax.scan(add, zeros, (micro(images), micro(labels)))
  return jax.tree.map(lambda x: x / accum_steps, total)
