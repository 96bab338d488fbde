"""The building blocks that the ViT families share: MLP, DropPath,
LayerScale, the blocks' norms, attention pooling (MAP) and token
selection."""

import functools
from typing import Any, Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.platform import target
from vit_jax.models import ops
from vit_jax.models.attention import attention


class IdentityLayer(nn.Module):
  """Identity layer, so that an absent `pre_logits` keeps its name."""

  @nn.compact
  def __call__(self, x):
    return x


def pre_logits_and_head(x, representation_size, num_classes, dtype):
  """A video model's `pre_logits` (tanh Dense, or `IdentityLayer` so the
  name stays) and zero-initialized float32 `head` of pooled features, in
  the calling module's scope; the features alone without classes."""
  if representation_size is not None:
    x = nn.tanh(nn.Dense(representation_size, name='pre_logits',
                         dtype=dtype)(x))
  else:
    x = IdentityLayer(name='pre_logits')(x)
  if not num_classes:
    return x
  return nn.Dense(num_classes, dtype=jnp.float32, name='head',
                  kernel_init=nn.initializers.zeros)(x)


class DropPath(nn.Module):
  """Stochastic depth: drops a residual branch for whole samples.

  In training each sample's branch is kept with probability 1 - rate and
  then scaled by 1 / (1 - rate), so its expectation is unchanged; at
  evaluation it is the identity. Uses the 'dropout' rng.
  """
  rate: float = 0.

  @nn.compact
  def __call__(self, x, *, deterministic):
    if not 0. <= self.rate < 1.:
      raise ValueError(f'Drop path rate must be in [0, 1), got {self.rate}.')
    # One draw per sample: the mask is broadcast over all other axes.
    return nn.Dropout(self.rate, broadcast_dims=range(1, x.ndim))(
        x, deterministic=deterministic)


def drop_path_rates(rate, num_layers):
  """Per-block drop path rates: linear from 0 (first) to `rate` (last)."""
  return [rate * i / max(num_layers - 1, 1) for i in range(num_layers)]


class MlpBlock(nn.Module):
  """Transformer MLP: Dense, GELU, dropout, Dense, dropout.

  Attributes:
    out_dim: output width (default: the input width).
    gelu_approximate: flax's tanh GELU (Google's checkpoints); False: the
      exact erf GELU (timm's and PyTorch's).
    swiglu: SwiGLU instead of GELU (timm's SwiGLUPacked, DINOv2-g):
      `Dense_0` makes 2 * mlp_dim features [x1, x2], and silu(x1) * x2
      goes on.
    quick_gelu: x * sigmoid(1.702 x) instead of GELU (OpenAI's CLIP).
    inner_norm: a LayerNorm `norm` on the hidden features (EVA-02's
      `scale_mlp`, NormFormer's), with `layer_norm_eps`.
    use_bias: the Dense layers have biases (AIMv2's have none).
  """
  mlp_dim: int
  out_dim: Optional[int] = None
  dropout_rate: float = 0.1
  gelu_approximate: bool = True
  swiglu: bool = False
  quick_gelu: bool = False
  inner_norm: bool = False
  layer_norm_eps: float = 1e-6
  use_bias: bool = True
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.normal(stddev=1e-6)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs, *, deterministic):
    dense = functools.partial(nn.Dense, kernel_init=self.kernel_init,
                              bias_init=self.bias_init, use_bias=self.use_bias,
                              dtype=self.dtype)
    if self.swiglu:
      x1, x2 = jnp.split(dense(2 * self.mlp_dim)(inputs), 2, axis=-1)
      x = nn.silu(x1) * x2
    elif self.quick_gelu:
      x = dense(self.mlp_dim)(inputs)
      x = x * nn.sigmoid(1.702 * x)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    elif self.inner_norm or target.platform() != 'cpu':
      # (The CPU's trick below costs HBM traffic on accelerators.)
      x = nn.gelu(dense(self.mlp_dim)(inputs), self.gelu_approximate)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    elif deterministic or self.dropout_rate == 0:
      # GELU inside the next product, whose backward pass then keeps only
      # the hidden layer before GELU (ops.gelu_dot_general).
      x = dense(self.mlp_dim)(inputs)
      dense = functools.partial(dense, dot_general=functools.partial(
          ops.gelu_dot_general, approximate=self.gelu_approximate))
    else:
      x = ops.gelu(dense(self.mlp_dim)(inputs), self.gelu_approximate)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    if self.inner_norm:
      x = ops.LayerNorm(epsilon=self.layer_norm_eps, name='norm',
                             dtype=self.dtype)(x)
    x = dense(inputs.shape[-1] if self.out_dim is None else self.out_dim)(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


# The blocks' norms (`Encoder.norm`): LayerNorm, or RMSNorm (no bias, no
# centering; InternViT-6B's). Both keep their gain as `scale`.
NORMS = ('layer', 'rms')


def make_norm(kind: str, epsilon: float = 1e-6, dtype: Any = None,
              name: Optional[str] = None) -> nn.Module:
  """The norm `kind` (one of NORMS) with this epsilon."""
  if kind not in NORMS:
    raise ValueError(f'Unknown norm {kind!r}; expected one of {NORMS}.')
  if kind == 'rms':
    return nn.RMSNorm(epsilon=epsilon, dtype=dtype, name=name)
  return ops.LayerNorm(epsilon=epsilon, dtype=dtype, name=name)


class LayerScale(nn.Module):
  """Learned per-channel scale of a residual branch (CaiT's LayerScale,
  timm's `init_values`): a `scale` of shape (D,), initially `init_value`."""
  init_value: float

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.constant(self.init_value),
                       (x.shape[-1],))
    return x * scale.astype(x.dtype)


def keep_patches(x, keep, prefix):
  """The `prefix` leading tokens of `x`, then its patches at `keep`, the
  (batch, k) indices into the tokens after the prefix."""
  patches = jnp.take_along_axis(x[:, prefix:], keep[:, :, None], axis=1)
  return jnp.concatenate([x[:, :prefix], patches], axis=1)


class MAPHead(nn.Module):
  """Multi-head attention pooling: a learned probe attends over the tokens.

  Attributes:
    mlp_dim: hidden width of the MLP after the attention (default 4 D).
    gelu_approximate: see `MlpBlock`.
    layer_norm_eps: of its LayerNorm.
  """
  num_heads: int
  mlp_dim: Optional[int] = None
  gelu_approximate: bool = True
  layer_norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, mask=None):
    """(batch, D) of (batch, tokens, D) `x`; with `mask`, (batch, queries,
    tokens) bools, one pooled token per query, attending where True: (batch,
    queries, D)."""
    n, _, d = x.shape
    queries = 1 if mask is None else mask.shape[1]
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d))
    probe = jnp.tile(probe, (n, queries, 1)).astype(x.dtype)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        attention_fn=attention, dtype=self.dtype)(
            probe, x, mask=None if mask is None else mask[:, None])
    y = ops.LayerNorm(epsilon=self.layer_norm_eps, dtype=self.dtype)(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim or 4 * d, dropout_rate=0.,
                     gelu_approximate=self.gelu_approximate,
                     dtype=self.dtype)(y, deterministic=True)
    return x[:, 0] if mask is None else x


class KVPoolHead(nn.Module):
  """AIMv2's attention pooling (transformers' Aimv2AttentionPoolingHead): a
  learned `probe`, split into heads as it is (no query projection), attends
  through bias-free `key` and `value` projections; `out` projects the
  result. No norm, no MLP: (batch, D) of (batch, tokens, D) `x`."""
  num_heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    n, _, d = x.shape
    heads = (self.num_heads, d // self.num_heads)
    probe = self.param('probe', nn.initializers.normal(stddev=0.02),
                       (1, 1, d))
    query = jnp.broadcast_to(probe.reshape(1, 1, *heads),
                             (n, 1, *heads)).astype(x.dtype)
    project = functools.partial(nn.DenseGeneral, heads, use_bias=False,
                                dtype=self.dtype)
    y = attention(query, project(name='key')(x), project(name='value')(x),
                  deterministic=True)
    return nn.DenseGeneral(d, axis=(-2, -1), dtype=self.dtype,
                           name='out')(y)[:, 0]
