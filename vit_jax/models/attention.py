"""Dot-product attention: the CPU's (lean backward passes) and the
accelerators' (query scaled first, softmax in the compute dtype), or
cuDNN's flash kernel on the GPUs, dtypes and head dims it takes, or Pallas'
splash attention on TPUs for long sequences
(`target.attention_implementation`)."""

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
from jax.experimental.pallas.ops.tpu import splash_attention as splash
import jax.numpy as jnp
import numpy as np

from vit_jax.platform import target
from vit_jax.models import ops
from vit_jax.models.posemb import apply_rope


def attention(query, key, value, bias=None, mask=None, broadcast_dropout=True,
              dropout_rng=None, dropout_rate=0., deterministic=False,
              dtype=None, precision=None, module=None, bias_fn=None,
              rope=None, rope_half=False, segment_ids=None):
  """Flax's `attention_fn` on `jax.nn.dot_product_attention`.

  XLA fuses it, or cuDNN's flash kernel runs it where
  `target.attention_implementation` says so (NVIDIA GPUs of compute
  capability 8.0 on, half precision, no mask or bias, head dims cuDNN
  takes). Flax's own function serves what the fused one lacks: dropout on
  the attention weights, and recording them (flax passes `module` when the
  weights are sown). `bias_fn(scaled query)`, if given, adds a bias to the
  logits; `rope`, (batch, tokens, depth / 2) angles, rotates queries and
  keys (`apply_rope`; pairs half a head apart with `rope_half`) first. `mask`:
  True where a query may attend to a key; `segment_ids`, (batch, tokens)
  ints of packed sequences: a token attends to those of its segment only
  (splash attention takes them as they are, the others as `segment_mask`).
  """
  if rope is not None:
    query, key = (apply_rope(x, rope, rope_half) for x in (query, key))
  if bias_fn is not None:
    bias = bias_fn(query / jnp.sqrt(query.shape[-1]).astype(query.dtype))
  plain = module is not None or (dropout_rate > 0. and not deterministic)
  # A half dtype only if all three share it, as cuDNN needs.
  common = jnp.result_type(query, key, value)
  implementation = None if plain else target.attention_implementation(
      common, query.shape[-1], bias is not None or mask is not None,
      tokens=query.shape[1], segmented=segment_ids is not None)
  if implementation == 'splash' and query.shape[1] == key.shape[1]:
    return splash_attention(query, key, value, segment_ids)
  if implementation == 'splash':  # cross-attention: its queries are few
    implementation = 'xla'
  if segment_ids is not None:
    segments = segment_mask(segment_ids)
    mask = segments if mask is None else mask & segments
  if plain:
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, dropout_rng=dropout_rng,
        dropout_rate=dropout_rate, broadcast_dropout=broadcast_dropout,
        deterministic=deterministic, dtype=dtype, precision=precision,
        module=module, force_fp32_for_softmax=True)
  if implementation == 'heads_first':
    return _heads_first_attention(query, key, value, bias, mask)
  if implementation == 'cudnn':
    return jax.nn.dot_product_attention(query, key, value,
                                        implementation='cudnn')
  return _accelerator_attention(query, key, value, bias, mask)


def segment_mask(segment_ids):
  """(batch, 1, tokens, tokens) bool: True where two tokens share a
  segment, from their (batch, tokens) ids."""
  return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


# The kernel's square tiles along the tokens, largest first: multiples of
# the TPU's 128 lanes. Larger tiles re-read keys and values fewer times.
SPLASH_BLOCKS = (512, 384, 256, 128)
# The segment of the padding tokens: they attend to one another only.
_PADDING_SEGMENT = -1


def splash_attention(query, key, value, segment_ids=None):
  """Pallas' splash attention (flash attention with block-sparse masks) on
  (batch, tokens, heads, depth) inputs: the logits of SPLASH_BLOCK-token
  tiles in the TPU's VMEM, never all in HBM, and the backward pass
  recomputing them from the softmax's log-sum-exp, so memory grows
  linearly in the tokens.

  Tokens are padded to a multiple of the tile, in a segment of their own,
  and sliced off. On the target's mesh the kernel runs on each device's
  part of the batch (`jax.shard_map` over `data`): XLA cannot partition
  a Pallas call, and would gather the batch around it. Elsewhere than on
  TPUs it runs in Pallas' interpreter (tests).
  """
  batch, tokens, heads, depth = query.shape
  block = splash_block(tokens)
  padded = -(-tokens // block) * block
  if padded != tokens or segment_ids is not None:
    if segment_ids is None:
      segment_ids = jnp.zeros((batch, tokens), jnp.int32)
    segment_ids = jnp.pad(segment_ids.astype(jnp.int32),
                          ((0, 0), (0, padded - tokens)),
                          constant_values=_PADDING_SEGMENT)
  query = query / np.sqrt(depth).astype(query.dtype)  # the kernel's scale: 1
  query, key, value = (
      jnp.swapaxes(jnp.pad(x, ((0, 0), (0, padded - tokens), (0, 0),
                               (0, 0))), 1, 2)
      for x in (query, key, value))
  kernel = functools.partial(_splash_kernel, heads=heads, tokens=padded,
                             block=block, interpret=target.platform() != 'tpu')
  out = _over_batch_shards(kernel, query, key, value, segment_ids)
  return jnp.swapaxes(out, 1, 2)[:, :tokens]


def splash_block(tokens: int) -> int:
  """The largest of SPLASH_BLOCKS that pads `tokens` to at most 3% more
  than the smallest tile does (4097 tokens: 384, padded to 4224)."""
  least = -(-tokens // SPLASH_BLOCKS[-1]) * SPLASH_BLOCKS[-1]
  return next(b for b in SPLASH_BLOCKS if -(-tokens // b) * b <= 1.03 * least)


def _splash_kernel(query, key, value, segment_ids, *, heads, tokens, block,
                   interpret):
  """Splash attention of (batch, heads, tokens, depth) inputs in `block`
  tiles, unmasked but for `segment_ids` (batch, tokens), if given."""
  mask = splash.MultiHeadMask([splash.FullMask((tokens, tokens))] * heads)
  blocks = splash.BlockSizes(
      block_q=block, block_kv=block, block_kv_compute=block,
      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
      block_q_dq=block, block_kv_dq=block)
  kernel = splash.make_splash_mha_single_device(
      mask, block_sizes=blocks, interpret=interpret)
  if segment_ids is None:
    return jax.vmap(kernel)(query, key, value)
  ids = splash.SegmentIds(q=segment_ids, kv=segment_ids)
  return jax.vmap(kernel)(query, key, value, ids)


def _over_batch_shards(kernel, *args):
  """`kernel(*args)` (batch-leading arrays, or None) on each device's part
  of the batch, if the target has a mesh whose `data` axis divides it."""
  mesh = target.mesh()
  batch = args[0].shape[0]
  size = dict(mesh.shape).get('data', 1) if mesh is not None else 1
  if size == 1 or batch % size:
    return kernel(*args)
  spec = lambda x: None if x is None else jax.sharding.PartitionSpec('data')
  return jax.shard_map(kernel, mesh=mesh, in_specs=tuple(map(spec, args)),
                       out_specs=jax.sharding.PartitionSpec('data'),
                       check_vma=False)(*args)


def _accelerator_attention(query, key, value, bias=None, mask=None):
  """Attention as flax's default does it: the query scaled before the
  product, the logits and softmax in the inputs' dtype (accumulated in
  float32 by the TPU's matrix unit). `jax.nn.dot_product_attention`'s
  float32 logits and softmax cost a bf16 ViT-B/16 step on a TPU 1.4x the
  temporaries and 1.1x the HBM bytes of big_vision's (docs/performance.md).
  float16 (a T4's) keeps its logits in float32: its range ends at 65504.
  """
  query = query / np.sqrt(query.shape[-1]).astype(query.dtype)
  wide = jnp.float32 if query.dtype == jnp.float16 else None
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key,
                      preferred_element_type=wide)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  if mask is not None:  # finite: a query with no key gets uniform weights
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits).astype(value.dtype)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def _heads_first_attention(query, key, value, bias=None, mask=None):
  """The same attention with heads moved before tokens first, for the CPU.

  XLA's CPU backend fuses the (batch, tokens, heads, depth) transposes into
  the batched matmuls of `jax.nn.dot_product_attention` and runs them at half
  speed (benchmarks/speed.py profile); transposed first, the attention of a
  ViT-Ti/16 training step runs 1.4x faster. Logits and softmax are float32.
  """
  query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
  if bias is None and mask is None:
    return jnp.swapaxes(ops.attention(query, key, value), 1, 2)
  logits = jnp.einsum('bhqd,bhkd->bhqk', query, key,
                      preferred_element_type=jnp.float32)
  logits = logits / np.sqrt(query.shape[-1]).astype(np.float32)
  if bias is not None:
    logits = logits + bias
  if mask is not None:  # finite: a query with no key gets uniform weights
    logits = jnp.where(mask, logits, np.finfo(np.float32).min)
  weights = ops.softmax(logits).astype(value.dtype)
  return jnp.swapaxes(jnp.einsum('bhqk,bhkd->bhqd', weights, value), 1, 2)


# Which projections have a bias, by `qkv_bias`.
QKV_BIASES = {'qkv': ('query', 'key', 'value'), 'qv': ('query', 'value'),
              'none': ()}


# Where queries and keys are normalized (`SelfAttention.qk_norm`): over each
# head's features (timm's `qk_norm`) or over all heads' at once
# (InternViT-6B's `qk_normalization`).
QK_NORMS = ('head', 'all')


class SelfAttention(nn.Module):
  """Multi-head self-attention with flax's parameters (`query`, `key`,
  `value`: (D, heads, D / heads); `out`), whose projections may lack biases:
  `qkv_bias` 'qv' (EVA-02, DINOv3's `_qkvb`: a key bias adds the same logit
  to every key of a query, which the softmax cancels) or 'none' (DINOv3);
  `out_bias` False: the output projection has none either (AIMv2). With
  `qk_norm` (one of QK_NORMS), the projected queries and keys go through
  `norm_fn(name=...)`, `q_norm` and `k_norm`. The blocks use flax's own
  module for 'qkv' with `out_bias` and without a query/key norm."""
  num_heads: int
  qkv_bias: str = 'qkv'
  out_bias: bool = True
  dropout_rate: float = 0.
  deterministic: bool = True
  attention_fn: Any = attention
  qk_norm: Optional[str] = None
  norm_fn: Optional[Callable[..., nn.Module]] = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, mask=None, sow_weights=False):
    if self.qkv_bias not in QKV_BIASES:
      raise ValueError(f'Unknown qkv_bias {self.qkv_bias!r}; expected one of '
                       f'{tuple(QKV_BIASES)}.')
    heads, width = self.num_heads, x.shape[-1]
    project = functools.partial(
        nn.DenseGeneral, (heads, width // heads), dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform())
    query, key, value = (
        project(name=name, use_bias=name in QKV_BIASES[self.qkv_bias])(x)
        for name in ('query', 'key', 'value'))
    if self.qk_norm:
      query, key = self._normed(query, 'q_norm'), self._normed(key, 'k_norm')
    rng = None
    if self.dropout_rate > 0 and not self.deterministic:
      rng = self.make_rng('dropout')
    x = self.attention_fn(
        query, key, value, mask=mask, dropout_rng=rng,
        dropout_rate=self.dropout_rate, broadcast_dropout=False,
        deterministic=self.deterministic, dtype=self.dtype,
        module=self if sow_weights else None)
    return nn.DenseGeneral(width, axis=(-2, -1), dtype=self.dtype,
                           kernel_init=nn.initializers.xavier_uniform(),
                           use_bias=self.out_bias, name='out')(x)

  def _normed(self, x, name):
    """(batch, tokens, heads, depth) `x` normalized per head, or over the
    heads' features together."""
    if self.qk_norm not in QK_NORMS:
      raise ValueError(f'Unknown qk_norm {self.qk_norm!r}; expected None or '
                       f'one of {QK_NORMS}.')
    if self.qk_norm == 'head':
      return self.norm_fn(name=name)(x)
    flat = x.reshape(*x.shape[:2], -1)
    return self.norm_fn(name=name)(flat).reshape(x.shape)
