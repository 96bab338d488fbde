"""Segmentation scenes of Fashion-MNIST items on textured ground.

They give dense probes a dataset that prepares offline from the idx files the
default job already reads. `make_scene` draws one scene, a gray image and its
mask, from one `np.random.Generator` (the same state gives the same scene):

1. Ground: one of four textures t in [0, 1], picked uniformly:
   - stripes: 0.5 + 0.5 sin(2 pi (x cos a + y sin a) / period + phase), with
     a in [0, pi), period in [4, 16] pixels, phase in [0, 2 pi);
   - blobs: uniform noise on a g x g grid, g in {2..8}, resized bilinearly;
   - gradient: x cos a + y sin a, a in [0, 2 pi), scaled to [0, 1];
   - checkerboard: square cells of c in {3..12} pixels, shifted by [0, c).
   It becomes lo + (hi - lo) t with lo uniform in [0, 80] and hi in
   [lo + 40, 160], so it is mostly darker than the items, plus Gaussian
   noise of standard deviation 4, rounded and clipped to [0, 255].
2. Items: n, uniform in `items` (inclusive), images drawn without
   replacement. Each is resized bilinearly (PIL) to a square side uniform in
   `item_sizes` (inclusive) and centred on a uniform pixel of the frame, so
   that it may stick out of it (that part is cut). Later items cover earlier
   ones.
3. An item's footprint is its resized pixels above FOOTPRINT_THRESHOLD
   (Fashion-MNIST's own background is 0). There the image takes the item's
   pixels and the mask its class + 1; the mask is 0 on the ground.

Uniform draws are real-valued unless written as {a..b}; every draw comes from
the generator in the order written here, for each item in turn.

`caption` describes a scene from its mask alone ("a bag to the left of an
ankle boot"), so it draws nothing and leaves the scenes as they are.
`draw_scene` also returns the scene's instance map (which item each pixel
shows), from the same draws; `objects` makes of it each item's box and a
referring phrase ("the bag", "the shirt on the left"), unique in the scene.

`disparity` makes of it the scene's relative depth, in the form MiDaS and
Depth Anything predict (disparity, inverse depth, known up to scale and
shift): the items lie in layers over the ground, each later one nearer, so
the ground is at depth 1 and the k-th item placed at depth 1 / (1 + k).
Its disparity is 1 on the ground and 1 + k where the k-th item shows; 0 is
left for "no depth here" (padding). It too draws nothing.
"""

import numpy as np
from PIL import Image

# Bilinear resizing smears the items' zero background into a faint halo.
FOOTPRINT_THRESHOLD = 10
# The smallest whole item (16 px) shows over 50 pixels (a sandal, the
# sparsest class, at its 1st percentile), so fewer than 30 is a sliver, mostly
# covered or out of frame, that a caption should not name (1.3% of the
# classes that show on the test split).
MIN_CAPTION_PIXELS = 30
# Fashion-MNIST's classes, as a caption names them.
CAPTION_NAMES = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal',
                 'shirt', 'sneaker', 'bag', 'ankle boot')


def make_scene(rng: np.random.Generator, images, labels, *, size=56,
               items=(2, 4), item_sizes=(16, 36)):
  """A scene drawn from `rng` as the module says.

  Args:
    rng: the scene's only source of randomness.
    images: (N, H, W) uint8 items on a 0 background; N >= items[1].
    labels: (N,) their classes.
    size: the scene's side.
    items: (fewest, most) items in a scene.
    item_sizes: (smallest, largest) side of an item.

  Returns:
    (image, mask), both (size, size, 1) uint8; the mask holds class + 1 where
    an item shows, 0 elsewhere.
  """
  image, mask, _ = draw_scene(rng, images, labels, size=size, items=items,
                              item_sizes=item_sizes)
  return image, mask


def draw_scene(rng: np.random.Generator, images, labels, *, size=56,
               items=(2, 4), item_sizes=(16, 36)):
  """`make_scene`'s (image, mask), the same draws, and the instance map:
  (size, size, 1) uint8, k where the k-th item drawn (from 1) shows, 0 on
  the ground."""
  image = _ground(rng, size)
  mask = np.zeros((size, size), np.uint8)
  instances = np.zeros((size, size), np.uint8)
  count = rng.integers(items[0], items[1] + 1)
  for k, i in enumerate(rng.choice(len(images), count, replace=False), 1):
    side = int(rng.integers(item_sizes[0], item_sizes[1] + 1))
    top, left = rng.integers(0, size, 2) - side // 2
    item = Image.fromarray(np.asarray(images[i], np.uint8))
    item = np.asarray(item.resize((side, side), Image.BILINEAR))
    footprint = _paste(image, mask, item, int(labels[i]) + 1, top, left)
    instances[footprint] = k
  return image[..., None], mask[..., None], instances[..., None]


def disparity(instances):
  """The relative depth of `draw_scene`'s instance map, as disparity: 1 on
  the ground, 1 + k where the k-th item placed shows (the module's layers);
  (H, W, 1) uint8."""
  return (np.asarray(instances, np.int64) + 1).astype(np.uint8)


def caption(mask, names=CAPTION_NAMES, min_pixels=MIN_CAPTION_PIXELS) -> str:
  """The classes that show in `mask`, left to right, as one phrase.

  "a bag", "a bag to the left of an ankle boot", "a X to the left of a Y to
  the left of a Z", or "nothing". A class shows if at least `min_pixels` of
  the mask are its own; classes are ordered by the mean x of their pixels. A
  class of two items counts once, at the mean of both.

  Args:
    mask: (H, W, 1) ints, class + 1 where an item shows, 0 on the ground.
    names: a name per class.
    min_pixels: the fewest pixels of a class that show.
  """
  labels = np.asarray(mask)[..., 0]
  if labels.max(initial=0) > len(names):
    raise ValueError(f'The mask holds label {labels.max()}, but there are '
                     f'only {len(names)} names.')
  columns = np.broadcast_to(np.arange(labels.shape[1]), labels.shape)
  pixels = np.bincount(labels.ravel(), minlength=len(names) + 1)[1:]
  x_sums = np.bincount(labels.ravel(), columns.ravel(),
                       minlength=len(names) + 1)[1:]
  shown = np.flatnonzero(pixels >= max(min_pixels, 1))  # absent never shows
  if shown.size == 0:
    return 'nothing'
  # A stable sort: a tie goes to the lower class.
  left_to_right = shown[np.argsort(x_sums[shown] / pixels[shown],
                                   kind='stable')]
  return ' to the left of '.join(_with_article(names[c])
                                 for c in left_to_right)


# Where an item lies among others of its class, along the axis on which
# their centres spread most: two, three, or (more) an ordinal.
_PLACES = {
    2: (('on the left', 'on the right'), ('at the top', 'at the bottom')),
    3: (('on the left', 'in the middle', 'on the right'),
        ('at the top', 'in the middle', 'at the bottom')),
}
_ORDINALS = ('first', 'second', 'third', 'fourth', 'fifth', 'sixth')


def objects(mask, instances, names=CAPTION_NAMES,
            min_pixels=MIN_CAPTION_PIXELS):
  """The items that show, left to right (by the mean x of their pixels), as
  dicts `label` (class), `bbox` and `phrase`.

  An item shows if at least `min_pixels` of the instance map are its own.
  `bbox`: float32 [ymin, xmin, ymax, xmax] of its pixels, normalized by the
  scene's sides (tfds' BBox: ymax = (last row + 1) / height). `phrase`
  names it uniquely in the scene: "the bag" if no other item of its class
  shows; else its place among them along the axis (x or y) on which their
  centres spread most ("the shirt on the left", "the coat at the top",
  "the bag in the middle", "the second sandal from the left").

  Args:
    mask: (H, W, 1) class + 1 where an item shows (`make_scene`'s).
    instances: (H, W, 1) the item's number where it shows (`draw_scene`'s).
    names: a name per class.
    min_pixels: the fewest pixels of an item that show.
  """
  classes, ids = np.asarray(mask)[..., 0], np.asarray(instances)[..., 0]
  height, width = ids.shape
  found = []
  for k in np.unique(ids[ids > 0]):
    ys, xs = np.nonzero(ids == k)
    if len(ys) < max(min_pixels, 1):
      continue
    found.append({
        'label': int(classes[ys[0], xs[0]]) - 1,
        'bbox': np.array([ys.min() / height, xs.min() / width,
                          (ys.max() + 1) / height, (xs.max() + 1) / width],
                         np.float32),
        'centre': (ys.mean(), xs.mean())})
  found.sort(key=lambda o: o['centre'][1])  # stable: ties by item number
  for label in {o['label'] for o in found}:
    same = [o for o in found if o['label'] == label]
    name = names[label]
    if len(same) == 1:
      same[0]['phrase'] = f'the {name}'
      continue
    centres = np.array([o['centre'] for o in same])
    spread = centres.max(0) - centres.min(0)
    axis = 1 if spread[1] >= spread[0] else 0
    order = np.argsort(centres[:, axis], kind='stable')
    for rank, i in enumerate(order):
      if len(same) in _PLACES:
        place = _PLACES[len(same)][1 - axis][rank]
        same[i]['phrase'] = f'the {name} {place}'
      else:
        side = 'left' if axis else 'top'
        same[i]['phrase'] = f'the {_ORDINALS[rank]} {name} from the {side}'
  return [{k: o[k] for k in ('label', 'bbox', 'phrase')} for o in found]


def _with_article(name):
  """'an' before a vowel (enough for these names), 'a' otherwise."""
  return f'{"an" if name[0] in "aeiou" else "a"} {name}'


def _paste(image, mask, item, label, top, left):
  """Writes `item`'s footprint into `image` and `mask` at (top, left);
  returns it as a (size, size) boolean map."""
  size = image.shape[0]
  y0, x0 = max(top, 0), max(left, 0)
  y1, x1 = min(top + item.shape[0], size), min(left + item.shape[1], size)
  piece = item[y0 - top:y1 - top, x0 - left:x1 - left]
  footprint = piece > FOOTPRINT_THRESHOLD
  image[y0:y1, x0:x1][footprint] = piece[footprint]
  mask[y0:y1, x0:x1][footprint] = label
  where = np.zeros(image.shape, bool)
  where[y0:y1, x0:x1] = footprint
  return where


def _ground(rng, size):
  """A gray texture in a random intensity range, with mild pixel noise."""
  texture = _TEXTURES[rng.integers(len(_TEXTURES))](rng, size)
  low = rng.uniform(0, 80)
  high = rng.uniform(low + 40, 160)
  pixels = low + (high - low) * texture + rng.normal(0, 4, (size, size))
  return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)


def _stripes(rng, size):
  angle, period = rng.uniform(0, np.pi), rng.uniform(4, 16)
  phase = rng.uniform(0, 2 * np.pi)
  return 0.5 + 0.5 * np.sin(2 * np.pi * _along(angle, size) / period + phase)


def _blobs(rng, size):
  grid = int(rng.integers(2, 9))
  noise = Image.fromarray(rng.uniform(0, 1, (grid, grid)).astype(np.float32))
  return np.asarray(noise.resize((size, size), Image.BILINEAR), np.float64)


def _gradient(rng, size):
  ramp = _along(rng.uniform(0, 2 * np.pi), size)
  return (ramp - ramp.min()) / (ramp.max() - ramp.min())


def _checkerboard(rng, size):
  cell = int(rng.integers(3, 13))
  y, x = np.mgrid[:size, :size] + rng.integers(0, cell, (2, 1, 1))
  return ((y // cell + x // cell) % 2).astype(np.float64)


def _along(angle, size):
  """Each pixel's coordinate along the direction `angle`."""
  y, x = np.mgrid[:size, :size]
  return x * np.cos(angle) + y * np.sin(angle)


_TEXTURES = (_stripes, _blobs, _gradient, _checkerboard)
