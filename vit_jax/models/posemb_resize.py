"""Resizing position embeddings to another patch grid (paper, Sec. 3.2).

Fine-tuning at a higher resolution keeps the patch size, so the grid of
patches grows; the learned position embeddings are resized to it as an image
would be. `checkpoint.load_pretrained` does this on loading, with the
method of the weights' source: 'bicubic' for Google's checkpoints,
'bicubic_antialias' (timm's `resample_abs_pos_embed`) for timm's. Tables of
relative positions (BEiT's, Swin's) are resized as timm resizes them
(`resize_relative_table`).
"""

import math
from typing import Optional, Sequence, Union

import jax
import numpy as np
import scipy.ndimage

RESIZE_METHODS = ('bicubic', 'bicubic_antialias', 'bicubic_torch',
                  'bilinear_torch', 'linear_zoom')


def square_side(n: int, what: str) -> int:
  side = int(round(np.sqrt(max(n, 0))))
  if n < 1 or side * side != n:
    raise ValueError(f'{what}: {n} tokens are not a square grid; give the '
                     '(height, width) grid explicitly.')
  return side


def check_method(method: str) -> None:
  if method not in RESIZE_METHODS:
    raise ValueError(f'Unknown resize method {method!r}; expected one of '
                     f'{RESIZE_METHODS}.')


def resize_posemb_grid(posemb,
                       *,
                       old_grid: Optional[Sequence[int]] = None,
                       new_grid: Sequence[int],
                       has_class_token: Union[bool, int],
                       method: str = 'bicubic') -> np.ndarray:
  """Resizes a (1, [1 +] tokens, D) position embedding to another grid.

  A grid is 2-D, (h, w) patches in row-major order, or 1-D, (n,) entries
  (the row or column table of posemb='learn2d'); `old_grid` None is a square
  (or 1-D) one. Both grids cover the same image, each entry at the centre of
  its cell: entry i of n at (i + 0.5) / n. The class token, if any, is first
  and kept as is; an int `has_class_token` keeps that many leading entries
  (2: DeiT's class and distillation tokens). `method`: 'bicubic',
  `jax.image.resize(..., 'cubic', antialias=False)`; 'bicubic_antialias',
  torch's `interpolate(mode='bicubic', antialias=True)` as timm resizes
  (`antialias_weights`; growing, the two agree); 'bicubic_torch', torch's
  `interpolate(mode='bicubic')` without antialias, as transformers' DINOv2
  resizes its table to each input (`torch_bicubic_weights`);
  'bilinear_torch', torch's `interpolate(mode='bilinear')`, as DPT's ViT
  resizes its table (`torch_linear_weights`); or 'linear_zoom', the
  original's `scipy.ndimage.zoom(..., order=1)`, which aligns the end
  entries instead.
  """
  check_method(method)
  posemb = np.asarray(posemb)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise ValueError(f'Expected a (1, tokens, width) position embedding, got '
                     f'{posemb.shape}.')
  n_cls = int(has_class_token)
  cls, tokens = posemb[:, :n_cls], posemb[0, n_cls:]
  new_grid = tuple(int(n) for n in new_grid)
  if old_grid is None:
    old_grid = ((len(tokens),) if len(new_grid) == 1 else
                (square_side(len(tokens), 'Position embedding'),) * 2)
  old_grid = tuple(int(n) for n in old_grid)
  if np.prod(old_grid) != len(tokens):
    raise ValueError(f'old_grid {old_grid} does not match the {len(tokens)} '
                     'grid tokens of the position embedding.')
  if len(new_grid) != len(old_grid) or min(new_grid) < 1:
    raise ValueError(f'new_grid must be positive and have the {len(old_grid)}'
                     f' axes of old_grid {old_grid}, got {new_grid}.')
  if old_grid == new_grid:
    return posemb
  grid = tokens.reshape(*old_grid, -1)
  if method == 'bicubic':
    new = jax.image.resize(grid, (*new_grid, grid.shape[-1]), 'cubic',
                           antialias=False)
  elif method in ('bicubic_antialias', 'bicubic_torch', 'bilinear_torch'):
    weights = {'bicubic_antialias': antialias_weights,
               'bicubic_torch': torch_bicubic_weights,
               'bilinear_torch': torch_linear_weights}[method]
    new = grid.astype(np.float64)
    for axis, (old, size) in enumerate(zip(old_grid, new_grid)):
      new = np.moveaxis(np.tensordot(weights(old, size), new,
                                     axes=(1, axis)), 0, axis)
  else:
    new = scipy.ndimage.zoom(
        grid, [n / o for n, o in zip(new_grid, old_grid)] + [1], order=1)
  new = np.asarray(new, posemb.dtype).reshape(1, -1, posemb.shape[-1])
  return np.concatenate([cls, new], axis=1)


def _keys_cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
  """Keys' cubic convolution kernel, zero from |x| = 2 on."""
  x = np.abs(x)
  near = ((a + 2) * x - (a + 3)) * x * x + 1
  far = (((x - 5) * x + 8) * x - 4) * a
  return np.where(x < 1, near, np.where(x < 2, far, 0.))


def antialias_weights(old: int, new: int) -> np.ndarray:
  """(new, old) float64 weights of torch's antialiased bicubic on one axis.

  PIL's resampling, which torch follows with antialias=True (as found by
  resizing unit impulses with torch): Keys' kernel with a = -0.5 (torch's
  plain bicubic has -0.75), stretched by old/new when shrinking so that it
  averages over each output cell; the weights of the entries inside the
  grid are divided by their sum, so the borders are renormalized, not
  clamped. `jax.image.resize(antialias=True)` is the same, in float32 only;
  float64 here keeps timm's tables to float32 rounding.
  """
  scale = old / new
  centre = scale * (np.arange(new) + 0.5)  # in input cells
  offset = np.arange(old)[None, :] + 0.5 - centre[:, None]
  weights = _keys_cubic(offset / max(scale, 1.))
  return weights / weights.sum(axis=1, keepdims=True)


def torch_bicubic_weights(old: int, new: int) -> np.ndarray:
  """(new, old) float64 weights of torch's bicubic on one axis, without
  antialias (`align_corners=False`): Keys' kernel with a = -0.75 at the
  4 entries around (i + 0.5) * old / new - 0.5, never stretched; entries
  past the border repeat the border entry (they are clamped)."""
  source = (np.arange(new) + 0.5) * (old / new) - 0.5
  first = np.floor(source).astype(int) - 1
  weights = np.zeros((new, old))
  for tap in range(4):
    index = first + tap
    np.add.at(weights, (np.arange(new), np.clip(index, 0, old - 1)),
              _keys_cubic(source - index, a=-0.75))
  return weights


def torch_linear_weights(old: int, new: int,
                         align_corners: bool = False) -> np.ndarray:
  """(new, old) float64 weights of torch's linear interpolation on one
  axis (`interpolate(mode='bilinear')`, no antialias): at (i + 0.5) * old
  / new - 0.5, clamped at 0 (`align_corners=False`), or at i * (old - 1) /
  (new - 1) (True)."""
  i = np.arange(new, dtype=np.float64)
  if align_corners:
    source = i * ((old - 1) / (new - 1)) if new > 1 else 0 * i
  else:
    source = np.maximum((i + 0.5) * (old / new) - 0.5, 0.)
  low = np.minimum(np.floor(source).astype(int), old - 1)
  high = np.minimum(low + 1, old - 1)
  weights = np.zeros((new, old))
  np.add.at(weights, (np.arange(new), low), 1 - (source - low))
  np.add.at(weights, (np.arange(new), high), source - low)
  return weights


def interpolate_posembed(posemb, num_tokens: int, has_class_token: bool,
                         method: str = 'linear_zoom') -> np.ndarray:
  """Resizes a square-grid (1, N, D) position embedding to `num_tokens`:
  the original's function, by default with its scipy zoom.

  The class token, if any, counts in both N and `num_tokens`; see
  `resize_posemb_grid`.
  """
  new = square_side(num_tokens - int(has_class_token), 'Target')
  return resize_posemb_grid(posemb, new_grid=(new, new),
                            has_class_token=has_class_token, method=method)


def _geometric_offsets(src: int, dst: int) -> np.ndarray:
  """Where the `src` offsets of a table sit when stretched over `dst`:
  steps growing by a ratio q found by bisection, as timm's `_calc`."""
  left, right = 1.01, 1.5
  while right - left > 1e-6:
    q = (left + right) / 2.
    if (1. - q**(src // 2)) / (1. - q) > dst // 2:
      right = q
    else:
      left = q
  steps = np.cumsum([1.] + [q**(i + 1) for i in range(src // 2 - 1)])
  return np.concatenate([-steps[::-1], [0.], steps])


def _linear_weights(points: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """(targets, points) weights of 1-D linear interpolation, constant past
  the ends, as timm's RegularGridInterpolator."""
  right = np.minimum(np.searchsorted(points, targets), len(points) - 1)
  left = np.clip(right - 1, 0, len(points) - 1)
  to_left = np.maximum(targets - points[left], 0.)
  to_right = np.maximum(points[right] - targets, 0.)
  both = (to_left == 0) & (to_right == 0)
  to_left[both] = to_right[both] = 1.
  weights = np.zeros((len(targets), len(points)))
  rows = np.arange(len(targets))
  np.add.at(weights, (rows, left), to_right / (to_left + to_right))
  np.add.at(weights, (rows, right), to_left / (to_left + to_right))
  return weights


def resize_relative_table(table, new_grid: Sequence[int],
                          old_grid: Optional[Sequence[int]] = None,
                          extra: int = 0) -> np.ndarray:
  """A table of relative positions, (..., (2h - 1)(2w - 1) + extra, heads)
  (rows: row-major offsets, then `extra` rows of their own, as BEiT's class
  token's 3), resized from `old_grid` (h, w) to `new_grid`, as timm's
  `resize_rel_pos_bias_table` does (without scipy, its default): each
  axis' offsets put at steps growing geometrically over the new span,
  linear interpolation between them, constant past the ends; the extra
  rows kept. `old_grid` None: square, as timm assumes for a checkpoint
  (else the new grid, if the rows are as many). Leading axes (blocks
  stacked by `scan`) are resized alike."""
  table = np.asarray(table)
  rows = table.shape[-2] - extra
  new_span = tuple(2 * int(n) - 1 for n in new_grid)
  if old_grid is not None:
    old_span = tuple(2 * int(n) - 1 for n in old_grid)
  elif math.isqrt(rows)**2 == rows:
    old_span = (math.isqrt(rows),) * 2
  elif rows == new_span[0] * new_span[1]:
    old_span = new_span
  else:
    raise ValueError(f'A table of {rows} offsets is not of a square grid: '
                     'give its grid.')
  if old_span[0] * old_span[1] != rows:
    raise ValueError(f'A table of {rows} offsets is not of the grid '
                     f'{tuple(old_grid)}.')
  if old_span == new_span:
    return table
  wy, wx = (_linear_weights(_geometric_offsets(s, d), np.arange(d) - d // 2)
            for s, d in zip(old_span, new_span))
  grid = table[..., :rows, :].reshape(
      *table.shape[:-2], *old_span, table.shape[-1]).astype(np.float64)
  new = np.einsum('ys,xt,...sth->...yxh', wy, wx, grid).reshape(
      *table.shape[:-2], -1, table.shape[-1])
  return np.concatenate([new.astype(table.dtype), table[..., rows:, :]],
                        axis=-2)
