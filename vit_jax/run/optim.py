"""Learning-rate schedule and optimizer of every task (imports no data stack).

Clip by global norm, then SGD with momentum or AdamW, with micro-batch
accumulation. Parameters a task labels 'frozen' get no update and keep no
optimizer state (`optax.multi_transform` with `set_to_zero`). With
`config.layer_decay`, each block's updates are scaled as BEiT's fine-tuning
recipe scales its learning rate (`layer_decay_factors`).
"""

import re
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
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


# The parts of a ViT before its blocks (patch embedding, position table,
# class, distillation, register and mask tokens, a hybrid's ResNet), by the
# path inside the model; their updates are scaled as a block -1's.
_EMBEDDINGS = re.compile(r'(embedding|cls|dist|reg|mask_token|conv_root|'
                         r'gn_root|block\d+|Transformer/posembed_input)(/|$)')
_BLOCK = re.compile(r'(.*?)Transformer/encoderblock(_(\d+))?/')


def layer_decay_factors(params, decay: float):
  """The learning-rate factor of each leaf of a ViT's `params` under
  layer-wise decay (BEiT's fine-tuning): block i of L gets decay**(L - i),
  what comes before the blocks decay**(L + 1), the rest (final norm, head,
  a shared relative bias) 1. The ViT may sit under a prefix (a task's
  'encoder'); a scanned one gets one factor per stacked block."""
  paths = {jax.tree_util.keystr(p, simple=True, separator='/'): x
           for p, x in jax.tree_util.tree_leaves_with_path(params)}
  blocks = [m for m in map(_BLOCK.match, paths) if m]
  prefixes = {m[1] for m in blocks}
  if len(prefixes) != 1:
    raise ValueError('config.layer_decay needs a model with one ViT encoder '
                     f"('Transformer/encoderblock_i'); found {len(prefixes)}.")
  prefix, = prefixes
  scanned = [paths[m.string] for m in blocks if m[3] is None]
  depth = (scanned[0].shape[0] if scanned else
           1 + max(int(m[3]) for m in blocks))

  def factor(path, leaf):
    path = jax.tree_util.keystr(path, simple=True, separator='/')
    inner = path[len(prefix):] if path.startswith(prefix) else None
    block = _BLOCK.match(path)
    if block and block[3] is not None:
      return np.float32(decay**(depth - int(block[3])))
    if block:  # stacked: block i's slice i
      return (decay**(depth - np.arange(depth, dtype=np.float32))).reshape(
          (depth,) + (1,) * (leaf.ndim - 1))
    if inner is not None and _EMBEDDINGS.match(inner):
      return np.float32(decay**(depth + 1))
    return np.float32(1.)

  return jax.tree_util.tree_map_with_path(factor, params)


def scale_by_layer_decay(decay: float) -> optax.GradientTransformation:
  """Scales each update by its `layer_decay_factors` (no state)."""
  def scale(updates, params=None):
    del params
    factors = layer_decay_factors(updates, decay)
    return jax.tree.map(lambda u, f: u * jnp.asarray(f, u.dtype), updates,
                        factors)
  return optax.stateless(scale)


def make_optimizer(config, labels: Optional[Callable] = None
                   ) -> optax.GradientTransformation:
  """Clip by global norm -> SGD momentum or AdamW; accumulate micro-batches.

  The momentum (AdamW: the first moment) is kept in `config.momentum_dtype`;
  bfloat16, as the original release, halves its memory. `labels(params)`
  names each parameter `FROZEN` or `TRAINED`; None trains them all.
  `config.layer_decay` scales each ViT block's updates (`layer_decay_factors`).
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
  if config.get('layer_decay') is not None:  # scales the decayed weights too
    opt = optax.chain(opt, scale_by_layer_decay(config.layer_decay))
  if labels is not None:
    opt = optax.multi_transform({TRAINED: opt, FROZEN: optax.set_to_zero()},
                                labels)
  if config.accum_steps == 1:
    return opt  # MultiSteps would keep a float32 copy of the gradients
  return optax.MultiSteps(opt, every_k_schedule=config.accum_steps)
