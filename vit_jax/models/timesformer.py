"""TimeSformer (Bertasius et al., ICML 2021, "Is Space-Time Attention All
You Need for Video Understanding?"), in Flax Linen.

Each frame of a clip (batch, T, H, W, C) is cut into patches by an image
ViT's patch embedding (`embedding`, kernel (p, p, C, D)); every frame gets
the class token and the spatial table `Transformer/posembed_input/
pos_embedding` (1, 1 + h*w, D), as an image ViT's; the patches then a
temporal table `pos_embedding_time` (1, T, D). The blocks attend by
`attention_type` (ATTENTION_TYPES):

- 'divided_space_time' (the paper's TimeSformer): a temporal attention
  across the T frames at each patch position (the class token not taking
  part), its output through `temporal_dense` (zero at initialization, the
  paper's temporal_fc) added to the patches; then the spatial attention
  within each frame, the class token copied into every frame and its T
  outputs averaged back; then the MLP, on every token.
- 'joint_space_time': one attention over the class token and all T*h*w
  patches (an unfactorised ViViT's).
- 'space_only': the frames encoded apart (no temporal table), each with
  its class token; after the blocks the T frames' tokens are averaged
  (the paper's code; transformers' model returns a row per frame instead).

The spatial attention, norms and MLP keep an image ViT's names
(`LayerNorm_0`, `MultiHeadDotProductAttention_0`, `LayerNorm_1`,
`MlpBlock_0`), so they come from one by name (`checkpoints.inflate`); the
temporal parts are `temporal_norm`, `temporal_attention`, `temporal_dense`.
The order of norms and residuals is transformers' TimesformerLayer's.
"""

import functools
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models.attention import attention
from vit_jax.models.encoder import REMAT_POLICIES
from vit_jax.models.layers import drop_path_rates
from vit_jax.models.layers import DropPath
from vit_jax.models import layers
from vit_jax.models.layers import make_norm
from vit_jax.models.layers import MlpBlock
from vit_jax.models.posemb import patch_size

ATTENTION_TYPES = ('divided_space_time', 'joint_space_time', 'space_only')


def nearest(table, n: int):
  """(1, m, D) `table` at `n` entries, as torch's 'nearest' interpolation
  (entry i takes floor(i * m / n)), which transformers applies to a clip of
  other frames than its table's."""
  m = table.shape[1]
  if m == n:
    return table
  return table[:, (jnp.arange(n) * m) // n]


class TimeSformerBlock(nn.Module):
  """One block of `attention_type` on the class tokens `cls` (batch, k, D)
  and the patches `x` (batch, T, P, D); returns the pair.

  k is 1, or T for 'space_only' (a class token per frame)."""
  mlp_dim: int
  num_heads: int
  attention_type: str = 'divided_space_time'
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  drop_path_rate: float = 0.
  gelu_approximate: bool = True
  layer_norm_eps: float = 1e-6
  dtype: Any = jnp.float32

  def _attend(self, x, deterministic, name):
    """Self-attention, dropout, drop path of (batch, tokens, D) `x`."""
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype, name=name,
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        dropout_rate=self.attention_dropout_rate, deterministic=deterministic,
        attention_fn=attention)(x, x)
    y = nn.Dropout(rate=self.dropout_rate)(y, deterministic=deterministic)
    return DropPath(self.drop_path_rate)(y, deterministic=deterministic)

  @nn.compact
  def __call__(self, cls, x, deterministic):
    norm = functools.partial(make_norm, 'layer', self.layer_norm_eps,
                             self.dtype)
    b, t, p, d = x.shape
    if self.attention_type == 'divided_space_time':
      # Temporal: each patch position over the T frames.
      xt = x.transpose(0, 2, 1, 3).reshape(b * p, t, d)
      y = self._attend(norm(name='temporal_norm')(xt), deterministic,
                       'temporal_attention')
      y = nn.Dense(d, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                   name='temporal_dense')(y)
      x = x + y.reshape(b, p, t, d).transpose(0, 2, 1, 3)
      # Spatial: each frame with its copy of the class token.
      xs = jnp.concatenate(
          [jnp.broadcast_to(cls[:, None], (b, t, 1, d)), x], axis=2)
      y = self._attend(norm(name='LayerNorm_0')(xs.reshape(b * t, 1 + p, d)),
                       deterministic, 'MultiHeadDotProductAttention_0')
      y = y.reshape(b, t, 1 + p, d)
      cls = cls + y[:, :, :1].mean(axis=1)
      x = x + y[:, :, 1:]
      tokens = jnp.concatenate([cls, x.reshape(b, t * p, d)], axis=1)
    else:
      if self.attention_type == 'space_only':  # (b, T, 1 + P, D) per frame
        tokens = jnp.concatenate([cls[:, :, None], x], axis=2).reshape(
            b * t, 1 + p, d)
      else:
        tokens = jnp.concatenate([cls, x.reshape(b, t * p, d)], axis=1)
      tokens = tokens + self._attend(norm(name='LayerNorm_0')(tokens),
                                     deterministic,
                                     'MultiHeadDotProductAttention_0')
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
                 gelu_approximate=self.gelu_approximate, dtype=self.dtype)(
                     norm(name='LayerNorm_1')(tokens),
                     deterministic=deterministic)
    tokens = tokens + DropPath(self.drop_path_rate)(
        y, deterministic=deterministic)
    if self.attention_type == 'space_only':
      tokens = tokens.reshape(b, t, 1 + p, d)
      return tokens[:, :, 0], tokens[:, :, 1:]
    k = cls.shape[1]
    return tokens[:, :k], tokens[:, k:].reshape(b, t, p, d)


class PositionTables(nn.Module):
  """The spatial table `pos_embedding` (1, 1 + P, D), an image ViT's, and
  with `temporal` the temporal one `pos_embedding_time` (1, frames, D),
  zero at initialization (as the paper's and transformers')."""
  temporal: bool
  frames: int

  @nn.compact
  def __call__(self, patches: int, width: int):
    space = self.param('pos_embedding', nn.initializers.normal(stddev=0.02),
                       (1, 1 + patches, width))
    if not self.temporal:
      return space, None
    if self.has_variable('params', 'pos_embedding_time'):  # any frames
      return space, self.get_variable('params', 'pos_embedding_time')
    return space, self.param('pos_embedding_time', nn.initializers.zeros,
                             (1, self.frames, width))


class TimeSformerEncoder(nn.Module):
  """Position tables, the blocks, the final norm: the image ViT's
  `Transformer` and its names, plus the temporal table and parts."""
  num_layers: int
  mlp_dim: int
  num_heads: int
  attention_type: str = 'divided_space_time'
  num_frames: Optional[int] = None
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  stochastic_depth: float = 0.
  gelu_approximate: bool = True
  layer_norm_eps: float = 1e-6
  remat_policy: str = 'none'
  scan: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, cls, x, *, train):
    """Encodes the class token `cls` (batch, 1, D) and the patches `x`
    (batch, T, P, D); returns the class token's features (batch, D)."""
    b, t, p, d = x.shape
    space, time = PositionTables(
        self.attention_type != 'space_only', self.num_frames or t,
        name='posembed_input')(p, d)
    dropout = nn.Dropout(rate=self.dropout_rate, deterministic=not train)
    cls = dropout(cls + space[:, :1].astype(cls.dtype))
    x = dropout(x + space[:, None, 1:].astype(x.dtype))
    if time is not None:
      x = dropout(x + nearest(time, t)[:, :, None].astype(x.dtype))
    if self.attention_type == 'space_only':  # a class token per frame
      cls = jnp.broadcast_to(cls, (b, t, d))
    if self.scan or self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'A TimeSformer runs its blocks unscanned, with '
                       f'remat_policy one of {tuple(REMAT_POLICIES)}; got '
                       f'scan={self.scan}, '
                       f'remat_policy={self.remat_policy!r}.')
    block = TimeSformerBlock
    if self.remat_policy != 'none':
      block = nn.remat(block, static_argnums=(3,),
                       policy=REMAT_POLICIES[self.remat_policy])
    for i, rate in enumerate(drop_path_rates(self.stochastic_depth,
                                             self.num_layers)):
      cls, x = block(
          mlp_dim=self.mlp_dim, num_heads=self.num_heads,
          attention_type=self.attention_type, dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate,
          drop_path_rate=rate, gelu_approximate=self.gelu_approximate,
          layer_norm_eps=self.layer_norm_eps, dtype=self.dtype,
          name=f'encoderblock_{i}')(cls, x, not train)
    cls = cls.mean(axis=1)  # space_only: the frames' average (else k = 1)
    return make_norm('layer', self.layer_norm_eps, self.dtype,
                     name='encoder_norm')(cls)


class TimeSformer(nn.Module):
  """TimeSformer: per-frame patches, a class token, `TimeSformerEncoder`,
  the class token's features through `pre_logits` and the head.

  Attributes:
    num_classes: head size; 0 or None for no head.
    patches: ConfigDict with `size`, the (height, width) of a patch.
    transformer: `TimeSformerEncoder` attributes (num_layers, mlp_dim,
      num_heads, dropout_rate, attention_dropout_rate, stochastic_depth,
      gelu_approximate, layer_norm_eps, remat_policy), of the ViT
      `Encoder`'s defaults and meaning (tanh GELU unless
      gelu_approximate=False: the published weights' exact one).
    hidden_size: token width D.
    attention_type: one of ATTENTION_TYPES.
    num_frames: the temporal table's entries (the frames the weights were
      trained on); a clip of other frames takes it by nearest
      interpolation, as transformers does. None: the initial clip's.
    representation_size: width of the tanh `pre_logits` layer, if any.
    classifier: 'token' (the class token's features), the only one.
    dtype: of the computation; parameters stay float32, logits float32.
  """
  num_classes: Optional[int]
  patches: Any
  transformer: Any
  hidden_size: int
  attention_type: str = 'divided_space_time'
  num_frames: Optional[int] = None
  representation_size: Optional[int] = None
  classifier: str = 'token'
  dtype: Any = jnp.float32
  model_name: Optional[str] = None
  # Its inputs are clips (batch, T, H, W, C), not images.
  TAKES_CLIPS = True

  def _check(self, shape):
    if self.attention_type not in ATTENTION_TYPES:
      raise ValueError(f'Unknown attention_type {self.attention_type!r}; '
                       f'expected one of {ATTENTION_TYPES}.')
    if self.classifier != 'token':
      raise ValueError(f"A TimeSformer's classifier is 'token' (its class "
                       f'token), got {self.classifier!r}.')
    ph, pw = patch_size(self.patches)
    if len(shape) != 5 or shape[2] % ph or shape[3] % pw:
      raise ValueError(f'Expected clips (batch, frames, height, width, '
                       f'channels) of sides multiples of the {ph}x{pw} '
                       f'patch, got shape {tuple(shape)}.')

  @nn.compact
  def __call__(self, inputs, *, train):
    """Logits (or features, without a head) of (batch, T, H, W, C) clips."""
    self._check(inputs.shape)
    dtype = jnp.dtype(self.dtype)
    b, t = inputs.shape[:2]
    size = patch_size(self.patches)
    x = nn.Conv(self.hidden_size, kernel_size=size, strides=size,
                padding='VALID', name='embedding', dtype=dtype)(
                    inputs.reshape(b * t, *inputs.shape[2:]))
    x = x.reshape(b, t, -1, self.hidden_size)
    cls = self.param('cls', nn.initializers.zeros, (1, 1, self.hidden_size))
    cls = jnp.broadcast_to(cls, (b, 1, self.hidden_size)).astype(x.dtype)
    x = TimeSformerEncoder(attention_type=self.attention_type,
                           num_frames=self.num_frames, dtype=dtype,
                           name='Transformer', **self.transformer)(
                               cls, x, train=train)
    return layers.pre_logits_and_head(x, self.representation_size,
                                      self.num_classes, dtype)
