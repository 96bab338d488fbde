"""Moving Fashion-MNIST: the recipe's paths against a step-by-step bounce,
its frames against an independent paste, and the offline builder."""

import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax.data import local_datasets
from vit_jax.data import moving
from vit_jax.data import pipeline

# Items whose every pixel is nonzero and unlike the others', so that a frame
# shows exactly where an item is and which one.
ITEMS = np.random.default_rng(0).integers(1, 256, (7, 28, 28)).astype(np.uint8)
LABELS = np.array([3, 1, 4, 1, 5, 9, 2])


def _clip(seed, **kw):
  return moving.make_clip(np.random.default_rng(seed), ITEMS, LABELS, **kw)


def _simulated(seed, frames, size, speed, overhang):
  """(item, integer corners per frame) by the module docstring's draws and
  a frame-by-frame walk that reverses a coordinate's velocity at a wall."""
  rng = np.random.default_rng(seed)
  item = rng.integers(len(ITEMS))
  position = rng.uniform(-overhang, size - 28 + overhang, 2)
  angle = rng.uniform(0, 2 * np.pi)
  velocity = rng.uniform(*speed) * np.array([np.sin(angle), np.cos(angle)])
  lo, hi = -overhang, size - 28 + overhang
  corners = []
  for _ in range(frames):
    corners.append(np.rint(position).astype(int))
    position = position + velocity
    for d in range(2):  # at most one wall per step: speed < hi - lo
      if position[d] > hi:
        position[d], velocity[d] = 2 * hi - position[d], -velocity[d]
      elif position[d] < lo:
        position[d], velocity[d] = 2 * lo - position[d], -velocity[d]
  return item, np.array(corners)


def _frame(item, corner, size):
  """The item drawn on a canvas with a 28-pixel border, then cut out."""
  canvas = np.zeros((size + 56, size + 56), np.uint8)
  top, left = corner + 28
  canvas[top:top + 28, left:left + 28] = ITEMS[item]
  return canvas[28:28 + size, 28:28 + size]


@pytest.mark.parametrize('frames,size,speed,overhang', [
    (16, 56, (1.0, 3.0), 8), (24, 40, (2.0, 6.0), 0), (12, 32, (3.0, 5.0), 14)])
def test_paths_bounce_off_the_walls(frames, size, speed, overhang):
  bounces = cut = 0
  for seed in range(40):
    clip, label = _clip(seed, frames=frames, size=size, speed=speed,
                        overhang=overhang)
    assert clip.shape == (frames, size, size, 1) and clip.dtype == np.uint8
    item, corners = _simulated(seed, frames, size, speed, overhang)
    assert label == LABELS[item]
    expected = np.stack([_frame(item, c, size) for c in corners])
    np.testing.assert_array_equal(clip[..., 0], expected)
    steps = np.diff(corners, axis=0)
    # A wall turns a coordinate's direction back (rounding aside).
    bounces += np.any(steps[1:] * steps[:-1] < -1)
    shown = (clip[..., 0] > 0).sum((1, 2))
    cut += np.any(shown < 28 * 28)
    # Never further out than the overhang.
    assert corners.min() >= -overhang
    assert corners.max() <= size - 28 + overhang
  assert bounces >= 10
  if overhang:
    assert cut >= 10
  else:  # the whole item shows in every frame
    assert cut == 0


def test_same_seed_same_clip():
  clip, label = _clip([0, 1, 2])
  again, again_label = _clip([0, 1, 2])
  np.testing.assert_array_equal(clip, again)
  assert label == again_label
  assert (clip != _clip([0, 1, 3])[0]).any()
  # The item moves: no two consecutive frames are the same, at 1+ px/frame.
  assert all((clip[t] != clip[t + 1]).any() for t in range(len(clip) - 1))


def test_no_room_to_move():
  with pytest.raises(ValueError, match='no room to move; use size > 12'):
    _clip(0, size=12, overhang=8)


class TinyMoving(local_datasets.MovingFashionMnist, skip_registration=True):
  NUM_TRAIN = 6
  NUM_TEST = 4


@pytest.mark.parametrize('name,frames,size', [('frames16_size56', 16, 56),
                                              ('frames8_size32', 8, 32)])
def test_builder_prepares_offline(fmnist_dirs, tmp_path, name, frames, size):
  manual, _ = fmnist_dirs
  builder = TinyMoving(config=name, data_dir=str(tmp_path))
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(manual_dir=manual))
  assert builder.info.splits['train'].num_examples == 6
  assert builder.info.splits['test'].num_examples == 4
  assert builder.info.features['label'].names == list(
      local_datasets.FashionMnistLocal.CLASSES)
  images = local_datasets._read_idx(f'{manual}/t10k-images-idx3-ubyte.gz')
  labels = local_datasets._read_idx(f'{manual}/t10k-labels-idx1-ubyte.gz')
  # Clip i of the test split is drawn from the rng seeded [SEED, 1, i].
  expected = {}
  for i in range(4):
    clip, label = moving.make_clip(
        np.random.default_rng([TinyMoving.SEED, 1, i]), images, labels,
        frames=frames, size=size, speed=TinyMoving.SPEED,
        overhang=TinyMoving.OVERHANG)
    expected[clip.tobytes()] = label
  found = {}
  for ex in tfds.as_numpy(builder.as_dataset(split='test')):
    assert ex['video'].shape == (frames, size, size, 1)
    assert ex['video'].dtype == np.uint8
    found[ex['video'].tobytes()] = ex['label']
  assert found == expected


def test_default_and_named_configs(tiny_config, tmp_path, monkeypatch):
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TRAIN', 3)
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TEST', 2)
  tiny_config.tfds_data_dir = str(tmp_path)
  tiny_config.tfds_download = False
  tiny_config.dataset = 'moving_fashion_mnist/frames8_size32'
  builder = pipeline.get_builder(tiny_config)
  assert builder.info.features['video'].shape == (8, 32, 32, 1)
  assert builder.info.splits['test'].num_examples == 2
  assert tfds.builder('moving_fashion_mnist').builder_config.name == (
      'frames16_size56')
