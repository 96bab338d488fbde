"""NaViT (Dehghani et al., 2023): a ViT on packed sequences of images of any
size and aspect ratio ("Patch n' Pack").

A batch holds B sequences of N tokens; each sequence packs the patches of
several images and padding (`vit_jax.data.packing` makes them):
  patches: float (B, N, p * p * C), each patch's pixels in (p, p, C) order;
  segment_ids: int (B, N), the token's image 1..max_images, 0 on padding;
  rows, cols: int (B, N), the token's place in its image's patch grid;
  heights, widths: int (B, N), that grid's size (0 on padding).
A token attends only to the tokens of its image (padding to padding), and
each image is pooled on its own, so an image's logits do not depend on what
it is packed with (tests/models/test_navit.py checks it).

The parameter names are the ViT's: `embedding` (a (p, p, C, D) kernel),
`Transformer/posembed_input`, `Transformer/encoderblock_{i}`,
`Transformer/encoder_norm`, `MAPHead_0`, `head`.
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import posemb
from vit_jax.models import vit as models_vit

POSEMBS = ('factorized', 'factorized_frac', 'interp2d', 'learn_resized',
           'rope2d')
POOLS = ('map', 'gap')
POSITION_KEYS = ('rows', 'cols', 'heights', 'widths')
BATCH_KEYS = ('patches', 'segment_ids') + POSITION_KEYS


def check_batch(batch, *, patch, max_images, max_grid=None, merge=False):
  """Raises a ValueError naming what in a packed `batch` does not fit.

  Shapes always; values only when they are concrete (on the host, not under
  `jit`): segment ids in 0..max_images, positions inside their grids, grids
  within `max_grid` (absolute factorized tables), and with `merge` whole
  images of even sides.
  """
  missing = [k for k in BATCH_KEYS if k not in batch]
  if missing:
    raise ValueError(f'The packed batch lacks {missing}; it needs '
                     f'{list(BATCH_KEYS)}.')
  shape = batch['patches'].shape
  if len(shape) != 3 or shape[-1] % (patch * patch):
    raise ValueError(f'patches must be (batch, tokens, {patch}*{patch}*'
                     f'channels) for patch size {patch}, got {tuple(shape)}.')
  for k in BATCH_KEYS[1:]:
    if tuple(batch[k].shape) != tuple(shape[:2]):
      raise ValueError(f'{k} must be {tuple(shape[:2])}, as the patches, '
                       f'got {tuple(batch[k].shape)}.')
  if any(isinstance(batch[k], jax.core.Tracer) for k in BATCH_KEYS[1:]):
    return
  seg, rows, cols, heights, widths = (np.asarray(batch[k])
                                      for k in BATCH_KEYS[1:])
  if seg.min() < 0 or seg.max() > max_images:
    raise ValueError(f'segment_ids must be in 0..max_images={max_images}, '
                     f'got {seg.min()}..{seg.max()}.')
  real = seg > 0
  if np.any(real & ((rows >= heights) | (cols >= widths) | (rows < 0) |
                    (cols < 0))):
    raise ValueError('Some tokens lie outside their grid: rows must be in '
                     '0..heights-1 and cols in 0..widths-1.')
  if max_grid is not None and np.any(real & ((heights > max_grid) |
                                             (widths > max_grid))):
    raise ValueError(f'An image grid of {heights.max()}x{widths.max()} '
                     f'patches exceeds max_grid={max_grid}.')
  if merge:
    _check_whole_even_images(seg, heights, widths)


def _check_whole_even_images(seg, heights, widths):
  """The patch merger's needs: each image even-sided and whole."""
  for b in range(seg.shape[0]):
    for k in np.unique(seg[b][seg[b] > 0]):
      at = seg[b] == k
      h, w = heights[b][at][0], widths[b][at][0]
      if h % 2 or w % 2 or at.sum() != h * w:
        raise ValueError(
            f'The patch merger needs whole images of even sides; image {k} '
            f'of sequence {b} has {at.sum()} tokens of a {h}x{w} grid.')


def segment_onehot(segment_ids, max_images):
  """(B, N, max_images) bool: token n belongs to image k + 1."""
  return segment_ids[..., None] == jnp.arange(1, max_images + 1)


def merge_groups(x):
  """(..., h, w, D) -> (..., h / 2, w / 2, 4 D): each 2x2 group of tokens
  concatenated in row-major order (0, 0), (0, 1), (1, 0), (1, 1)."""
  *lead, h, w, d = x.shape
  if h % 2 or w % 2:
    raise ValueError(f'The patch merger needs an even grid, got {h}x{w}.')
  x = x.reshape(*lead, h // 2, 2, w // 2, 2, d)
  return jnp.swapaxes(x, -4, -3).reshape(*lead, h // 2, w // 2, 4 * d)


def packed_merge_groups(x, segment_ids, rows, cols):
  """`merge_groups` on packed sequences of whole, even-sided images.

  x: (B, N, D). Returns (B, N // 4, 4 D) merged tokens and their (B, N // 4)
  segment ids (0: padding): in each sequence the images in the order of
  their top-left tokens, each image's groups in the order of theirs
  (row-major when the image is). Finds each group's tokens by position, so
  any order of the tokens of an image is fine.
  """
  n = x.shape[1]
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  parts = []
  for dr, dc in ((0, 0), (0, 1), (1, 0), (1, 1)):
    at = same & (rows[:, None, :] == rows[:, :, None] + dr) & (
        cols[:, None, :] == cols[:, :, None] + dc)
    parts.append(jnp.take_along_axis(
        x, jnp.argmax(at, axis=-1)[..., None], axis=1))
  groups = jnp.concatenate(parts, axis=-1)
  top_left = (segment_ids > 0) & (rows % 2 == 0) & (cols % 2 == 0)
  slot = jnp.where(top_left, jnp.cumsum(top_left, axis=1) - 1, n)
  batch = jnp.arange(x.shape[0])[:, None]
  merged = jnp.zeros((x.shape[0], n // 4, groups.shape[-1]), x.dtype)
  merged = merged.at[batch, slot].set(groups, mode='drop')
  ids = jnp.zeros((x.shape[0], n // 4), segment_ids.dtype)
  return merged, ids.at[batch, slot].set(segment_ids, mode='drop')


class PatchMerger(nn.Module):
  """MoonViT's patch merger with Kimi-VL's projector: a LayerNorm `pre_norm`
  on each token, 2x2 groups concatenated (`merge_groups`), then `linear_1`
  (4 D), exact GELU, `linear_2` (`out_dim`).

  Call it on an image's (..., h, w, D) tokens, or on packed (B, N, D)
  tokens with their segment_ids, rows and cols (`packed_merge_groups`,
  which returns the segment ids of the merged tokens too).
  """
  out_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, segment_ids=None, rows=None, cols=None):
    x = nn.LayerNorm(name='pre_norm', dtype=self.dtype)(x)
    if segment_ids is None:
      merged, ids = merge_groups(x), None
    else:
      merged, ids = packed_merge_groups(x, segment_ids, rows, cols)
    y = nn.Dense(merged.shape[-1], name='linear_1', dtype=self.dtype)(merged)
    y = nn.Dense(self.out_dim, name='linear_2', dtype=self.dtype)(
        nn.gelu(y, approximate=False))
    return y if ids is None else (y, ids)


class PatchEmbedding(nn.Module):
  """The ViT's patch embedding on flattened patches: a (p, p, C, D) kernel
  (a Conv's) and a bias, applied as one matmul."""
  features: int
  patch: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    channels = x.shape[-1] // (self.patch * self.patch)
    kernel = self.param('kernel', nn.initializers.lecun_normal(),
                        (self.patch, self.patch, channels, self.features))
    bias = self.param('bias', nn.initializers.zeros, (self.features,))
    kernel = kernel.reshape(-1, self.features).astype(self.dtype)
    return x.astype(self.dtype) @ kernel + bias.astype(self.dtype)


class FactorizedPosEmb(nn.Module):
  """NaViT's factorized learned embeddings: `pos_embedding_row` and
  `pos_embedding_col`, each (max_grid, D), added (`factorized_posemb`)."""
  max_grid: int
  fractional: bool = False
  posemb_init: Any = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, positions, width):
    row = self.param('pos_embedding_row', self.posemb_init,
                     (self.max_grid, width))
    col = self.param('pos_embedding_col', self.posemb_init,
                     (self.max_grid, width))
    return posemb.factorized_posemb(row, col, *positions,
                                        fractional=self.fractional)


class ResizedPosEmb(nn.Module):
  """The ViT's learned table `pos_embedding`, (1, G * G, D) for a G x G
  grid, resized bilinearly to each token's image grid
  (`posemb.resized_posemb`): SigLIP 2's NaFlex tower. The same parameter
  makes a `VisionTransformer` with `posemb_grid=(G, G)`, which resizes it
  as `jax.image.resize` does, so one checkpoint serves both.

  A stored table keeps its (square) size, whatever `grid`.
  """
  grid: int
  posemb_init: Any = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, positions, width):
    side = self.grid
    if self.has_variable('params', 'pos_embedding'):
      stored = self.get_variable('params', 'pos_embedding').shape[1]
      side = int(round(np.sqrt(stored)))
    table = self.param('pos_embedding', self.posemb_init,
                       (1, side * side, width))
    return posemb.resized_posemb(table.reshape(side, side, width), *positions)


class PackedEncoder(models_vit.Encoder):
  """The ViT's `Encoder` on packed sequences: position embedding from each
  token's place (`posemb` one of POSEMBS), blocks attending within each
  token's segment, final LayerNorm `encoder_norm`.

  Attributes (besides `Encoder`'s):
    max_grid: length of the factorized tables; side of the 'interp2d' and
      'learn_resized' grids.
  """
  max_grid: int = 64

  @nn.compact
  def __call__(self, x, positions, segment_ids, *, train):
    """Encodes (B, N, D) tokens at `positions` (rows, cols, heights, widths,
    each (B, N)); a token attends to those of its `segment_ids` (B, N)
    only (the kernels take the ids, the others `attention.segment_mask`)."""
    rope = None
    if self.posemb == 'rope2d':
      rope = models_vit.rope2d_angles(
          positions[0], positions[1],
          models_vit.rope_head_dim(x.shape[-1], self.num_heads))
    elif self.posemb == 'learn_resized':
      x = x + ResizedPosEmb(self.max_grid, name='posembed_input')(
          positions, x.shape[-1]).astype(x.dtype)
    elif self.posemb == 'interp2d':
      x = x + models_vit.Interp2DPosEmb(name='posembed_input')(
          positions, (self.max_grid, self.max_grid, x.shape[-1])
      ).astype(x.dtype)
    else:
      x = x + FactorizedPosEmb(
          self.max_grid, fractional=self.posemb == 'factorized_frac',
          name='posembed_input')(positions, x.shape[-1]).astype(x.dtype)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    x, _ = self._blocks(x, not train, None, None, rope=rope,
                        segment_ids=segment_ids)
    return nn.LayerNorm(name='encoder_norm', dtype=self.dtype)(x)


class NaViT(nn.Module):
  """Vision Transformer on packed sequences of images (module docstring).

  Attributes:
    num_classes: head size; 0 or None for no head (per-image features).
    patches: ConfigDict with `size`, the side of a (square) patch.
    hidden_size: token width D.
    transformer: ConfigDict of `Encoder` attributes (mlp_dim, num_heads,
      num_layers, dropout_rate, ...), without `posemb`.
    posemb: one of POSEMBS: 'factorized' (NaViT's row and column tables,
      absolute coordinates), 'factorized_frac' (the same at fractional
      coordinates floor(row / height * max_grid)), 'interp2d' (MoonViT's
      learned max_grid x max_grid grid, interpolated to each image's),
      'learn_resized' (SigLIP 2's NaFlex: the ViT's learned table of a
      max_grid x max_grid grid, resized bilinearly to each image's grid) or
      'rope2d' (2-D RoPE in every block, no parameters).
    max_grid: see `PackedEncoder`.
    pool: 'map' (a MAP probe per image, attending to its tokens) or 'gap'
      (mean of its tokens).
    max_images: images per sequence (the logits' second axis).
    merge_patches: return `PatchMerger`'s merged tokens instead of logits:
      (merged (B, N // 4, merge_dim), their segment ids (B, N // 4)), as
      `packed_merge_groups` lays them out; needs whole images of even
      sides (no token dropping).
    merge_dim: the merged tokens' width (default D).
    dtype: of the computation; parameters stay float32.
  """
  num_classes: Optional[int]
  patches: Any
  hidden_size: int
  transformer: Any
  posemb: str = 'factorized'
  max_grid: int = 64
  pool: str = 'map'
  max_images: int = 8
  merge_patches: bool = False
  merge_dim: Optional[int] = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, batch, *, train, with_tokens=False):
    """Logits (B, max_images, num_classes) of the packed `batch`, image k at
    index k - 1 (0 where a sequence has no image k); features (B,
    max_images, D) without a head. `with_tokens`: the pair (that, the
    encoded tokens (B, N, D) after the final norm), e.g. for a decoder."""
    self._check(batch)
    dtype = jnp.dtype(self.dtype)
    seg = jnp.asarray(batch['segment_ids'])
    positions = tuple(jnp.asarray(batch[k]) for k in POSITION_KEYS)
    x = PatchEmbedding(self.hidden_size, self._patch(), dtype=dtype,
                       name='embedding')(jnp.asarray(batch['patches']))
    x = PackedEncoder(name='Transformer', posemb=self.posemb,
                      max_grid=self.max_grid, dtype=dtype,
                      **self.transformer)(x, positions, seg, train=train)
    if self.merge_patches:
      return PatchMerger(self.merge_dim or self.hidden_size, dtype=dtype,
                         name='patch_merger')(x, seg, *positions[:2])
    onehot = segment_onehot(seg, self.max_images)
    tokens, x = x, self._pool(x, onehot, dtype)
    if self.num_classes:
      x = nn.Dense(self.num_classes, name='head', dtype=jnp.float32,
                   kernel_init=nn.initializers.zeros)(x)
    out = jnp.where(jnp.any(onehot, axis=1)[..., None], x, 0.)
    return (out, tokens) if with_tokens else out

  def _pool(self, x, onehot, dtype):
    """(B, max_images, D): each image's tokens pooled."""
    if self.pool == 'gap':
      weights = onehot / jnp.maximum(onehot.sum(axis=1, keepdims=True), 1)
      return jnp.einsum('bnd,bnk->bkd', x.astype(jnp.float32), weights,
                        precision=jax.lax.Precision.HIGHEST)
    return models_vit.MAPHead(
        num_heads=self.transformer['num_heads'],
        mlp_dim=self.transformer['mlp_dim'],
        gelu_approximate=self.transformer.get('gelu_approximate', True),
        dtype=dtype)(x, mask=jnp.swapaxes(onehot, 1, 2))

  def _patch(self):
    ph, pw = models_vit.patch_size(self.patches)
    if ph != pw:
      raise ValueError(f'NaViT needs square patches, got {ph}x{pw}.')
    return ph

  def _check(self, batch):
    """Options and the batch, checked before anything is traced."""
    for what, value, choices in (('posemb', self.posemb, POSEMBS),
                                 ('pool', self.pool, POOLS)):
      if value not in choices:
        raise ValueError(f'Unknown {what} {value!r}; expected one of '
                         f'{choices}.')
    if 'posemb' in self.transformer:
      raise ValueError('Give NaViT its posemb, not transformer.posemb.')
    check_batch(batch, patch=self._patch(), max_images=self.max_images,
                max_grid=self.max_grid if self.posemb == 'factorized' else None,
                merge=self.merge_patches)
