"""NaViT's Patch n' Pack (Dehghani et al., 2023), on the host in numpy.

Images of any size and aspect ratio become patch tokens; a greedy packer
fills sequences of `max_tokens` with whole images, at most `max_images`
each. A packed batch of B sequences of N tokens is a dict:

  patches      float32 (B, N, p*p*C)  each patch's pixels in (p, p, C) order
  segment_ids  int32 (B, N)   1..max_images: the token's image; 0: padding
  rows, cols   int32 (B, N)   the token's patch coordinates in its image
  heights, widths int32 (B, N)  its image's grid (h, w) in patches
  labels       int32 (B, max_images)  image k's label at k - 1; -1: none

Coordinates and grids are those of the image before token dropping. In
training, every image's recipe (its grid, crop and token-drop rate) is a
pure function of (seed, position in the stream): the packing plan of any
step can be recomputed from the seed alone, without reading an image,
which makes resuming exact.
"""

import dataclasses
from typing import Iterator, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

KEYS = ('patches', 'segment_ids', 'rows', 'cols', 'heights', 'widths')
_BLOCK = 1024  # recipes are drawn this many positions at a time


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Per-image training sizes.

  patch: the patch side (px). side_range: (lo, hi) px of the longer side;
  the grid's longer side is drawn uniformly from ceil(lo/p)..floor(hi/p).
  aspect_range: (lo, hi) of width / height, drawn log-uniformly; the image
  is cropped to the largest box of that aspect ratio at a random place.
  drop_rate: the fraction of tokens dropped, fixed, or a (lo, hi) range
  drawn uniformly per image. flip: a random horizontal flip.
  """
  patch: int
  side_range: Tuple[int, int]
  aspect_range: Tuple[float, float] = (1.0, 1.0)
  drop_rate: object = 0.0
  flip: bool = False

  def __post_init__(self):
    lo, hi = self.grid_range
    if lo < 1 or hi < lo:
      raise ValueError(f'side_range={tuple(self.side_range)} holds no '
                       f'multiple of the patch size {self.patch}.')
    a_lo, a_hi = self.aspect_range
    if not 0 < a_lo <= a_hi:
      raise ValueError(f'aspect_range={tuple(self.aspect_range)}: expected '
                       '0 < lo <= hi.')
    r_lo, r_hi = self.rate_range
    if not 0 <= r_lo <= r_hi < 1:
      raise ValueError(f'drop_rate={self.drop_rate!r}: expected rates in '
                       '[0, 1).')

  @property
  def grid_range(self) -> Tuple[int, int]:
    lo, hi = self.side_range
    return -(-int(lo) // self.patch), int(hi) // self.patch

  @property
  def rate_range(self) -> Tuple[float, float]:
    if np.ndim(self.drop_rate) == 0:
      return float(self.drop_rate), float(self.drop_rate)
    lo, hi = self.drop_rate
    return float(lo), float(hi)

  @property
  def max_tokens_per_image(self) -> int:
    return self.grid_range[1]**2


def grid_of(side: int, aspect, patch: int):
  """(h, w) in patches: the longer side `side // patch` patches, the shorter
  as `aspect` (width / height) says, rounded, at least 1."""
  long = np.asarray(side) // patch
  aspect = np.asarray(aspect, np.float64)
  short = np.maximum(1, np.floor(long / np.maximum(aspect, 1 / aspect) + 0.5)
                     ).astype(np.int64)
  wide = aspect >= 1
  return np.where(wide, short, long), np.where(wide, long, short)


def naflex_grid(height: int, width: int, patch: int, max_patches: int):
  """SigLIP 2's NaFlex size: the (h, w) patch grid an image of (height,
  width) pixels is resized to, its aspect ratio kept within a patch, at most
  `max_patches` patches, at least one per side.

  The largest scale s (within 1e-5) whose sides ceil(side * s / patch)
  patches fit, found by bisection as transformers' Siglip2ImageProcessor
  finds it, so that both resize every image to the same grid.
  """
  if min(height, width, patch, max_patches) < 1:
    raise ValueError(f'naflex_grid needs positive sizes, got image {height}x'
                     f'{width}, patch {patch}, max_patches {max_patches}.')

  def grid(scale):
    return tuple(max(1, int(np.ceil(side * scale / patch)))
                 for side in (height, width))

  low, high = 1e-6, 100.
  while high - low >= 1e-5:
    mid = (low + high) / 2
    h, w = grid(mid)
    low, high = (mid, high) if h * w <= max_patches else (low, mid)
  return grid(low)


def naflex_example(image, label: int, patch: int, max_patches: int, *,
                   mean=None, std=None) -> dict:
  """An image (uint8) as the tokens of its `naflex_grid`, aspect kept."""
  grid = naflex_grid(*image.shape[:2], patch, max_patches)
  return example(image, label, *grid, patch, mean=mean, std=std)


def num_kept(num_tokens, rate):
  """Tokens an image keeps at drop `rate`: floor(n (1 - rate)), at least 1."""
  kept = np.floor(np.asarray(num_tokens) * (1 - np.asarray(rate)) + 1e-9)
  return np.maximum(1, kept).astype(np.int64)


def recipes(seed: int, start: int, stop: int, sampling: Sampling,
            stream: int = 0) -> dict:
  """The recipes of positions [start, stop) of `stream`: arrays `height`,
  `width` (grid), `aspect`, `top`, `left` (crop offsets as fractions of the
  free room), `flip`, `rate` and `tokens` (kept). A pure function of the seed."""
  first, last = start // _BLOCK, -(-stop // _BLOCK)
  parts = [_block(seed, stream, b, sampling) for b in range(first, last)]
  cut = start - first * _BLOCK
  return {k: np.concatenate([p[k] for p in parts])[cut:cut + stop - start]
          for k in parts[0]}


def _block(seed: int, stream: int, block: int, sampling: Sampling) -> dict:
  rng = np.random.default_rng([seed, stream, block])
  g_lo, g_hi = sampling.grid_range
  a_lo, a_hi = np.log(sampling.aspect_range)
  out = {'aspect': np.exp(rng.uniform(a_lo, a_hi, _BLOCK)),
         'long': rng.integers(g_lo, g_hi + 1, _BLOCK),
         'top': rng.uniform(size=_BLOCK), 'left': rng.uniform(size=_BLOCK),
         'rate': rng.uniform(*sampling.rate_range, size=_BLOCK),
         'flip': (rng.uniform(size=_BLOCK) < 0.5) & sampling.flip}
  out['height'], out['width'] = grid_of(out.pop('long') * sampling.patch,
                                        out['aspect'], sampling.patch)
  out['tokens'] = num_kept(out['height'] * out['width'], out['rate'])
  return out


class Recipes:
  """`recipes` by stream position, drawn a block at a time and cached."""

  def __init__(self, seed: int, sampling: Sampling, stream: int = 0):
    self.seed, self.sampling, self.stream = seed, sampling, stream
    self._cache = {}

  def _get_block(self, block: int) -> dict:
    if block not in self._cache:
      if len(self._cache) > 4:  # the stream moves forward
        self._cache.pop(min(self._cache))
      self._cache[block] = _block(self.seed, self.stream, block,
                                  self.sampling)
    return self._cache[block]

  def __getitem__(self, position: int) -> dict:
    rows = self._get_block(position // _BLOCK)
    return {k: v[position % _BLOCK] for k, v in rows.items()}

  def token_counts(self, start: int = 0):
    """Yields (position, tokens kept) from `start` on, forever."""
    block = start // _BLOCK
    while True:
      tokens = self._get_block(block)['tokens']
      for i in range(max(start - block * _BLOCK, 0), _BLOCK):
        yield block * _BLOCK + i, int(tokens[i])
      block += 1


def crop_box(shape, aspect: float, top: float, left: float):
  """(y, x, h, w): the largest box of `aspect` (width / height) in an image
  of `shape` (H, W), at fractions `top`, `left` of the room left over."""
  height, width = shape[:2]
  if width / height > aspect:
    h, w = height, max(1, min(width, int(round(height * aspect))))
  else:
    h, w = max(1, min(height, int(round(width / aspect)))), width
  return (min(height - h, int(top * (height - h + 1))),
          min(width - w, int(left * (width - w + 1))), h, w)


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """uint8 (H, W, C) -> (height, width, C), PIL's bilinear (antialiased
  when shrinking)."""
  if image.shape[:2] == (height, width):
    return image
  image = np.ascontiguousarray(image)
  channels = image.shape[-1]
  pil = Image.fromarray(image[..., 0] if channels == 1 else image)
  out = np.asarray(pil.resize((width, height), Image.BILINEAR))
  return out.reshape(height, width, channels)


def normalize(image: np.ndarray, mean=None, std=None) -> np.ndarray:
  """uint8 -> float32: [-1, 1], or (x - mean) / std of pixels in [0, 1]
  (the input pipeline's `pp.mean`, `pp.std`)."""
  x = image.astype(np.float32) / 127.5 - 1
  if mean is None and std is None:
    return x
  mean = np.asarray(mean if mean is not None else (0.5,) * 3, np.float32)
  std = np.asarray(std if std is not None else (0.5,) * 3, np.float32)
  return ((x + 1) / 2 - mean[:x.shape[-1]]) / std[:x.shape[-1]]


def patchify(image: np.ndarray, patch: int):
  """(H, W, C) -> (tokens (h*w, p*p*C) in row-major order, rows, cols)."""
  height, width, channels = image.shape
  h, w = height // patch, width // patch
  if (h * patch, w * patch) != (height, width) or not h * w:
    raise ValueError(f'Image {image.shape[:2]} is not a whole number of '
                     f'{patch}x{patch} patches.')
  tokens = image.reshape(h, patch, w, patch, channels).transpose(0, 2, 1, 3, 4)
  index = np.arange(h * w)
  return (tokens.reshape(h * w, patch * patch * channels), index // w,
          index % w)


def example(image, label: int, height: int, width: int, patch: int, *,
            keep: Optional[np.ndarray] = None, mean=None, std=None) -> dict:
  """An image (uint8, already cropped) as tokens on a (height, width)
  grid; `keep`: the indices of the tokens kept (default all)."""
  pixels = normalize(resize(image, height * patch, width * patch), mean, std)
  tokens, rows, cols = patchify(pixels, patch)
  if keep is not None:
    tokens, rows, cols = tokens[keep], rows[keep], cols[keep]
  return {'patches': tokens, 'rows': rows, 'cols': cols, 'height': height,
          'width': width, 'label': int(label)}


def drop_tokens(rng: np.random.Generator, num_tokens: int, kept: int):
  """NaViT's token dropping: `kept` random token indices, in order."""
  return np.sort(rng.permutation(num_tokens)[:kept])


def training_example(image, label, recipe: dict, sampling: Sampling, *,
                     seed: int, position: int, mean=None, std=None) -> dict:
  """The training example at stream `position` from its `recipe` (a row of
  `recipes`): cropped, resized, its tokens dropped."""
  y, x, h, w = crop_box(image.shape, recipe['aspect'], recipe['top'],
                        recipe['left'])
  grid = int(recipe['height']), int(recipe['width'])
  keep = None
  if recipe['tokens'] < grid[0] * grid[1]:
    rng = np.random.default_rng([seed, position, 1])
    keep = drop_tokens(rng, grid[0] * grid[1], int(recipe['tokens']))
  crop = image[y:y + h, x:x + w]
  return example(crop[:, ::-1] if recipe['flip'] else crop, label, *grid,
                 sampling.patch,
                 keep=keep, mean=mean, std=std)


class Packer:
  """Greedy first-fit over a window of pending images.

  Each sequence takes, in stream order, every pending image that still fits
  (tokens and image count), topping the window up from the stream after
  each one taken: `window` 1 is next-fit, larger windows let small images
  fill the gaps. The oldest pending image always comes first, so none
  waits forever. `items` yields (key, tokens); `pulled` counts those read.
  """

  def __init__(self, items: Iterator[Tuple[object, int]], max_tokens: int,
               max_images: int, window: int = 64):
    self.items, self.max_tokens, self.max_images = items, max_tokens, max_images
    self.window, self.pending, self.pulled = window, [], 0

  def _refill(self):
    while len(self.pending) < self.window:
      item = next(self.items, None)
      if item is None:
        return
      self.pulled += 1
      if item[1] > self.max_tokens:
        raise ValueError(f'An image of {item[1]} tokens does not fit in '
                         f'max_tokens={self.max_tokens}.')
      self.pending.append(item)

  def next_sequence(self) -> Optional[list]:
    """The keys of the next sequence, or None when nothing is left."""
    self._refill()
    if not self.pending:
      return None
    room, taken, i = self.max_tokens, [], 0
    while i < len(self.pending) and len(taken) < self.max_images:
      key, tokens = self.pending[i]
      if tokens <= room:
        taken.append(key)
        room -= tokens
        del self.pending[i]
        self._refill()
      else:
        i += 1
    return taken


def pack(sequences: Sequence[Sequence[dict]], max_tokens: int,
         max_images: int, patch_dim: int) -> dict:
  """Lists of examples (one list per sequence) -> a packed batch."""
  batch_size = len(sequences)
  out = {k: np.zeros((batch_size, max_tokens), np.int32) for k in KEYS[1:]}
  out['patches'] = np.zeros((batch_size, max_tokens, patch_dim), np.float32)
  out['labels'] = np.full((batch_size, max_images), -1, np.int32)
  for b, images in enumerate(sequences):
    if len(images) > max_images:
      raise ValueError(f'{len(images)} images in a sequence; max_images='
                       f'{max_images}.')
    start = 0
    for k, ex in enumerate(images):
      stop = start + len(ex['rows'])
      if stop > max_tokens:
        raise ValueError(f'Sequence {b} needs more than max_tokens='
                         f'{max_tokens} tokens.')
      out['patches'][b, start:stop] = ex['patches']
      out['segment_ids'][b, start:stop] = k + 1
      out['rows'][b, start:stop] = ex['rows']
      out['cols'][b, start:stop] = ex['cols']
      out['heights'][b, start:stop] = ex['height']
      out['widths'][b, start:stop] = ex['width']
      out['labels'][b, k] = ex['label']
      start = stop
  return out


def efficiency(segment_ids) -> float:
  """Packing efficiency: real tokens / all tokens."""
  return float(np.mean(np.asarray(segment_ids) > 0))


def naflex_batch(pixel_values, pixel_attention_mask, spatial_shapes) -> dict:
  """transformers' SigLIP 2 inputs (`Siglip2ImageProcessor`'s) as a packed
  batch (`KEYS`) of one image a sequence, for NaViT (`max_images=1`).

  pixel_values (B, N, p*p*C): each image's h * w patches in row-major
  order, flattened in (p, p, C) order as `patchify`'s, then padding;
  pixel_attention_mask (B, N): 1 on the patches, 0 on the padding;
  spatial_shapes (B, 2): each image's grid (h, w).
  """
  patches = np.asarray(pixel_values, np.float32)
  mask = np.asarray(pixel_attention_mask)
  shapes = np.asarray(spatial_shapes, np.int64)
  if patches.ndim != 3 or mask.shape != patches.shape[:2] or (
      shapes.shape != (len(patches), 2)):
    raise ValueError(
        f'Expected pixel_values (B, N, p*p*C), pixel_attention_mask (B, N) '
        f'and spatial_shapes (B, 2); got {patches.shape}, {mask.shape} and '
        f'{shapes.shape}.')
  index = np.arange(patches.shape[1])
  real = index < np.prod(shapes, axis=1)[:, None]
  if not np.array_equal(mask != 0, real):
    raise ValueError('pixel_attention_mask must mark the first h * w tokens '
                     'of each row (its spatial_shapes), as transformers\' '
                     'Siglip2ImageProcessor pads.')
  width = np.maximum(shapes[:, 1:], 1)
  out = {'patches': patches, 'segment_ids': real}
  out.update(rows=index // width, cols=index % width,
             heights=np.broadcast_to(shapes[:, :1], real.shape),
             widths=np.broadcast_to(shapes[:, 1:], real.shape))
  return {k: np.where(real, v, 0).astype(np.int32) if k != 'patches' else v
          for k, v in out.items()}
