"""InternVL's dynamic tiling (Chen et al., 2024, "How far are we to
GPT-4V?"): an image cut into a grid of tiles whose aspect ratio is the
closest to the image's, plus a thumbnail of the whole image.

The grids hold `min_tiles` to `max_tiles` tiles, in InternVL's order (by
tile count, then columns); on a tie in aspect ratio the later grid wins
while the image's area exceeds half of that grid's (transformers'
`get_optimal_tiled_canvas`). The image is resized (bicubic, antialiased,
as PIL) to the grid's size and cut into tiles, row by row; with more than
one tile a thumbnail (the whole image at one tile's size) follows.

A batch keeps one shape: every image gets `slots(max_tiles)` tiles, the
unused ones NaN (no pixel is), which the captioner reads as padding
(`models.captioning`).
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

from etils import epy

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def grids(min_tiles, max_tiles):
  """The (columns, rows) InternVL considers, in its order."""
  out = [(c, r) for c in range(1, max_tiles + 1)
         for r in range(1, max_tiles + 1) if min_tiles <= c * r <= max_tiles]
  return sorted(out, key=lambda g: g[0] * g[1])  # stable: ties keep order


def closest_grid(height, width, tile, min_tiles, max_tiles):
  """(columns, rows) of the grid for an image of `height` x `width`."""
  aspect, area = width / height, width * height
  best, best_diff = (1, 1), float('inf')
  for c, r in grids(min_tiles, max_tiles):
    diff = abs(aspect - c / r)
    if diff < best_diff:
      best, best_diff = (c, r), diff
    elif diff == best_diff and area > 0.5 * tile * tile * c * r:
      best = (c, r)
  return best


def slots(max_tiles):
  """Tiles per image in a batch: `max_tiles`, and a thumbnail if more
  than one."""
  return max_tiles + (max_tiles > 1)


def _closest_grid_tf(height, width, tile, min_tiles, max_tiles):
  """`closest_grid` of a tensor's height and width: (columns, rows)."""
  height, width = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
  aspect, area = width / height, width * height
  best = (tf.constant(1), tf.constant(1))
  best_diff = tf.constant(float('inf'), tf.float64)
  for c, r in grids(min_tiles, max_tiles):
    diff = tf.abs(aspect - c / r)
    take = (diff < best_diff) | ((diff == best_diff) &
                                 (area > 0.5 * tile * tile * c * r))
    best = tuple(tf.where(take, v, b) for v, b in zip((c, r), best))
    best_diff = tf.minimum(diff, best_diff)
  return best


def tiles(image, tile, min_tiles, max_tiles):
  """(slots(max_tiles), tile, tile, channels) tiles of `image` (float, in
  [-1, 1]), row by row, then the thumbnail; NaN after them."""
  shape = tf.shape(image)
  columns, rows = _closest_grid_tf(shape[0], shape[1], tile, min_tiles,
                                   max_tiles)
  resize = lambda x, h, w: tf.image.resize(x, tf.stack([h, w]), 'bicubic',
                                           antialias=True)
  grid = resize(image, rows * tile, columns * tile)
  cut = tf.reshape(grid, [rows, tile, columns, tile, -1])
  cut = tf.reshape(tf.transpose(cut, [0, 2, 1, 3, 4]), [-1, tile, tile,
                                                         shape[2]])
  if max_tiles > 1:
    thumbnail = resize(image, tile, tile)[None]
    cut = tf.cond(rows * columns > 1,
                  lambda: tf.concat([cut, thumbnail], 0), lambda: cut)
  cut = tf.clip_by_value(cut, -1.0, 1.0)  # as PIL's uint8 clips
  pad = slots(max_tiles) - tf.shape(cut)[0]
  cut = tf.concat([cut, tf.fill(tf.stack([pad, tile, tile, shape[2]]),
                                float('nan'))], 0)
  return tf.ensure_shape(cut, [slots(max_tiles), tile, tile, None])
