"""Swin Transformer (Liu et al., ICCV 2021), in Flax Linen.

Attention runs inside non-overlapping windows of `window_size` patches,
with a learned bias per relative offset; every other block shifts the
windows by half a window (a cyclic shift, and a mask so that patches that
the shift brought together from opposite borders do not attend to each
other). Between stages, patch merging halves the resolution and doubles the
width. The parameter tree follows timm's `SwinTransformer` module for
module (`layers_{i}/blocks_{j}/attn/qkv`, `layers_{i}/downsample/reduction`
at the start of stages 1..3), so `convert_swin` maps names one to one.

The stages' outputs for dense tasks: `forward_intermediates`, as timm's
(each is also sown as `intermediates/stage_{i}`).
"""

from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.models import intermediates
from vit_jax.models import vit as models_vit
from vit_jax.models.posemb import relative_position_index

# The original's (and timm's) value for masked logits: exp(-100) is zero in
# float32 next to the unmasked ones, and finite, so no NaN can arise.
MASK_VALUE = -100.
LAYERNORM_EPSILON = 1e-5  # PyTorch's, which timm's weights were trained with


def window_partition(x, window: Tuple[int, int]):
  """(B, H, W, C) -> (B * windows, wh * ww, C), windows in row-major order."""
  b, h, w, c = x.shape
  wh, ww = window
  x = x.reshape(b, h // wh, wh, w // ww, ww, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(-1, wh * ww, c)


def window_reverse(windows, window: Tuple[int, int], h: int, w: int):
  """The inverse of `window_partition`: -> (B, H, W, C)."""
  wh, ww = window
  c = windows.shape[-1]
  x = windows.reshape(-1, h // wh, w // ww, wh, ww, c).transpose(
      0, 1, 3, 2, 4, 5)
  return x.reshape(-1, h, w, c)


def stage_window(grid: Tuple[int, int], window: int):
  """(window, shift) per axis of a stage whose patch grid is `grid`: an
  axis no longer than the window is one window and never shifted."""
  size = tuple(min(window, g) for g in grid)
  shift = tuple(0 if g <= window else window // 2 for g in grid)
  return size, shift


def shifted_window_mask(grid, window, shift) -> Optional[np.ndarray]:
  """(windows, N, N) additive mask of shifted windows, None without shift.

  After the cyclic shift the last window row/column holds patches from
  both borders; labelling the 3 x 3 regions that the shift cuts, two
  patches may attend to each other only if their labels agree.
  """
  if not any(shift):
    return None
  labels = np.zeros((1, *grid, 1), np.float32)
  # Per axis: the windows that the roll leaves whole, then the last window,
  # split where the patches rolled in from the other border begin.
  edges = [(0, g - wi, g - si, g) for g, wi, si in zip(grid, window, shift)]
  for k, (i, j) in enumerate(np.ndindex(3, 3)):
    labels[:, edges[0][i]:edges[0][i + 1], edges[1][j]:edges[1][j + 1]] = k
  labels = window_partition(labels, window)[..., 0]  # (windows, N)
  differ = labels[:, None, :] != labels[:, :, None]
  return np.where(differ, MASK_VALUE, 0.).astype(np.float32)


class WindowAttention(nn.Module):
  """Multi-head self-attention inside each window, with a learned bias per
  relative offset (`relative_position_bias_table`, offsets x heads).

  Attributes:
    num_heads: heads; the width is split evenly among them.
    window: (wh, ww) patches per window.
  """
  num_heads: int
  window: Tuple[int, int]
  attention_dropout_rate: float = 0.
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, mask=None, *, deterministic):
    """`x`: (B * windows, N, C); `mask`: (windows, N, N) additive, or None."""
    n, tokens, width = x.shape
    wh, ww = self.window
    table = self.param('relative_position_bias_table',
                       nn.initializers.truncated_normal(stddev=0.02),
                       ((2 * wh - 1) * (2 * ww - 1), self.num_heads))
    bias = table[relative_position_index(self.window)]  # (N, N, heads)
    bias = jnp.transpose(bias, (2, 0, 1))[None]
    if mask is not None:  # per window; windows run fastest within an image
      bias = (bias[None] + jnp.asarray(mask)[:, None]).reshape(
          -1, self.num_heads, tokens, tokens)
      bias = jnp.tile(bias, (n // mask.shape[0], 1, 1, 1))
    qkv = nn.Dense(3 * width, name='qkv', dtype=self.dtype)(x)
    q, k, v = jnp.moveaxis(
        qkv.reshape(n, tokens, 3, self.num_heads, -1), 2, 0)
    dropout = self.attention_dropout_rate > 0. and not deterministic
    out = models_vit.attention(
        q, k, v, bias=bias, dropout_rate=self.attention_dropout_rate,
        dropout_rng=self.make_rng('dropout') if dropout else None,
        deterministic=deterministic)
    return nn.Dense(width, name='proj', dtype=self.dtype)(
        out.reshape(n, tokens, width))


class SwinBlock(nn.Module):
  """x + DropPath(W-MSA or SW-MSA(LN(x))), then x + DropPath(MLP(LN(x))).

  Attributes:
    window: window size in patches (per stage, `stage_window` may cut it).
    shifted: shift the windows by half a window (the odd blocks).
  """
  num_heads: int
  window: int
  shifted: bool
  mlp_ratio: float = 4.
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  drop_path_rate: float = 0.
  gelu_approximate: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, deterministic):
    _, h, w, c = x.shape
    window, shift = stage_window((h, w), self.window)
    if not self.shifted:
      shift = (0, 0)
    norm = lambda name: nn.LayerNorm(  # pylint: disable=g-long-lambda
        epsilon=LAYERNORM_EPSILON, name=name, dtype=self.dtype)
    drop = models_vit.DropPath(self.drop_path_rate)
    y = jnp.roll(norm('norm1')(x), (-shift[0], -shift[1]), axis=(1, 2))
    y = WindowAttention(self.num_heads, window, self.attention_dropout_rate,
                        dtype=self.dtype, name='attn')(
                            window_partition(y, window),
                            shifted_window_mask((h, w), window, shift),
                            deterministic=deterministic)
    y = jnp.roll(window_reverse(y, window, h, w), shift, axis=(1, 2))
    x = x + drop(y, deterministic=deterministic)
    y = models_vit.MlpBlock(
        mlp_dim=int(c * self.mlp_ratio), dropout_rate=self.dropout_rate,
        gelu_approximate=self.gelu_approximate, dtype=self.dtype,
        name='mlp')(norm('norm2')(x), deterministic=deterministic)
    return x + drop(y, deterministic=deterministic)


class PatchMerging(nn.Module):
  """Concatenates each 2 x 2 patches (in the order (0,0), (1,0), (0,1),
  (1,1) of (row, column), as the original), `norm`, `reduction` to
  `features`: half the resolution."""
  features: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    b, h, w, c = x.shape
    x = x.reshape(b, h // 2, 2, w // 2, 2, c).transpose(0, 1, 3, 4, 2, 5)
    x = x.reshape(b, h // 2, w // 2, 4 * c)
    x = nn.LayerNorm(epsilon=LAYERNORM_EPSILON, name='norm',
                     dtype=self.dtype)(x)
    return nn.Dense(self.features, use_bias=False, name='reduction',
                    dtype=self.dtype)(x)


class SwinStage(nn.Module):
  """`downsample` (a `PatchMerging` to `merge_to` features, if set), then
  `depth` blocks `blocks_{j}`, the odd ones shifted."""
  depth: int
  num_heads: int
  window: int
  merge_to: Optional[int]
  drop_path_rates: Sequence[float]
  mlp_ratio: float = 4.
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  gelu_approximate: bool = False
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, deterministic):
    if self.merge_to:
      x = PatchMerging(self.merge_to, dtype=self.dtype, name='downsample')(x)
    for j in range(self.depth):
      x = SwinBlock(self.num_heads, self.window, shifted=j % 2 == 1,
                    mlp_ratio=self.mlp_ratio, dropout_rate=self.dropout_rate,
                    attention_dropout_rate=self.attention_dropout_rate,
                    drop_path_rate=self.drop_path_rates[j],
                    gelu_approximate=self.gelu_approximate, dtype=self.dtype,
                    name=f'blocks_{j}')(x, deterministic=deterministic)
    return x


class SwinTransformer(nn.Module):
  """Swin Transformer: patch embedding, stages of Swin blocks with patch
  merging before each but the first, final LayerNorm, average pool, head.

  Attributes:
    num_classes: head size; 0 or None for the pooled features.
    patch_size: side of the square patches.
    embed_dim: width of stage 0; stage i has embed_dim * 2**i.
    depths, num_heads: blocks and heads per stage.
    window_size: side of the attention windows, in patches.
    dropout_rate: dropout in the MLPs (timm's proj_drop_rate).
    stochastic_depth: drop path rate of the last block, linear from 0.
    gelu_approximate: flax's tanh GELU; False (timm's) the exact one.
    dtype: of the computation; parameters stay float32.
  """
  num_classes: Optional[int]
  patch_size: int = 4
  embed_dim: int = 96
  depths: Sequence[int] = (2, 2, 6, 2)
  num_heads: Sequence[int] = (3, 6, 12, 24)
  window_size: int = 7
  mlp_ratio: float = 4.
  dropout_rate: float = 0.
  attention_dropout_rate: float = 0.
  stochastic_depth: float = 0.
  gelu_approximate: bool = False
  head_bias_init: float = 0.
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  def __call__(self, inputs, *, train):
    return self._forward(inputs, train)

  def forward_intermediates(self, inputs, indices=None, *, norm=False,
                            output_fmt='NHWC', intermediates_only=False,
                            train=False):
    """The outputs of the stages `indices` (`intermediates.take_indices`),
    as timm's method: (batch, h, w, C) maps ('NHWC') or their tokens
    ('NLC'); `norm` puts the last stage's through the final norm (the only
    one it is sized for). `intermediates_only=False` returns (final NHWC
    map after the norm, intermediates); otherwise no stage after the last
    asked for runs."""
    return intermediates.of_maps(
        lambda take: self._forward(inputs, train, take), len(self.depths), indices,
        norm, output_fmt, intermediates_only)

  @nn.compact
  def _forward(self, inputs, train, take=None):
    """`__call__`, or with `take`, (stage indices, stages to run, norm the
    last), (final map, those stages' maps)."""
    check_image_size(inputs.shape, self.patch_size, self.window_size,
                     len(self.depths))
    dtype = jnp.dtype(self.dtype)
    x = nn.Conv(self.embed_dim, (self.patch_size,) * 2,
                strides=(self.patch_size,) * 2, padding='VALID',
                name='embedding', dtype=dtype)(inputs)
    x = nn.LayerNorm(epsilon=LAYERNORM_EPSILON, name='embedding_norm',
                     dtype=dtype)(x)
    rates = models_vit.drop_path_rates(self.stochastic_depth,
                                       sum(self.depths))
    indices, depth, norm_taken = take or ((), len(self.depths), False)
    norm = nn.LayerNorm(epsilon=LAYERNORM_EPSILON, name='norm', dtype=dtype)
    last, taken = len(self.depths) - 1, []
    for i, (depth_i, heads) in enumerate(zip(self.depths[:depth],
                                             self.num_heads)):
      x = SwinStage(depth_i, heads, self.window_size,
                    self.embed_dim * 2**i if i else None,
                    tuple(rates[sum(self.depths[:i]):][:depth_i]),
                    self.mlp_ratio, self.dropout_rate,
                    self.attention_dropout_rate, self.gelu_approximate, dtype,
                    name=f'layers_{i}')(x, deterministic=not train)
      self.sow('intermediates', f'stage_{i}', x)
      if i in indices:
        taken.append(norm(x) if norm_taken and i == last else x)
    if depth <= last:
      return x, taken
    x = norm(x)
    if take is not None:
      return x, taken
    x = jnp.mean(x, axis=(1, 2))
    if not self.num_classes:
      return x
    return nn.Dense(self.num_classes, name='head', dtype=jnp.float32,
                    kernel_init=nn.initializers.zeros,
                    bias_init=nn.initializers.constant(self.head_bias_init))(x)


def image_multiple(patch_size: int, window_size: int, stages: int) -> int:
  """The sides that work are multiples of this: the last stage's grid,
  side / (patch * 2**(stages - 1)), must be whole windows."""
  return patch_size * window_size * 2**(stages - 1)


def check_image_size(shape, patch_size: int, window_size: int, stages: int):
  """Raises a ValueError unless `shape` is NHWC with sides that are
  multiples of `image_multiple` (at trace time, before compilation)."""
  if len(shape) != 4:
    raise ValueError(f'Expected NHWC images, got shape {tuple(shape)}.')
  multiple = image_multiple(patch_size, window_size, stages)
  _, h, w, _ = shape
  if h % multiple or w % multiple or not (h and w):
    raise ValueError(
        f'Image size {h}x{w} does not fit this Swin: sides must be '
        f'multiples of patch x window x 2**(stages - 1) = {patch_size} x '
        f'{window_size} x {2**(stages - 1)} = {multiple} px.')
