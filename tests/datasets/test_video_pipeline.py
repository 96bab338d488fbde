"""The clip pipeline: which frames a window takes (in training and in the
test views), crops and flips shared by a clip's frames, labels, and the
stream's exact resume.

The clips below say what became of them: channel 0 of frame t is 16 t
everywhere (its index), channel 1 is 20 i (the clip's), channel 2 is noise
plus 8 t. Crops, resizes and flips leave a constant channel as it is, and
shift channel 2 of every frame alike when they are the same for all frames.
"""

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax.configs import common
from vit_jax.data import local_datasets
from vit_jax.data import pipeline
from vit_jax.data import video

LENGTH, SIDE, CLASSES = 12, 20, 4


def _clip(split, i):
  noise = np.random.default_rng([split, i]).integers(0, 100, (SIDE, SIDE))
  t = np.arange(LENGTH)[:, None, None]
  return np.stack(np.broadcast_arrays(16 * t, 20 * i, noise + 8 * t),
                  -1).astype(np.uint8)


class Clips(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(
        builder=self, features=tfds.features.FeaturesDict({
            'video': tfds.features.Video((LENGTH, SIDE, SIDE, 3)),
            'label': tfds.features.ClassLabel(num_classes=CLASSES)}))

  def _split_generators(self, dl_manager):
    return {'train': self._generate_examples(0, 12),
            'test': self._generate_examples(1, 5)}

  def _generate_examples(self, split, count):
    for i in range(count):
      yield i, {'video': _clip(split, i), 'label': i % CLASSES}


@pytest.fixture(scope='module')
def clips(tmp_path_factory):
  builder = Clips(data_dir=str(tmp_path_factory.mktemp('clips')))
  builder.download_and_prepare()
  return builder


def _config(frames=3, stride=2, test_views=3, **pp):
  config = common.get_config()
  config.dataset = 'clips'
  config.pp.crop = 16
  config.pp.update(pp)
  config.shuffle_buffer = 100
  config.prefetch = 1
  config.video = ml_collections.ConfigDict(dict(
      frames=frames, stride=stride, test_views=test_views))
  return config


def _decode(videos):
  """(frame indices, clip indices, noise channel) of output clips."""
  pixels = (videos + 1) * 127.5  # [-1, 1] back to [0, 255]
  frame = pixels[..., 0].mean((-1, -2)) / 16
  clip = pixels[..., 1].mean((-1, -2)) / 20
  np.testing.assert_allclose(frame, np.rint(frame), atol=1e-3)
  np.testing.assert_allclose(clip, np.rint(clip), atol=1e-3)
  return np.rint(frame).astype(int), np.rint(clip).astype(int), pixels[..., 2]


def _batches(clips, config, steps, batch=4, **kw):
  info = video.dataset_info(clips, config)
  it = video.train_iterator(info, config, batch_size=batch, **kw)
  return [next(it) for _ in range(steps)]


def test_training_windows_and_labels(clips):
  config = _config(frames=3, stride=2)
  offsets = []
  for batch in _batches(clips, config, 6):
    assert batch['video'].shape == (4, 3, 16, 16, 3)
    assert batch['video'].dtype == np.float32
    frame, clip, _ = _decode(batch['video'])
    # One clip per example, its frames 2 apart from a random offset.
    assert (clip == clip[:, :1]).all()
    np.testing.assert_array_equal(frame - frame[:, :1], [[0, 2, 4]] * 4)
    offsets.extend(frame[:, 0])
    np.testing.assert_array_equal(
        batch['label'], np.eye(CLASSES, dtype=np.float32)[clip[:, 0] % 4])
  # 24 draws from the 8 offsets that fit (0..7): all in range, and varied.
  assert 0 <= min(offsets) and max(offsets) <= LENGTH - 5
  assert len(set(offsets)) >= 5


def test_crop_and_flip_shared_by_the_frames(clips):
  config = _config(frames=4, stride=3, area_min=0.2)
  views = {}  # clip -> its first frame's noise less 8 t, each epoch
  for batch in _batches(clips, config, 6):  # two epochs of the 12 clips
    frame, clip, noise = _decode(batch['video'])
    # The same crop and flip for every frame: channel 2 differs by 8 t.
    shift = noise - noise[:, :1]
    expected = 8 * (frame - frame[:, :1])[..., None, None]
    np.testing.assert_allclose(shift, np.broadcast_to(expected, shift.shape),
                               atol=1e-3)
    for b in range(4):
      views.setdefault(clip[b, 0], []).append(noise[b, 0] - 8 * frame[b, 0])
  # Each epoch crops (or flips) a clip anew.
  assert sorted(len(v) for v in views.values()) == [2] * 12
  assert sum(not np.allclose(*v, atol=1) for v in views.values()) >= 10


def test_resume_and_rows(clips):
  config = _config()
  batches = _batches(clips, config, 5)
  again = _batches(clips, config, 2, start_step=3)
  for a, b in zip(batches[3:], again):
    np.testing.assert_array_equal(a['video'], b['video'])
    np.testing.assert_array_equal(a['label'], b['label'])
  rows = _batches(clips, config, 5, rows=[1, 3])
  for a, b in zip(batches, rows):
    np.testing.assert_array_equal(a['video'][[1, 3]], b['video'])
  config.seed = 1
  other = _batches(clips, config, 5)
  assert any((a['video'] != b['video']).any()
             for a, b in zip(batches, other))


@pytest.mark.parametrize('views,offsets', [(3, [0, 4, 7]), (4, [0, 2, 5, 7]),
                                           (1, [3])])
def test_test_views_cover_the_clip(clips, views, offsets):
  # A window spans 5 frames of 12: offsets 0..7, evenly (0, 3.5, 7 rounds
  # half to even: 4).
  config = _config(frames=3, stride=2, test_views=views, resize=18)
  info = video.dataset_info(clips, config)
  batches = list(video.eval_batches(info, config, batch_size=4))
  assert len(batches) == 2
  out = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  assert out['video'].shape == (8, views, 3, 16, 16, 3)
  np.testing.assert_array_equal(out['mask'], [1] * 5 + [0] * 3)
  frame, clip, noise = _decode(out['video'][:5])
  # Every clip once (in the order tfds wrote them), all its views its own.
  assert (clip == clip[:, :1, :1]).all()
  assert sorted(clip[:, 0, 0]) == list(range(5))
  expected = np.array(offsets)[:, None] + [0, 2, 4]
  np.testing.assert_array_equal(frame, np.broadcast_to(expected, frame.shape))
  np.testing.assert_array_equal(out['label'][:5],
                                np.eye(CLASSES)[clip[:, 0, 0] % 4])
  # The centre 16 of the frames resized to 18, the same for every frame.
  shift = noise - noise[:, :1, :1]
  expected = 8 * (frame - frame[:, :1, :1])[..., None, None]
  np.testing.assert_allclose(shift, np.broadcast_to(expected, shift.shape),
                             atol=1e-3)
  # Without a resize, the crop is the frame: the noise exactly.
  config = _config(frames=3, stride=2, test_views=views)
  config.pp.crop = SIDE
  info = video.dataset_info(clips, config)
  first = next(video.eval_batches(info, config, batch_size=4))
  frame, clip, noise = _decode(first['video'][:1])
  np.testing.assert_allclose(noise[0, 0, 0],
                             _clip(1, clip[0, 0, 0])[offsets[0], ..., 2],
                             atol=1e-3)


def test_windows_that_do_not_fit(clips):
  config = _config(frames=5, stride=3)  # spans 13 frames of 12
  with pytest.raises(ValueError, match='spans 13 frames; the clips have 12'):
    _batches(clips, config, 1)
  with pytest.raises(ValueError, match='0 test views: expected at least 1'):
    video.test_offsets(12, 3, 2, 0)
  config = _config()
  del config.video
  with pytest.raises(ValueError, match='needs config.video'):
    _batches(clips, config, 1)


def test_gray_clips_of_moving_fashion_mnist(tiny_config, tmp_path,
                                            monkeypatch):
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TRAIN', 8)
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TEST', 3)
  tiny_config.tfds_data_dir = str(tmp_path)
  tiny_config.dataset = 'moving_fashion_mnist/frames8_size32'
  tiny_config.pp.crop = 24
  tiny_config.video = ml_collections.ConfigDict(dict(frames=4, stride=2,
                                                     test_views=2))
  info = video.dataset_info(pipeline.get_builder(tiny_config), tiny_config)
  assert (info.num_classes, info.channels) == (10, 1)
  batch = next(video.train_iterator(info, tiny_config, batch_size=8))
  assert batch['video'].shape == (8, 4, 24, 24, 3)
  assert (batch['video'][..., :1] == batch['video']).all()
  assert batch['video'].max() > 0.5  # the item shows
  test = next(video.eval_batches(info, tiny_config, batch_size=8))
  assert test['video'].shape == (8, 2, 4, 24, 24, 3)
  with pytest.raises(ValueError, match='has no video feature'):
    tiny_config.dataset = 'fashion_mnist_local'
    video.dataset_info(pipeline.get_builder(tiny_config), tiny_config)
