"""Moving Fashion-MNIST: one item gliding and bouncing across a dark frame.

It gives video models a dataset that prepares offline from the idx files the
default job already reads, as Moving MNIST (Srivastava et al., 2015) does
from MNIST's. `make_clip` draws one clip from one `np.random.Generator` (the
same state gives the same clip), in this order:

1. The item: an index uniform in {0..N-1}; the clip's class is its class.
2. Its start: the top-left corner p0 = (y0, x0), each uniform in [lo, hi],
   where lo = -overhang and hi = size - 28 + overhang.
3. Its velocity: a direction a uniform in [0, 2 pi), then a speed s uniform
   in `speed` (pixels per frame); v = s (sin a, cos a).
4. Its path: frame t shows the item at p_t = lo + fold(p0 - lo + t v), per
   coordinate, with fold(u) = L - |(u mod 2L) - L| and L = hi - lo: a
   straight line that bounces off lo and hi as off a wall (the angle of
   incidence is the angle of reflection, the speed is kept).
5. Frame t: zeros (black), with the item's 28x28 pixels written at the
   corner rint(p_t) (numpy's rounding, half to even); what falls outside the
   frame is cut.

With an `overhang`, an item near a wall is partly out of frame, so a single
frame may show only part of it while the clip shows all of it: the frames
together say more than any one of them.
"""

import numpy as np

ITEM = 28  # Fashion-MNIST's side


def bounds(size, overhang):
  """(lo, hi): the range of the item's corner, per coordinate."""
  lo, hi = -overhang, size - ITEM + overhang
  if hi <= lo:
    raise ValueError(f'A frame of {size} pixels with an overhang of '
                     f'{overhang} leaves the {ITEM}-pixel item no room to '
                     f'move; use size > {ITEM - 2 * overhang}.')
  return lo, hi


def fold(u, length):
  """u reflected into [0, length] by walls at 0 and `length`."""
  return length - np.abs(np.mod(u, 2 * length) - length)


def make_clip(rng: np.random.Generator, images, labels, *, frames=16,
              size=56, speed=(1.0, 3.0), overhang=8):
  """A clip drawn from `rng` as the module says.

  Args:
    rng: the clip's only source of randomness.
    images: (N, 28, 28) uint8 items on a 0 background.
    labels: (N,) their classes.
    frames: the clip's length.
    size: the frame's side.
    speed: (slowest, fastest) pixels per frame.
    overhang: how far (pixels) the item's box may leave the frame.

  Returns:
    (clip, label): (frames, size, size, 1) uint8 and the item's class.
  """
  lo, hi = bounds(size, overhang)
  index = rng.integers(len(images))
  start = rng.uniform(lo, hi, 2)
  angle = rng.uniform(0, 2 * np.pi)
  velocity = rng.uniform(*speed) * np.array([np.sin(angle), np.cos(angle)])
  clip = np.zeros((frames, size, size), np.uint8)
  for t, (top, left) in enumerate(path(start, velocity, frames, lo, hi)):
    _paste(clip[t], np.asarray(images[index], np.uint8), top, left)
  return clip[..., None], int(labels[index])


def path(start, velocity, frames, lo, hi):
  """(frames, 2) integer corners of the item: step 4 of the recipe."""
  t = np.arange(frames)[:, None]
  exact = lo + fold(start - lo + t * velocity, hi - lo)
  return np.rint(exact).astype(int)


def _paste(frame, item, top, left):
  """Writes `item` into `frame` at (top, left), cut to the frame."""
  size = frame.shape[0]
  y0, x0 = max(top, 0), max(left, 0)
  y1 = min(top + item.shape[0], size)
  x1 = min(left + item.shape[1], size)
  frame[y0:y1, x0:x1] = item[y0 - top:y1 - top, x0 - left:x1 - left]
