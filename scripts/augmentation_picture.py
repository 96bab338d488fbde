r"""Draws the training augmentations as a grid: docs/figures/augmentation.png.

  python scripts/augmentation_picture.py

Rows: the plain training transform (inception crop, flip), RandAugment at
a few magnitudes, random erasing, then Mixup and CutMix of the plain row.
Each column keeps its example seed, so the rows differ only by the
augmentation (RandAugment picks the same ops at every magnitude).
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top
import jax
import matplotlib.cbook
import numpy as np
from PIL import Image, ImageDraw
import tensorflow as tf

from vit_jax import cli
from vit_jax.configs import common
from vit_jax.data import mixing
from vit_jax.data import pipeline

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
flags.DEFINE_list('images', [
    os.path.join(_ROOT, 'tests/data/predict_image.jpg'),
    str(matplotlib.cbook.get_sample_data('grace_hopper.jpg', asfileobj=False)),
], 'Photos; the columns cycle through them.')
flags.DEFINE_integer('columns', 6, 'Examples (seeds) per row.')
flags.DEFINE_integer('crop', 224, 'pp.crop: RandAugment translates and '
                     'cuts out in pixels, as big_vision at 224.')
flags.DEFINE_integer('tile', 104, 'Side of each picture in the grid.')
flags.DEFINE_string('out', os.path.join(_ROOT, 'docs/figures/augmentation.png'),
                    'PNG to write.')
FLAGS = flags.FLAGS

# (row label, pp settings)
ROWS = [('plain', {}), ('RandAug 2,5', {'randaug': (2, 5)}),
        ('RandAug 2,10', {'randaug': (2, 10)}),
        ('RandAug 2,15', {'randaug': (2, 15)}),
        ('erasing p=1', {'erasing': 1.0})]


def _row(photos, settings):
  """One example per column through `preprocess_train`, in [-1, 1]."""
  pp = common.get_config().pp
  pp.crop, pp.area_min = FLAGS.crop, 0.3
  pp.update(settings)
  seed = tf.constant([0, 0], tf.int64)
  return np.stack([pipeline.preprocess_train(
      photos[i % len(photos)], tf.random.experimental.stateless_fold_in(
          seed, i), pp).numpy() for i in range(FLAGS.columns)])


def _grid(rows, labels):
  """Rows of [-1, 1] images side by side, a label on the left of each."""
  label_width, s, pad = 100, FLAGS.tile, 2
  grid = Image.new('RGB', (label_width + FLAGS.columns * (s + pad),
                           len(rows) * (s + pad)), 'white')
  draw = ImageDraw.Draw(grid)
  for r, (images, label) in enumerate(zip(rows, labels)):
    y = r * (s + pad)
    draw.text((4, y + s // 2 - 6), label, fill='black')
    for c, image in enumerate(images):
      pixels = np.round((np.clip(image, -1, 1) + 1) * 127.5).astype(np.uint8)
      tile = Image.fromarray(pixels).resize((s, s), Image.BILINEAR)
      grid.paste(tile, (label_width + c * (s + pad), y))
  return grid


def main(argv):
  if len(argv) > 1:
    raise ValueError(f'Unexpected arguments: {argv[1:]}')
  photos = []
  for path in FLAGS.images:
    with open(path, 'rb') as f:
      photos.append(tf.io.decode_image(f.read(), channels=3))
  rows = [_row(photos, settings) for _, settings in ROWS]
  labels = [label for label, _ in ROWS]
  one_hot = np.eye(FLAGS.columns, dtype=np.float32)
  for label, kw in (('Mixup p=0.8', {'p': 0.8}),
                    ('CutMix a=1', {'cutmix_alpha': 1.0})):
    mixed, _ = mixing.mix(jax.random.key(1), rows[0], one_hot, **kw)
    rows.append(np.asarray(mixed))
    labels.append(label)
  # 256 colours keep the PNG small; the augmentations stay visible.
  _grid(rows, labels).quantize(256).save(FLAGS.out, optimize=True)
  print(f'Wrote {FLAGS.out} ({os.path.getsize(FLAGS.out) // 1024} KB)')


if __name__ == '__main__':
  cli.run(main)
