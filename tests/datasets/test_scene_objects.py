"""Fashion-MNIST scenes' objects: boxes from the instance map against numpy,
referring phrases unique in each scene, and the builder's objects feature."""

import numpy as np
import tensorflow_datasets as tfds

from tests.datasets.test_scenes import CLASSES, SQUARES, TinyScenes, _prepare
from vit_jax.data import local_datasets
from vit_jax.data import scenes


def _numpy_box(where):
  """[ymin, xmin, ymax, xmax] of a boolean map's True pixels, normalized."""
  h, w = where.shape
  rows, cols = np.flatnonzero(where.any(1)), np.flatnonzero(where.any(0))
  return np.array([rows[0] / h, cols[0] / w, (rows[-1] + 1) / h,
                   (cols[-1] + 1) / w])


def test_draw_scene_is_make_scene_with_instances():
  for seed in range(20):
    image, mask = scenes.make_scene(np.random.default_rng(seed), SQUARES,
                                    CLASSES)
    again, again_mask, instances = scenes.draw_scene(
        np.random.default_rng(seed), SQUARES, CLASSES)
    np.testing.assert_array_equal(image, again)
    np.testing.assert_array_equal(mask, again_mask)
    # Every shown pixel has an item, and each item one class.
    assert ((instances > 0) == (mask > 0)).all()
    for k in np.unique(instances[instances > 0]):
      assert len(np.unique(mask[instances == k])) == 1


def test_boxes_and_labels_are_the_instance_maps():
  # Three items of each of three classes: scenes with a class twice.
  images, labels = np.concatenate([SQUARES[:3]] * 3), np.tile(CLASSES[:3], 3)
  seen_phrases = set()
  for seed in range(40):
    _, mask, instances = scenes.draw_scene(np.random.default_rng(seed),
                                           images, labels, items=(3, 4))
    found = scenes.objects(mask, instances)
    ids = instances[..., 0]
    shown = [k for k in np.unique(ids[ids > 0])
             if (ids == k).sum() >= scenes.MIN_CAPTION_PIXELS]
    assert len(found) == len(shown)
    want = sorted(((np.nonzero(ids == k)[1].mean(), k) for k in shown),
                  key=lambda xk: xk[0])
    for o, (_, k) in zip(found, want):
      np.testing.assert_allclose(o['bbox'], _numpy_box(ids == k), rtol=1e-6)
      assert o['label'] == mask[..., 0][ids == k][0] - 1
      assert o['bbox'].dtype == np.float32
    phrases = [o['phrase'] for o in found]
    assert len(set(phrases)) == len(phrases), phrases  # unique in the scene
    seen_phrases.update(phrases)
  assert any(' on the ' in p or ' at the ' in p for p in seen_phrases)


def _instances(*boxes, size=40):
  """(mask, instances) with item k (from 1) of `label` on each (label, top,
  left, height, width) box, later boxes on top."""
  mask = np.zeros((size, size, 1), np.uint8)
  ids = np.zeros((size, size, 1), np.uint8)
  for k, (label, top, left, height, width) in enumerate(boxes, 1):
    mask[top:top + height, left:left + width] = label
    ids[top:top + height, left:left + width] = k
  return mask, ids


def test_phrases_place_an_item_among_its_class():
  # One bag (label 9), two shirts (7) side by side: left and right.
  mask, ids = _instances((9, 0, 0, 10, 10), (7, 20, 5, 10, 10),
                         (7, 20, 25, 10, 10))
  found = scenes.objects(mask, ids)
  assert [o['phrase'] for o in found] == [
      'the bag', 'the shirt on the left', 'the shirt on the right']
  np.testing.assert_allclose(found[0]['bbox'], [0, 0, 0.25, 0.25])
  # Two coats (5) one above the other: top and bottom, listed by mean x.
  mask, ids = _instances((5, 25, 0, 10, 12), (5, 0, 2, 10, 10))
  assert [o['phrase'] for o in scenes.objects(mask, ids)] == [
      'the coat at the bottom', 'the coat at the top']
  # Three, then four, of a class along x.
  mask, ids = _instances(*[(6, 0, 10 * i, 8, 8) for i in range(3)])
  assert [o['phrase'] for o in scenes.objects(mask, ids)] == [
      'the sandal on the left', 'the sandal in the middle',
      'the sandal on the right']
  mask, ids = _instances(*[(6, 0, 10 * i, 8, 8) for i in range(4)])
  assert [o['phrase'] for o in scenes.objects(mask, ids)] == [
      f'the {n} sandal from the left'
      for n in ('first', 'second', 'third', 'fourth')]
  # A sliver is no object; a covered item shows only where it shows.
  mask, ids = _instances((1, 0, 0, 1, scenes.MIN_CAPTION_PIXELS - 1),
                         (2, 10, 10, 20, 20), (3, 10, 10, 20, 10))
  found = scenes.objects(mask, ids)
  assert [o['phrase'] for o in found] == ['the pullover', 'the trouser']
  np.testing.assert_allclose(found[1]['bbox'], [0.25, 0.5, 0.75, 0.75])


def test_builder_writes_the_objects(fmnist_dirs, tmp_path):
  manual, _ = fmnist_dirs
  builder = _prepare(tmp_path, manual)
  images = local_datasets._read_idx(f'{manual}/t10k-images-idx3-ubyte.gz')
  labels = local_datasets._read_idx(f'{manual}/t10k-labels-idx1-ubyte.gz')
  want = {}
  for i in range(TinyScenes.NUM_TEST):
    image, mask, ids = scenes.draw_scene(
        np.random.default_rng([TinyScenes.SEED, 1, i]), images, labels,
        size=TinyScenes.SIZE, items=TinyScenes.ITEMS,
        item_sizes=TinyScenes.ITEM_SIZES)
    want[image.tobytes()] = scenes.objects(mask, ids)
  for ex in tfds.as_numpy(builder.as_dataset(split='test')):
    expected, got = want.pop(ex['image'].tobytes()), ex['objects']
    assert [p.decode() for p in got['phrase']] == [
        o['phrase'] for o in expected]
    assert list(got['label']) == [o['label'] for o in expected]
    np.testing.assert_allclose(
        got['bbox'].reshape(-1, 4),
        np.reshape([o['bbox'] for o in expected], (-1, 4)))
  assert not want
