"""FlexiViT (Beyer et al., CVPR 2023): one ViT for every patch size.

The parameters keep one shape (an ordinary ViT's `.npz`); at a call the
patch embedding kernel is PI-resized to the patch size asked for and the
learned position table is resized bilinearly to the new token grid, as
big_vision's `models/proj/flexi/vit.py` does. `VisionTransformer` takes
`patch_size=` at its call and `posemb_grid` as a field (docs/flexivit.md).
"""

import functools
from typing import Any, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models.posemb import pad_prefix

Pair = Union[int, Sequence[int]]


def pair(size: Pair) -> Tuple[int, int]:
  """(height, width) of an int or a pair."""
  h, w = (size, size) if isinstance(size, int) else tuple(size)
  return int(h), int(w)


@functools.lru_cache(maxsize=None)
def resize_matrix(old: int, new: int) -> np.ndarray:
  """(new, old) float64 matrix B of `jax.image.resize`'s bilinear resize
  (no antialias) along one axis: resize(x) = B x. Column j resizes the
  j-th basis vector, as big_vision builds it."""
  with jax.ensure_compile_time_eval():  # constants, even under a jit
    basis = jnp.eye(old, dtype=jnp.float32)
    columns = jax.vmap(lambda e: jax.image.resize(
        e, (new,), 'bilinear', antialias=False))(basis)
  return np.asarray(columns, np.float64).T


@functools.lru_cache(maxsize=None)
def _pinv_transpose(old: int, new: int) -> np.ndarray:
  """pinv(B^T), (new, old) float32, for B = `resize_matrix(old, new)`."""
  return np.linalg.pinv(resize_matrix(old, new).T).astype(np.float32)


def pi_resize_patch_embed(kernel, new_patch: Pair):
  """A (ph, pw, C_in, D) patch embedding kernel PI-resized to `new_patch`.

  The new kernel w' = pinv(B^T) w, B the bilinear resize of a patch, so
  that <x, w> = <resize(x), w'> for every patch x: exactly when growing,
  in least squares when shrinking. The 2-D resize is separable, B = B_h
  (x) B_w, and so is its pseudo-inverse: one matrix per axis. The same
  size gives `kernel` itself.
  """
  new_h, new_w = pair(new_patch)
  old_h, old_w = kernel.shape[:2]
  if (old_h, old_w) == (new_h, new_w):
    return kernel
  rows, cols = _pinv_transpose(old_h, new_h), _pinv_transpose(old_w, new_w)
  # HIGHEST: a TPU's default bfloat16 passes would blur the exact identity.
  return jnp.einsum('ih,jw,hwcd->ijcd', rows, cols, kernel,
                    precision=jax.lax.Precision.HIGHEST).astype(kernel.dtype)


class PatchEmbed(nn.Module):
  """The patch embedding `embedding` at any patch size.

  Its parameters are `nn.Conv`'s, `kernel` (*patch, C_in, D) and `bias`
  (unless `use_bias` is False),
  with the same initializers; a call at another patch size PI-resizes the
  kernel (`pi_resize_patch_embed`).

  Attributes:
    features: D, the token width.
    patch: the stored kernel's (height, width).
  """
  features: int
  patch: Tuple[int, int]
  use_bias: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images, new_patch: Pair):
    new_patch = pair(new_patch)
    kernel = self.param('kernel', nn.initializers.lecun_normal(),
                        (*self.patch, images.shape[-1], self.features))
    bias = (self.param('bias', nn.initializers.zeros, (self.features,))
            if self.use_bias else jnp.zeros((self.features,)))
    kernel = pi_resize_patch_embed(kernel, new_patch)
    images, kernel, bias = nn.dtypes.promote_dtype(images, kernel, bias,
                                                   dtype=self.dtype)
    # Patches times the kernel, as the strided conv computes them: a conv's
    # kernel gradient inside `lax.switch` (the training step) is 20x slower
    # on XLA:CPU than this dot's.
    n, h, w, c = images.shape
    (ph, pw), (gh, gw) = new_patch, (h // new_patch[0], w // new_patch[1])
    patches = images[:, :gh * ph, :gw * pw].reshape(n, gh, ph, gw, pw, c)
    return jnp.einsum('nhpwqc,pqcd->nhwd', patches, kernel) + bias


def resize_posemb(table, old_grid, new_grid, prefix: int):
  """A (1, prefix + h * w, D) table resized to (1, prefix + h' * w', D):
  the grid part bilinearly (`jax.image.resize`, antialiased when shrinking,
  as big_vision's flexi ViT), the `prefix` entries kept."""
  old_grid, new_grid = pair(old_grid), pair(new_grid)
  if old_grid == new_grid:
    return table
  d = table.shape[-1]
  grid = table[0, prefix:].reshape(*old_grid, d)
  grid = jax.image.resize(grid, (*new_grid, d), 'bilinear')
  return jnp.concatenate(
      [table[:, :prefix], grid.reshape(1, -1, d).astype(table.dtype)], axis=1)


class ResizedPositionEmbs(nn.Module):
  """A learned table `pos_embedding`, resized to the tokens' grid at every
  call (`resize_posemb`): the 'learn' table of a FlexiViT.

  Attributes:
    grid: the (height, width) the table is made at; a stored table of
      another size is taken as square (an ordinary ViT's).
    with_prefix: the table has an entry for each prefix (class) token
      before the grid; else the prefix tokens get none.
  """
  grid: Tuple[int, int]
  with_prefix: bool = True
  posemb_init: Any = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, x, grid):
    prefix = x.shape[1] - grid[0] * grid[1]
    entries = prefix if self.with_prefix else 0
    h, w = pair(self.grid)
    if self.has_variable('params', 'pos_embedding'):
      stored = self.get_variable('params', 'pos_embedding').shape[1] - entries
      if stored != h * w:
        h = w = _square_side(stored)
    table = self.param('pos_embedding', self.posemb_init,
                       (1, entries + h * w, x.shape[-1]))
    pe = resize_posemb(table, (h, w), grid, entries)
    return x + pad_prefix(pe, prefix - entries).astype(x.dtype)


def _square_side(n: int) -> int:
  side = int(round(np.sqrt(n)))
  if side * side != n:
    raise ValueError(f'The position table has {n} grid entries, not a '
                     'square: set the model\'s posemb_grid to its (h, w).')
  return side


def table_grid(posemb_grid: Optional[Pair], grid,
               new_patch: Optional[Pair]) -> Optional[Tuple[int, int]]:
  """The grid to make a resized 'learn' table at (`ResizedPositionEmbs`), or
  None for the ordinary table: `posemb_grid` if set, else at a `new_patch`
  the tokens' `grid`."""
  if posemb_grid is not None:
    return pair(posemb_grid)
  return None if new_patch is None else tuple(grid)
