"""Fashion-MNIST scenes: the recipe's guarantees, the captions of hand-made
masks, the depth of the items' order, and the offline builder."""

import pathlib

import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax.data import local_datasets
from vit_jax.data import pipeline
from vit_jax.data import scenes

# One fake item per class, a full square of the class's own intensity.
INTENSITY = np.arange(10) * 20 + 40
SQUARES = np.broadcast_to(INTENSITY[:, None, None], (10, 28, 28)).astype(
    np.uint8)
CLASSES = np.arange(10)


def _scene(seed, images=SQUARES, **kw):
  return scenes.make_scene(np.random.default_rng(seed), images, CLASSES, **kw)


def test_same_seed_same_scene():
  image, mask = _scene(3)
  again, again_mask = _scene(3)
  np.testing.assert_array_equal(image, again)
  np.testing.assert_array_equal(mask, again_mask)
  other, other_mask = _scene(4)
  assert (image != other).any() and (mask != other_mask).any()
  assert image.shape == mask.shape == (56, 56, 1)
  assert image.dtype == mask.dtype == np.uint8


def test_labels_mark_the_items_that_show():
  """The draws do not depend on the items' pixels: scenes of the same seed
  from brighter squares, or from blank items, share the ground and places."""
  brighter = SQUARES + np.uint8(10)
  blank = np.zeros_like(SQUARES)
  for seed in range(20):
    image, mask = _scene(seed)
    image, mask = image[..., 0], mask[..., 0]
    assert 0 < (mask > 0).sum() < mask.size
    for c in np.unique(mask[mask > 0]) - 1:
      assert (image[mask == c + 1] == INTENSITY[c]).all()
    bright_image, bright_mask = _scene(seed, brighter)
    np.testing.assert_array_equal(bright_mask[..., 0], mask)
    ground = mask == 0
    np.testing.assert_array_equal(bright_image[..., 0][ground], image[ground])
    assert (bright_image[..., 0][~ground] == image[~ground] + 10).all()
    # An item's zero pixels are not its own: blank items leave only ground.
    blank_image, blank_mask = _scene(seed, blank)
    assert not blank_mask.any()
    np.testing.assert_array_equal(blank_image[..., 0][ground], image[ground])


def test_faint_pixels_are_not_footprint():
  """A dark item (all at the threshold) leaves nothing; one step brighter,
  it is all footprint."""
  for seed in range(5):
    at = np.full_like(SQUARES, scenes.FOOTPRINT_THRESHOLD)
    assert not _scene(seed, at)[1].any()
    assert _scene(seed, at + np.uint8(1))[1].any()


def _placed(seed, k, **kw):
  """The classes placed in scene `seed`: each shows when the others are
  blanked out (the places do not depend on the pixels)."""
  shown = set()
  for c in range(k):
    alone = np.where(CLASSES[:k, None, None] == c, SQUARES[:k], 0)
    mask = scenes.make_scene(np.random.default_rng(seed), alone, CLASSES[:k],
                             **kw)[1]
    shown.update(np.unique(mask[mask > 0]) - 1)
  return shown


def test_item_counts():
  counts = set()
  for seed in range(30):
    placed = _placed(seed, 10, items=(2, 4))
    visible = set(np.unique(_scene(seed, items=(2, 4))[1])) - {0}
    assert {c + 1 for c in placed} >= visible
    assert 2 <= len(placed) <= 4
    counts.add(len(placed))
    # Exactly k items of k distinct classes: all of them are placed.
    assert _placed(seed, 3, items=(3, 3)) == {0, 1, 2}
  assert counts == {2, 3, 4}


def test_depth_puts_later_items_nearer():
  """Each item alone (the others blanked: the places do not change) shows
  at one disparity; in the whole scene its footprint shows that disparity
  where the item shows, and a larger one (nearer) where a later item
  covers it. The disparities of the items are 2, 3, ... in some order; the
  ground's is 1."""
  for seed in range(10):
    image, mask, instances = scenes.draw_scene(
        np.random.default_rng(seed), SQUARES, CLASSES)
    depth = scenes.disparity(instances)[..., 0]
    assert depth.dtype == np.uint8 and depth.shape == (56, 56)
    np.testing.assert_array_equal(depth == 1, mask[..., 0] == 0)
    # draw_scene's image and mask are make_scene's, and its draws are.
    again = _scene(seed)
    np.testing.assert_array_equal(image, again[0])
    np.testing.assert_array_equal(mask, again[1])
    levels = []
    for c in np.unique(mask[mask > 0]) - 1:
      alone = np.where(CLASSES[:, None, None] == c, SQUARES, 0)
      _, alone_mask, alone_instances = scenes.draw_scene(
          np.random.default_rng(seed), alone, CLASSES)
      footprint = alone_mask[..., 0] > 0
      level = np.unique(scenes.disparity(alone_instances)[..., 0][footprint])
      assert len(level) == 1
      levels.append(level[0])
      shows = mask[..., 0] == c + 1
      assert (depth[shows] == level[0]).all()
      assert (depth[footprint & ~shows] > level[0]).all()
    assert len(set(levels)) == len(levels) and min(levels) >= 2


def _mask(*boxes, size=40):
  """A (size, size, 1) mask with `label` on each (label, top, left, height,
  width) box, later boxes on top."""
  mask = np.zeros((size, size, 1), np.uint8)
  for label, top, left, height, width in boxes:
    mask[top:top + height, left:left + width] = label
  return mask


def test_caption_orders_by_mean_x():
  # The t-shirt (label 1) reaches further left, and the trouser has more
  # pixels to the right of it, but the trouser's mean x is 14.5 and the
  # t-shirt's 19.5.
  mask = _mask((1, 0, 0, 2, 40), (2, 10, 10, 20, 10))
  assert scenes.caption(mask) == 'a trouser to the left of a t-shirt'
  # Three items; 'an' before the ankle boot.
  mask = _mask((10, 0, 0, 10, 10), (9, 0, 30, 10, 10), (4, 20, 15, 10, 10))
  assert scenes.caption(mask) == (
      'an ankle boot to the left of a dress to the left of a bag')
  # Two bags (label 9) count once, at their mean x (19.5, right of the coat's
  # 17): the leftmost thing is a bag, yet the caption starts with the coat.
  mask = _mask((9, 0, 0, 10, 5), (9, 20, 35, 10, 5), (5, 10, 15, 10, 5))
  assert scenes.caption(mask) == 'a coat to the left of a bag'
  assert scenes.caption(mask, [f'c{i}' for i in range(10)]) == (
      'a c4 to the left of a c8')


def test_caption_names_what_shows():
  min_pixels = scenes.MIN_CAPTION_PIXELS
  one = _mask((6, 0, 0, 1, min_pixels))
  assert scenes.caption(one) == 'a sandal'
  assert scenes.caption(np.zeros((8, 8, 1), np.uint8)) == 'nothing'
  sliver = _mask((6, 0, 0, 1, min_pixels - 1))
  assert scenes.caption(sliver) == 'nothing'
  assert scenes.caption(sliver, min_pixels=min_pixels - 1) == 'a sandal'
  # A sliver among items is left out.
  mask = _mask((10, 0, 0, 10, 10), (8, 0, 30, 10, 10),
               (6, 20, 0, 1, min_pixels - 1))
  assert scenes.caption(mask) == 'an ankle boot to the left of a sneaker'
  with pytest.raises(ValueError, match='label 10, but there are only 9'):
    scenes.caption(mask, scenes.CAPTION_NAMES[:9])


class TinyScenes(local_datasets.FashionMnistScenes, skip_registration=True):
  NUM_TRAIN = 12
  NUM_TEST = 5


def _prepare(data_dir, manual_dir):
  builder = TinyScenes(data_dir=str(data_dir))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
  return builder


def _records(builder):
  return {path.name: path.read_bytes()
          for path in pathlib.Path(builder.data_dir).glob('*.tfrecord*')}


def test_builder_prepares_offline(fmnist_dirs, tmp_path):
  manual, _ = fmnist_dirs
  builder = _prepare(tmp_path / 'a', manual)
  assert builder.info.splits['train'].num_examples == 12
  assert builder.info.splits['test'].num_examples == 5
  assert builder.info.features['segmentation_mask'].num_classes == 11
  assert str(builder.info.version) == '1.3.0'
  images = local_datasets._read_idx(f'{manual}/t10k-images-idx3-ubyte.gz')
  labels = local_datasets._read_idx(f'{manual}/t10k-labels-idx1-ubyte.gz')
  # Scene i of the test split is drawn from the rng seeded [SEED, 1, i]:
  # image and mask are make_scene's (as in 1.0.0), the depth the disparity
  # of draw_scene's instances.
  expected, depths = set(), {}
  for i in range(5):
    drawn = scenes.draw_scene(
        np.random.default_rng([TinyScenes.SEED, 1, i]), images, labels,
        size=TinyScenes.SIZE, items=TinyScenes.ITEMS,
        item_sizes=TinyScenes.ITEM_SIZES)
    key = b''.join(a.tobytes() for a in scenes.make_scene(
        np.random.default_rng([TinyScenes.SEED, 1, i]), images, labels,
        size=TinyScenes.SIZE, items=TinyScenes.ITEMS,
        item_sizes=TinyScenes.ITEM_SIZES))
    expected.add(key)
    depths[key] = scenes.disparity(drawn[2])
  found, captions = set(), set()
  for ex in tfds.as_numpy(builder.as_dataset(split='test')):
    image, mask = ex['image'], ex['segmentation_mask']
    assert image.shape == mask.shape == ex['depth'].shape == (56, 56, 1)
    assert image.dtype == mask.dtype == ex['depth'].dtype == np.uint8
    assert mask.max() <= 10
    found.add(image.tobytes() + mask.tobytes())
    np.testing.assert_array_equal(ex['depth'],
                                  depths[image.tobytes() + mask.tobytes()])
    # The caption is its mask's.
    assert ex['caption'].decode() == scenes.caption(mask)
    captions.add(ex['caption'].decode())
  assert found == expected
  assert any(' to the left of ' in c for c in captions), captions
  # A second preparation writes the same records, byte for byte.
  again = _prepare(tmp_path / 'b', manual)
  assert _records(builder) and _records(builder) == _records(again)


def test_get_builder_prepares_scenes(tiny_config, tmp_path, monkeypatch):
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TRAIN', 6)
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TEST', 3)
  tiny_config.dataset = 'fashion_mnist_scenes'
  tiny_config.tfds_data_dir = str(tmp_path)
  tiny_config.tfds_download = False
  builder = pipeline.get_builder(tiny_config)
  assert builder.name == 'fashion_mnist_scenes'
  assert builder.info.splits['train'].num_examples == 6
  assert builder.info.splits['test'].num_examples == 3
