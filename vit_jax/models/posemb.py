"""Patch grids and position embeddings: learned 1-D and 2-D tables, 2-D
sin-cos, an interpolated grid, 2-D RoPE, relative position biases (the
paper's Appendix D.4; docs/position_embeddings.md) and BEiT's and Swin's
tables of relative positions, as functions of each token's place so that
packed sequences (`navit`) use them too."""

from typing import Callable, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


POSEMBS = ('learn', 'none', 'learn2d', 'relative', 'sincos2d', 'rope2d',
           'interp2d')
ROPE_THETA = 10_000.  # MoonViT's (and EVA-02's) base of the RoPE frequencies


class AddPositionEmbs(nn.Module):
  """Adds a learned (1, tokens, width) position embedding to the tokens."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs):
    if inputs.ndim != 3:
      raise ValueError(f'Expected (batch, tokens, width), got {inputs.shape}.')
    return inputs + _posemb_table(
        self, 'pos_embedding', (1, *inputs.shape[1:]),
        'with `checkpoint.interpolate_posembed` (`load_pretrained` does)'
    ).astype(inputs.dtype)


class AddPositionEmbs2D(nn.Module):
  """Adds learned row and column embeddings, concatenated per patch.

  Patch (i, j) gets [row_i, col_j], each half of the width; the leading
  (class) tokens get nothing.
  """
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs, grid):
    d = inputs.shape[-1]
    h, w = grid
    if d % 2:
      raise ValueError(f"posemb='learn2d' needs an even width, got {d}.")
    fix = 'by 1-D interpolation along axis 1 (`load_pretrained` does)'
    row = _posemb_table(self, 'pos_embedding_row', (1, h, d // 2), fix)
    col = _posemb_table(self, 'pos_embedding_col', (1, w, d // 2), fix)
    # Row-major: patch i * w + j gets row i and column j.
    pe = jnp.concatenate([jnp.repeat(row, w, axis=1),
                          jnp.tile(col, (1, h, 1))], axis=-1)
    return inputs + pad_prefix(pe, inputs.shape[1] - h * w).astype(
        inputs.dtype)


def _posemb_table(module, name, shape, fix):
  """`module`'s learned table `name` of `shape`, initialized if absent.

  A stored table of another shape means a resolution change without a
  resize: flax would raise too, but only this error says how to `fix` it.
  """
  if module.has_variable('params', name):
    stored = module.get_variable('params', name).shape
    if stored != shape:
      raise ValueError(
          f'The position embedding {name} has shape {stored} but the input '
          f'needs {shape}: resize it for the new resolution {fix}.')
  return module.param(name, module.posemb_init, shape)


def posemb_sincos_2d(h, w, width, temperature=10_000., dtype=jnp.float32):
  """Fixed 2-D sine-cosine position embeddings, as big_vision's.

  (1, h * w, width), row-major over the (h, w) grid: patch (y, x) gets
  [sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k)], w_k = temperature **
  (-k / (width/4 - 1)), k = 0 .. width/4 - 1; `width` is a multiple of 4.
  """
  if width % 4:
    raise ValueError(f"posemb='sincos2d' needs a width divisible by 4, "
                     f'got {width}.')
  quarter = width // 4
  omega = 1. / temperature**(np.arange(quarter) / max(quarter - 1, 1))
  y, x = np.mgrid[:h, :w]
  x, y = (np.outer(v.ravel(), omega) for v in (x, y))
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return jnp.asarray(pe[None], dtype)


def sinusoid_table(num_positions: int, dim: int) -> np.ndarray:
  """The fixed 1-D sine-cosine table (num_positions, dim), float32, of
  VideoMAE (Tong et al., 2022; `get_sinusoid_encoding_table`): position p,
  channel j gets p / 10000 ** (2 * (j // 2) / dim), its sine at even j and
  its cosine at odd j (interleaved, computed in float64)."""
  angles = (np.arange(num_positions, dtype=np.float64)[:, None] /
            10000.**(2 * (np.arange(dim) // 2) / dim))
  angles[:, 0::2] = np.sin(angles[:, 0::2])
  angles[:, 1::2] = np.cos(angles[:, 1::2])
  return angles.astype(np.float32)


def pad_prefix(pe, prefix):
  """Prepends zero embeddings for the `prefix` (class) tokens."""
  return jnp.pad(pe, ((0, 0), (prefix, 0), (0, 0)))


# Position schemes as functions of each token's place: its (row, column) in
# its image's patch grid and that grid's (height, width). The ordinary ViT
# gives them `grid_positions`; a packed sequence (models_navit) its own.


def grid_positions(grid):
  """(rows, cols, heights, widths) of the patches of an (h, w) grid in
  row-major order, each int32 (1, h * w)."""
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w, dtype=np.int32), w)
  full = np.full((1, h * w), 1, np.int32)
  return rows[None], cols[None], h * full, w * full


def factorized_posemb(row_table, col_table, rows, cols, heights, widths,
                      fractional=False):
  """NaViT's factorized embedding of each token: row_table[i] + col_table[j].

  (i, j) is the token's (row, column); `fractional`: floor(row / height * G)
  and floor(col / width * G), G the tables' length. Indices past the tables
  are clipped (`models_navit.check_batch` rejects them on the host).
  """
  if fractional:  # integer arithmetic: exact floors; padding has height 0
    rows = rows * row_table.shape[0] // jnp.maximum(heights, 1)
    cols = cols * col_table.shape[0] // jnp.maximum(widths, 1)
  return (jnp.take(row_table, rows, axis=0, mode='clip') +
          jnp.take(col_table, cols, axis=0, mode='clip'))


def _cubic_taps(index, size, source, a=-0.75):
  """torch's bicubic resampling of `source` entries to `size`, one axis
  (`interpolate(mode='bicubic', align_corners=False)`, no antialiasing).

  For output entries `index` (ints), their 4 source entries (clamped to the
  borders) and Keys' weights with `a`, each (..., 4).
  """
  scale = source / jnp.maximum(size, 1).astype(jnp.float32)
  x = (index + 0.5) * scale - 0.5
  x0 = jnp.floor(x)
  t = (x - x0)[..., None]
  taps = jnp.clip(x0.astype(jnp.int32)[..., None] + np.arange(-1, 3), 0,
                  source - 1)

  def near(d):  # |d| <= 1
    return ((a + 2) * d - (a + 3)) * d * d + 1

  def far(d):  # 1 < |d| < 2
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

  weights = jnp.concatenate([far(t + 1), near(t), near(1 - t), far(2 - t)],
                            axis=-1)
  return taps, weights


def interp2d_posemb(table, rows, cols, heights, widths):
  """MoonViT's interpolated embedding of each token, (..., D).

  The learned grid `table` (H0, W0, D) resampled to the token's image grid
  (height, width) as torch's bicubic `interpolate` (`_cubic_taps`), at
  (row, column). Where the grid is (H0, W0) that is the table itself.
  """
  ty, wy = _cubic_taps(rows, heights, table.shape[0])
  tx, wx = _cubic_taps(cols, widths, table.shape[1])
  entries = table[ty[..., :, None], tx[..., None, :]]  # (..., 4, 4, D)
  weights = (wy[..., :, None] * wx[..., None, :])[..., None]
  # A sum, not a matmul: float32 even where matmuls default to less.
  return jnp.sum(entries * weights.astype(table.dtype), axis=(-3, -2))


def _bilinear_weights(index, size, source):
  """`jax.image.resize`'s bilinear resampling of `source` entries to `size`
  (antialiased when shrinking, as torch's `interpolate(mode='bilinear',
  antialias=True)`), one axis, for output entries `index`: dense weights
  (..., source), so that `size` may differ from token to token."""
  scale = source / jnp.maximum(size, 1).astype(jnp.float32)
  centre = (index + 0.5) * scale  # in source units
  width = jnp.maximum(scale, 1.)[..., None]  # the triangle widens to shrink
  weights = jnp.maximum(
      0., 1. - jnp.abs(np.arange(source) + 0.5 - centre[..., None]) / width)
  return weights / jnp.sum(weights, axis=-1, keepdims=True)


def resized_posemb(table, rows, cols, heights, widths):
  """SigLIP 2's NaFlex embedding of each token, (..., D): the learned grid
  `table` (H0, W0, D) resized bilinearly to the token's image grid (height,
  width) (`_bilinear_weights`), at (row, column); what `jax.image.resize`
  of the whole grid gives, one token at a time."""
  wy = _bilinear_weights(rows, heights, table.shape[0])
  wx = _bilinear_weights(cols, widths, table.shape[1])
  return jnp.einsum('...h,...w,hwd->...d', wy, wx, table.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def rope2d_angles(rows, cols, head_dim, theta=ROPE_THETA):
  """MoonViT's 2-D RoPE angles of each token, float32 (..., head_dim / 2).

  Frequencies f_k = theta ** (-4k / head_dim), k < head_dim / 4; angle 2k is
  col * f_k and angle 2k + 1 is row * f_k. A token at (0, 0) (and a class
  token, given 0s) is not rotated.
  """
  freqs = (theta**(-np.arange(0, head_dim, 4) / head_dim)).astype(np.float32)
  angles = jnp.stack([jnp.asarray(cols, jnp.float32)[..., None] * freqs,
                      jnp.asarray(rows, jnp.float32)[..., None] * freqs], -1)
  return angles.reshape(*angles.shape[:-2], head_dim // 2)


# 2-D RoPE beside a position table (or none), as timm's Eva computes them.
ROPES = ('eva02', 'dinov3')
# Which axis's angles come first: the row's ('ij') or the column's ('xy').
ROPE_INDEXINGS = ('ij', 'xy')


def rope_angles(kind, grid, head_dim, theta, ref_grid=None, offset=0.,
                indexing='ij'):
  """EVA-02's or DINOv3's 2-D RoPE angles of the patches of `grid` (h, w),
  row-major, float32 (h w, head_dim / 2): the row's angles, then the
  column's (with `indexing` 'xy', the column's first: Perception
  Encoder's), each at frequencies k < head_dim / 4.

  'eva02': position index plus `offset` (PE's 1), rescaled to `ref_grid`
  (the pretraining grid) if given, times theta ** (-4k / head_dim).
  'dinov3': the patch centre in [-1, 1] times 2 pi / theta ** (4k /
  head_dim). They differ from MoonViT's
  'rope2d' (`rope2d_angles`), which alternates column and row angles on
  integer positions, and DINOv3 rotates its pairs half a head apart
  (`apply_rope(half=True)`), where EVA-02 and MoonViT rotate neighbours.
  """
  h, w = grid
  k = np.arange(head_dim // 4) / (head_dim // 4)
  if indexing not in ROPE_INDEXINGS or (offset and kind != 'eva02'):
    raise ValueError(f'rope {kind!r} with offset {offset} and indexing '
                     f"{indexing!r}: expected one of {ROPE_INDEXINGS}, an "
                     "offset with 'eva02' only.")
  if kind == 'eva02':
    freqs = theta**-k
    rows, cols = (np.arange(n, dtype=np.float64) + offset for n in (h, w))
    if ref_grid is not None:
      rows, cols = rows / h * ref_grid[0], cols / w * ref_grid[1]
  elif kind == 'dinov3':
    freqs = 2 * np.pi / theta**k
    rows, cols = (2 * (np.arange(n) + 0.5) / n - 1 for n in (h, w))
  else:
    raise ValueError(f'Unknown rope {kind!r}; expected one of {ROPES}.')
  r, c = np.meshgrid(rows, cols, indexing='ij')
  first, second = (r, c) if indexing == 'ij' else (c, r)
  angles = np.concatenate([first.reshape(-1, 1) * freqs,
                           second.reshape(-1, 1) * freqs], axis=-1)
  return jnp.asarray(angles, jnp.float32)


def rope_head_dim(width, num_heads):
  """The head width of 2-D RoPE, once checked: divisible by 4."""
  if width % num_heads or (width // num_heads) % 4:
    raise ValueError(f'2-D RoPE needs a head width (hidden_size / '
                     f'num_heads) divisible by 4, got {width} / {num_heads}.')
  return width // num_heads


def apply_rope(x, angles, half=False):
  """Rotates (batch, tokens, heads, d) `x` by (batch, tokens, d / 2)
  `angles`: pair (x[2j], x[2j + 1]) as a complex number, by angle j; with
  `half`, pair (x[j], x[j + d / 2])."""
  x32 = x.astype(jnp.float32)
  if half:
    re, im = jnp.split(x32, 2, axis=-1)
  else:
    pairs = x32.reshape(*x.shape[:-1], -1, 2)
    re, im = pairs[..., 0], pairs[..., 1]
  cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
  rotated = re * cos - im * sin, re * sin + im * cos
  out = jnp.concatenate(rotated, -1) if half else jnp.stack(rotated, -1)
  return out.reshape(x.shape).astype(x.dtype)


class Interp2DPosEmb(nn.Module):
  """MoonViT's learned 2-D grid `pos_embedding_grid`, interpolated to each
  token's image grid (`interp2d_posemb`).

  The grid is created as `shape` (H0, W0, D); once it exists its stored
  (H0, W0) is kept, whatever the images' grids.
  """
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, positions, shape):
    """The (..., D) embeddings of `positions` (rows, cols, heights, widths)."""
    if self.has_variable('params', 'pos_embedding_grid'):
      stored = self.get_variable('params', 'pos_embedding_grid').shape
      shape = (*stored[:2], shape[2])
    table = self.param('pos_embedding_grid', self.posemb_init, shape)
    return interp2d_posemb(table, *positions)


def relative_position_index(window: Tuple[int, int]) -> np.ndarray:
  """(N, N) rows of the bias table for query i and key j of a window of N
  patches: their offset (dy, dx), shifted to start at 0, in row-major
  order over the (2 wh - 1, 2 ww - 1) offsets."""
  wh, ww = window
  coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww),
                                indexing='ij')).reshape(2, -1)
  dy, dx = coords[:, :, None] - coords[:, None, :]
  return (dy + wh - 1) * (2 * ww - 1) + (dx + ww - 1)


# transformer.relative_bias: BEiT's tables, one per block or one shared.
RELATIVE_BIASES = ('block', 'shared')
# BEiT's table: a row per offset of the patch grid, then 3 for the class
# token (class -> patch, patch -> class, class -> class).
CLASS_ROWS = 3


def relative_bias_index(grid: Tuple[int, int]) -> np.ndarray:
  """(1 + h w, 1 + h w) rows of BEiT's bias table for a class token then
  the patches of `grid` (h, w), as timm beit's `gen_relative_position_index`:
  patch pairs by their offset (`relative_position_index`), after them the
  class token's three rows."""
  h, w = grid
  offsets = (2 * h - 1) * (2 * w - 1)
  index = np.empty((1 + h * w, 1 + h * w), np.int32)
  index[1:, 1:] = relative_position_index(grid)
  index[0, 1:] = offsets  # class -> patch
  index[1:, 0] = offsets + 1  # patch -> class
  index[0, 0] = offsets + 2
  return index


def relative_bias_grid(rows: int) -> Tuple[int, int]:
  """The square (h, h) grid of a BEiT table of `rows` rows."""
  span = int(round(np.sqrt(max(rows - CLASS_ROWS, 0))))
  if span * span != rows - CLASS_ROWS or span % 2 == 0:
    raise ValueError(f'A relative bias table of {rows} rows is not of a '
                     'square grid: give the grid.')
  return (span + 1) // 2, (span + 1) // 2


class RelativeBiasTable(nn.Module):
  """BEiT's learned attention bias per relative position (`table`, rows by
  `relative_bias_index`, zeros at init as timm's), for a class token and
  the patch grid of the call; the table is made at the grid of
  initialization, and another grid needs it resized
  (`posemb_resize.resize_relative_table`, which loading does)."""
  num_heads: int
  posemb_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, grid, tokens):
    """The (1, heads, tokens, tokens) bias of a class token then `grid`."""
    h, w = grid
    if tokens != 1 + h * w:
      raise ValueError(f"transformer.relative_bias: BEiT's table has rows "
                       f'for one class token before the {h}x{w} patches, '
                       f'got {tokens - h * w} prefix tokens.')
    shape = ((2 * h - 1) * (2 * w - 1) + CLASS_ROWS, self.num_heads)
    table = _posemb_table(self, 'table', shape, 'with `posemb_resize.'
                          'resize_relative_table` (`load_params` does)')
    return jnp.transpose(table[relative_bias_index(grid)], (2, 0, 1))[None]


def relative_offset_index(grid, max_distance):
  """Index of the clipped (row, column) offset query - key, for all pairs.

  (h*w, h*w) ints, patches row-major on `grid` (h, w), into the offset table
  flattened over its (row, column) offsets in [-max_distance, max_distance].
  """
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w), w)
  k = max_distance
  dr = np.clip(rows[:, None] - rows[None, :], -k, k) + k
  dc = np.clip(cols[:, None] - cols[None, :], -k, k) + k
  return dr * (2 * k + 1) + dc


class RelativePositionBias(nn.Module):
  """Attention bias from learned embeddings of relative 2-D offsets.

  For a query patch q and key patch k with clipped offset (dr, dc), the bias
  is <query_q, E[dr, dc]> per head: an extra attention whose keys are the
  offset embeddings. Pairs with a leading (class) token get zero bias.

  Attributes:
    max_distance: offsets are clipped to this distance in rows and columns;
      it fixes the table's size, whatever the resolution.
  """
  max_distance: int
  embedding_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, query, grid):
    """The (batch, heads, tokens, tokens) bias for `query`: (batch, tokens,
    heads, depth) queries scaled as for the content logits, (class) tokens
    first, then the patches of `grid` (h, w)."""
    _, tokens, heads, depth = query.shape
    span = 2 * self.max_distance + 1
    table = self.param('rel_embedding', self.embedding_init,
                       (span, span, heads, depth))
    patches = grid[0] * grid[1]
    prefix = tokens - patches
    if prefix < 0:
      raise ValueError(f'{tokens} tokens cannot hold a {grid} grid of patches.')
    index = relative_offset_index(grid, self.max_distance)
    logits = jnp.einsum('bqhd,uhd->bhqu', query[:, prefix:],
                        table.reshape(span * span, heads, depth))
    bias = logits[:, :, np.arange(patches)[:, None], index]
    return jnp.pad(bias, ((0, 0), (0, 0), (prefix, 0), (prefix, 0)))


def patch_size(patches) -> Tuple[int, int]:
  """(height, width) of `patches['size']`, which may be an int or a pair."""
  size = patches['size']
  ph, pw = (size, size) if isinstance(size, int) else tuple(size)
  return int(ph), int(pw)


def resnet_stride(resnet) -> int:
  """How much a hybrid's ResNet (`VisionTransformer._resnet`) downsamples.

  The root (stride-2 conv, stride-2 max-pool) downsamples by 4 and each
  stage after the first by another 2. No ResNet (None) gives 1.
  """
  if resnet is None:
    return 1
  return 4 * 2**max(len(resnet['num_layers']) - 1, 0)


def token_grid(model_config, image_size) -> Tuple[int, int]:
  """The (h, w) grid of patch tokens that a ViT or hybrid makes of an image
  of `image_size` (height, width), from its config alone (no tracing)."""
  stride = resnet_stride(model_config.get('resnet'))
  ph, pw = patch_size(model_config['patches'])
  # The ResNet pads ('SAME'), so each of its strides rounds up.
  height, width = (-(-side // stride) for side in image_size)
  return height // ph, width // pw


def check_image_size(shape, patch: Tuple[int, int], what: str = 'Image'):
  """Raises a ValueError unless `shape` is NHWC, sides multiples of `patch`."""
  if len(shape) != 4:
    raise ValueError(f'Expected NHWC images, got shape {tuple(shape)}.')
  _, h, w, _ = shape
  if h % patch[0] or w % patch[1] or h < patch[0] or w < patch[1]:
    raise ValueError(
        f'{what} size {h}x{w} is not a multiple of the patch size '
        f'{patch[0]}x{patch[1]}.')
