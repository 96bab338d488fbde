"""SAM's image encoder (Kirillov et al., ICCV 2023), in Flax Linen.

A plain ViT whose blocks attend inside windows of `window_size` patches
(the grid padded to whole windows, then cut back), except the global
blocks `global_blocks`, which attend over the whole grid; every attention
adds decomposed relative positions (MViTv2's: a table per axis of
2 * size - 1 rows, read by the query's and key's offsets, and dotted with
the query). A convolutional neck (1x1 conv, LayerNorm, 3x3 conv,
LayerNorm; no biases) turns the last block's map into the image
embedding, (batch, h, w, neck_channels).

At another input size the tables follow the input as timm's `samvit_*`
does: the absolute table is resampled to the grid (torch's antialiased
bicubic), and a global block's relative tables are interpolated linearly
to 2 * grid - 1 rows. transformers' `SamVisionModel` takes only its
`image_size`; at that size both compute the same.
"""

from typing import Any, Optional, Sequence, Tuple

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.models import intermediates
from vit_jax.models import posemb_resize
from vit_jax.models import swin
from vit_jax.models.attention import attention
from vit_jax.models.layers import drop_path_rates
from vit_jax.models.layers import DropPath
from vit_jax.models.layers import MlpBlock

NECK_EPSILON = 1e-6  # LayerNorm2d's in timm's and transformers' necks


def relative_positions(table, size: int):
  """(size, size, D) embeddings of the query-key offsets along one axis:
  [i, j] is row i - j + size - 1 of `table` (L, D), first interpolated
  linearly to 2 * size - 1 rows if it has another count (SAM's
  `get_rel_pos` for queries and keys of one size)."""
  rows = 2 * size - 1
  if table.shape[0] != rows:
    weights = posemb_resize.torch_linear_weights(table.shape[0], rows)
    table = jnp.asarray(weights, table.dtype) @ table
  offsets = np.arange(size)[:, None] - np.arange(size)[None, :] + size - 1
  return table[offsets]


def decomposed_bias(query, table_h, table_w, grid: Tuple[int, int]):
  """SAM's `add_decomposed_rel_pos` as an additive bias: query (batch,
  h*w, heads, D), unscaled -> (batch, heads, h*w, h*w) logits, where query
  (y, x) and key (y', x') get q . Rh[y, y'] + q . Rw[x, x']."""
  h, w = grid
  b, _, heads, depth = query.shape
  q = query.reshape(b, h, w, heads, depth)
  rel_h = jnp.einsum('byxnd,ykd->bnyxk', q, relative_positions(table_h, h))
  rel_w = jnp.einsum('byxnd,xkd->bnyxk', q, relative_positions(table_w, w))
  bias = rel_h[..., :, None] + rel_w[..., None, :]
  return bias.reshape(b, heads, h * w, h * w)


def resample_table(table, grid: Tuple[int, int]):
  """The absolute table (1, H, W, D) at `grid`, as timm's
  `resample_abs_pos_embed_nhwc` (torch's antialiased bicubic): a linear
  map per axis, so it runs inside the model on traced parameters."""
  _, h, w, _ = table.shape
  if (h, w) == tuple(grid):
    return table
  rows = jnp.asarray(posemb_resize.antialias_weights(h, grid[0]), table.dtype)
  cols = jnp.asarray(posemb_resize.antialias_weights(w, grid[1]), table.dtype)
  return jnp.einsum('ih,jw,bhwd->bijd', rows, cols, table)


class SamAttention(nn.Module):
  """Self-attention over a (batch, h, w, C) map with decomposed relative
  positions (`rel_pos_h`, `rel_pos_w`: (2 * side - 1, head dim), sized for
  `table_size`, interpolated to other sides).

  Attributes:
    num_heads: heads; the width is split evenly among them.
    table_size: (h, w) the tables are sized for: the window, or the grid.
  """
  num_heads: int
  table_size: Tuple[int, int]
  qkv_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    b, h, w, width = x.shape
    depth = width // self.num_heads
    tables = [self.param(f'rel_pos_{axis}', nn.initializers.zeros,
                         (2 * side - 1, depth))
              for axis, side in zip('hw', self.table_size)]
    qkv = nn.Dense(3 * width, use_bias=self.qkv_bias, name='qkv',
                   dtype=self.dtype)(x.reshape(b, h * w, width))
    q, k, v = jnp.moveaxis(qkv.reshape(b, h * w, 3, self.num_heads, depth),
                           2, 0)
    bias = decomposed_bias(q, *tables, (h, w))
    out = attention(q, k, v, bias=bias.astype(q.dtype), deterministic=True)
    out = nn.Dense(width, name='proj', dtype=self.dtype)(
        out.reshape(b, h * w, width))
    return out.reshape(b, h, w, width)


def pad_to_windows(x, window: int):
  """(B, H, W, C) zero-padded at the bottom and right to whole windows."""
  _, h, w, _ = x.shape
  pad_h, pad_w = -h % window, -w % window
  return jnp.pad(x, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)))


class SamBlock(nn.Module):
  """x + DropPath(attention(LN(x))) inside windows of `window` patches
  (0: global), then x + DropPath(MLP(LN(x))).

  Attributes:
    window: window side in patches; 0 for a global block.
    table_size: the relative tables' (h, w): the window's, or the grid's.
  """
  num_heads: int
  mlp_dim: int
  window: int
  table_size: Tuple[int, int]
  layer_norm_eps: float = 1e-6
  qkv_bias: bool = True
  gelu_approximate: bool = False
  drop_path_rate: float = 0.
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, deterministic):
    _, h, w, c = x.shape
    norm = lambda name: nn.LayerNorm(  # pylint: disable=g-long-lambda
        epsilon=self.layer_norm_eps, name=name, dtype=self.dtype)
    drop = DropPath(self.drop_path_rate)
    attn = SamAttention(self.num_heads, self.table_size, self.qkv_bias,
                        dtype=self.dtype, name='attn')
    y = norm('norm1')(x)
    if self.window:
      # Padded patches take part in the windows' attention, as in SAM.
      y = pad_to_windows(y, self.window)
      padded = y.shape[1:3]
      windows = swin.window_partition(y, (self.window,) * 2)
      y = attn(windows.reshape(-1, self.window, self.window, c))
      y = swin.window_reverse(y.reshape(-1, self.window**2, c),
                              (self.window,) * 2, *padded)[:, :h, :w]
    else:
      y = attn(y)
    x = x + drop(y, deterministic=deterministic)
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=0.,
                 gelu_approximate=self.gelu_approximate, dtype=self.dtype,
                 name='mlp')(norm('norm2')(x), deterministic=deterministic)
    return x + drop(y, deterministic=deterministic)


class SamNeck(nn.Module):
  """1x1 conv `conv1`, LayerNorm `norm1`, 3x3 conv `conv2`, LayerNorm
  `norm2`, on NHWC maps (timm's `neck.0..3`, transformers' `neck`)."""
  channels: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    conv = lambda size, name: nn.Conv(  # pylint: disable=g-long-lambda
        self.channels, (size, size), padding='SAME', use_bias=False,
        name=name, dtype=self.dtype)
    norm = lambda name: nn.LayerNorm(  # pylint: disable=g-long-lambda
        epsilon=NECK_EPSILON, name=name, dtype=self.dtype)
    x = norm('norm1')(conv(1, 'conv1')(x))
    return norm('norm2')(conv(3, 'conv2')(x))


class SamImageEncoder(nn.Module):
  """SAM's image encoder: patch embedding, absolute positions, windowed and
  global blocks, neck; returns the image embedding (batch, h, w,
  neck_channels).

  Attributes:
    image_size: the side the position tables are sized for (SAM's 1024);
      other sides resample them (module docstring).
    patch_size: side of the square patches.
    hidden_size, num_layers, num_heads, mlp_dim: the ViT's.
    window_size: side of the attention windows, in patches.
    global_blocks: the blocks (from 0) that attend over the whole grid.
    neck_channels: the neck's (and the output's) width.
    layer_norm_eps: the blocks' LayerNorms' (SAM's 1e-6; timm's samvit
      computes 1e-5).
    gelu_approximate: flax's tanh GELU; False (SAM's) the exact one.
    stochastic_depth: drop path rate of the last block, linear from 0.
    dtype: of the computation; parameters stay float32.
  """
  image_size: int = 1024
  patch_size: int = 16
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  mlp_dim: int = 3072
  window_size: int = 14
  global_blocks: Sequence[int] = (2, 5, 8, 11)
  neck_channels: int = 256
  layer_norm_eps: float = 1e-6
  qkv_bias: bool = True
  gelu_approximate: bool = False
  stochastic_depth: float = 0.
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  def __call__(self, inputs, *, train=False):
    return self._forward(inputs, train)

  def forward_intermediates(self, inputs, indices=None, *, norm=False,
                            output_fmt='NHWC', intermediates_only=False,
                            train=False):
    """The outputs of the blocks `indices` (`intermediates.take_indices`),
    as timm's samvit: (batch, h, w, hidden_size) maps ('NHWC') or their
    tokens ('NLC'). SAM has no final norm: `norm` puts each through the
    neck (as timm's), which makes them (batch, h, w, neck_channels).
    `intermediates_only=False` returns (the neck's output, intermediates),
    after every block; otherwise no block after the last asked for runs."""
    return intermediates.of_maps(
        lambda take: self._forward(inputs, train, take), self.num_layers, indices,
        norm, output_fmt, intermediates_only)

  @nn.compact
  def _forward(self, inputs, train, take=None):
    """`__call__`, or with `take`, (block indices, blocks to run, neck
    them), (neck output or None, those blocks' maps)."""
    check_image_size(inputs.shape, self.patch_size)
    dtype = jnp.dtype(self.dtype)
    x = nn.Conv(self.hidden_size, (self.patch_size,) * 2,
                strides=(self.patch_size,) * 2, padding='VALID',
                name='embedding', dtype=dtype)(inputs)
    side = self.image_size // self.patch_size
    table = self.param('pos_embedding', nn.initializers.zeros,
                       (1, side, side, self.hidden_size))
    x = x + resample_table(table, x.shape[1:3]).astype(dtype)
    indices, depth, neck_taken = take or ((), self.num_layers, False)
    neck = SamNeck(self.neck_channels, dtype=dtype, name='neck')
    rates = drop_path_rates(self.stochastic_depth, self.num_layers)
    taken = []
    for i in range(depth):
      window = 0 if i in self.global_blocks else self.window_size
      x = SamBlock(self.num_heads, self.mlp_dim, window,
                   (window or side,) * 2, self.layer_norm_eps, self.qkv_bias,
                   self.gelu_approximate, rates[i], dtype,
                   name=f'blocks_{i}')(x, deterministic=not train)
      if i in indices:
        taken.append(neck(x) if neck_taken else x)
    if take is not None:
      return (neck(x) if depth == self.num_layers else None), taken
    return neck(x)


def check_image_size(shape, patch_size: int) -> None:
  """Raises a ValueError unless `shape` is NHWC with sides that are
  multiples of the patch (at trace time, before compilation)."""
  if len(shape) != 4:
    raise ValueError(f'Expected NHWC images, got shape {tuple(shape)}.')
  _, h, w, _ = shape
  if h % patch_size or w % patch_size or not (h and w):
    raise ValueError(f'Image size {h}x{w} does not fit this SAM encoder: '
                     f'sides must be multiples of the patch, {patch_size} '
                     'px.')
