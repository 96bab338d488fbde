"""Input pipeline: local builder, shapes, ranges, determinism, resume, eval."""

import io
import os
import time

import numpy as np
import ml_collections
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from tests.conftest import fake_fashion_mnist, write_idx
from vit_jax.convert import transform
from vit_jax.data import local_datasets
from vit_jax.data import pipeline


def _info(config):
  return pipeline.dataset_info(
      pipeline.get_builder(config), config)


def _take(it, n):
  return [next(it) for _ in range(n)]


def test_local_builder_reads_idx_files(tiny_config):
  info = _info(tiny_config)
  assert (info.num_train, info.num_test, info.num_classes) == (96, 37, 10)
  manual = tiny_config.tfds_manual_dir
  raw = local_datasets._read_idx(f'{manual}/train-images-idx3-ubyte.gz')
  raw_labels = local_datasets._read_idx(f'{manual}/train-labels-idx1-ubyte.gz')
  index = {image.tobytes(): i for i, image in enumerate(raw)}
  seen = []
  for ex in info.builder.as_dataset(split='train'):
    i = index[ex['image'].numpy()[..., 0].tobytes()]
    assert int(ex['label']) == raw_labels[i]
    seen.append(i)
  assert sorted(seen) == list(range(96))


def test_train_batches(tiny_config):
  info = _info(tiny_config)
  batch = next(pipeline.train_iterator(info, tiny_config, batch_size=8))
  assert batch['image'].shape == (8, 32, 32, 3)
  assert batch['image'].dtype == np.float32
  assert batch['image'].min() >= -1 and batch['image'].max() <= 1
  assert batch['image'].min() < -0.5 and batch['image'].max() > 0.5
  # Gray images become three equal channels.
  np.testing.assert_array_equal(batch['image'][..., 0], batch['image'][..., 2])
  np.testing.assert_array_equal(batch['label'].sum(-1), np.ones(8))


def test_train_deterministic_and_seeded(tiny_config):
  info = _info(tiny_config)
  a = _take(pipeline.train_iterator(info, tiny_config, batch_size=8), 3)
  b = _take(pipeline.train_iterator(info, tiny_config, batch_size=8), 3)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x['image'], y['image'])
  tiny_config.seed = 1
  c = _take(pipeline.train_iterator(info, tiny_config, batch_size=8), 3)
  assert not np.allclose(a[0]['image'], c[0]['image'])


def test_process_rows_split_the_global_stream(tiny_config):
  """Two processes' rows (3 of them across an epoch boundary) put together
  are the global batches, whatever the split of rows."""
  info = _info(tiny_config)
  full = _take(pipeline.train_iterator(info, tiny_config, batch_size=8,
                                             start_step=10), 4)
  for rows in ([0, 1, 2, 3], [0, 2, 5, 7]):
    other = [r for r in range(8) if r not in rows]
    mine = _take(pipeline.train_iterator(
        info, tiny_config, batch_size=8, start_step=10, rows=rows), 4)
    theirs = _take(pipeline.train_iterator(
        info, tiny_config, batch_size=8, start_step=10, rows=other), 4)
    for x, a, b in zip(full, mine, theirs):
      np.testing.assert_array_equal(x['image'][rows], a['image'])
      np.testing.assert_array_equal(x['image'][other], b['image'])
      np.testing.assert_array_equal(x['label'][other], b['label'])


def test_process_rows_follow_the_mesh():
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax.platform import sharding  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh([('data', -1)])
  assert sharding.process_rows(mesh, 16) == list(range(16))  # one process
  mesh = sharding.make_mesh([('data', 2), ('model', -1)])
  assert sharding.process_rows(mesh, 4) == [0, 1, 2, 3]
  assert jax.process_count() == 1


def test_resume_continues_the_stream(tiny_config):
  """Starting at step k gives batches k, k+1, ... of a fresh stream, across
  epoch boundaries (96 examples = 12 batches of 8 an epoch)."""
  info = _info(tiny_config)
  full = _take(pipeline.train_iterator(info, tiny_config, batch_size=8),
               27)
  for start in (5, 12, 23):
    resumed = _take(pipeline.train_iterator(
        info, tiny_config, batch_size=8, start_step=start), 27 - start)
    for x, y in zip(full[start:], resumed):
      np.testing.assert_array_equal(x['image'], y['image'])
      np.testing.assert_array_equal(x['label'], y['label'])


def test_each_epoch_is_a_reshuffled_permutation(tiny_config):
  tiny_config.pp.crop = 28
  tiny_config.pp.area_min = 1.0
  tiny_config.pp.flip = False
  info = _info(tiny_config)
  raw = local_datasets._read_idx(
      f'{tiny_config.tfds_manual_dir}/train-images-idx3-ubyte.gz')
  flat_raw = {raw[i].tobytes(): i for i in range(len(raw))}
  batches = _take(pipeline.train_iterator(info, tiny_config,
                                                batch_size=8), 24)
  images = np.concatenate([b['image'][..., 0] for b in batches])
  pixels = np.rint((images + 1) * 127.5).astype(np.uint8)
  order = [flat_raw[p.tobytes()] for p in pixels]
  assert sorted(order[:96]) == list(range(96))
  assert sorted(order[96:]) == list(range(96))
  assert order[:96] != order[96:]


def test_eval_covers_every_example_once(tiny_config):
  info = _info(tiny_config)
  batches = list(pipeline.eval_batches(info, tiny_config, batch_size=10))
  assert len(batches) == 4  # 37 examples -> 3 full batches + 7 and 3 pads
  mask = np.concatenate([b['mask'] for b in batches])
  assert mask.sum() == 37 and mask[:37].all() and not mask[37:].any()
  labels = np.concatenate([b['label'] for b in batches])[:37].argmax(-1)
  np.testing.assert_array_equal(np.sort(labels), np.sort(np.arange(37) % 10))
  assert batches[0]['image'].shape == (10, 32, 32, 3)


def test_eval_central_crop(tiny_config):
  tiny_config.pp.resize = 40
  info = _info(tiny_config)
  batch = next(pipeline.eval_batches(info, tiny_config, batch_size=4))
  assert batch['image'].shape == (4, 32, 32, 3)


def _smooth_image(h, w):
  """A smooth colour image (resampling filters then differ little)."""
  y, x = np.mgrid[:h, :w]
  return np.stack([255 * x / w, 255 * y / h, 127 + 100 * np.sin(x / 9.)],
                  -1).astype(np.uint8)


@pytest.mark.parametrize('interpolation', ['bilinear', 'bicubic'])
def test_eval_crop_pct_as_timm(interpolation):
  """pp.crop_pct: the short side to crop / crop_pct, a central crop, and
  ImageNet normalization, close to timm's (PIL) transform of the image."""
  image = _smooth_image(150, 200)
  pp = dict(crop=64, crop_pct=0.875, interpolation=interpolation,
            mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
  got = pipeline.preprocess_eval(image, ml_collections.ConfigDict(pp))
  want = transform.prepare(
      _png(image),
      transform.Transform(64, crop_pct=0.875, crop_mode='center',
                           interpolation=interpolation, mean=pp['mean'],
                           std=pp['std']))
  assert got.shape == want.shape == (64, 64, 3)
  # Same geometry and normalization; TF's and PIL's filters differ a little.
  np.testing.assert_allclose(got, want, atol=0.02)  # measured 0.009
  assert np.abs(np.asarray(got) - want).mean() < 0.008  # measured 0.0044
  # Squashing instead (no crop_pct) puts other pixels there.
  del pp['crop_pct']
  squashed = pipeline.preprocess_eval(image,
                                            ml_collections.ConfigDict(pp))
  assert np.abs(np.asarray(squashed) - want).max() > 0.3


def test_eval_default_is_the_original_minus_one_to_one():
  image = _smooth_image(32, 32)
  got = pipeline.preprocess_eval(
      image, ml_collections.ConfigDict(dict(crop=32)))
  np.testing.assert_allclose(got, image / 127.5 - 1, atol=1e-6)


def _png(image):
  out = io.BytesIO()
  Image.fromarray(image).save(out, format='PNG')
  return out.getvalue()


def _image_folder(root, num_train, num_test=3):
  """{root}/{train,test}/{cat,dog}/{i}.png: random 20x24 images."""
  rng = np.random.default_rng(0)
  for split, n in (('train', num_train), ('test', num_test)):
    for cls in ('cat', 'dog'):
      os.makedirs(root / split / cls)
      for i in range(n):
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), np.uint8)).save(
            root / split / cls / f'{i}.png')
  return str(root)


def test_image_folder(tmp_path, tiny_config):
  tiny_config.dataset = _image_folder(tmp_path, 6)
  info = _info(tiny_config)
  assert (info.num_train, info.num_test, info.num_classes) == (12, 6, 2)
  batch = next(pipeline.train_iterator(info, tiny_config, batch_size=4))
  assert batch['image'].shape == (4, 32, 32, 3)
  mask = np.concatenate([b['mask'] for b in pipeline.eval_batches(
      info, tiny_config, batch_size=4)])
  assert mask.sum() == 6


def test_a_folders_file_that_is_no_image_is_named(tmp_path, tiny_config,
                                                  capfd):
  """TensorFlow's decoder names no file: the run names it in one line; with
  skip_bad_images it is left out before the run, and a note counts it."""
  tiny_config.dataset = _image_folder(tmp_path, 6)
  broken = tmp_path / 'test' / 'dog' / 'broken.png'
  broken.write_text('not an image')
  info = _info(tiny_config)
  assert info.num_test == 7
  with pytest.raises(ValueError) as error:
    list(pipeline.eval_batches(info, tiny_config, batch_size=4))
  assert str(error.value).startswith(f'{broken} is not an image that can be '
                                     'decoded: remove it, or pass '
                                     '--config.skip_bad_images=True')
  tiny_config.skip_bad_images = True
  info = _info(tiny_config)
  assert (info.num_train, info.num_test) == (12, 6)
  mask = np.concatenate([b['mask'] for b in pipeline.eval_batches(
      info, tiny_config, batch_size=4)])
  assert mask.sum() == 6
  assert (f'Note: skipped 1 file(s) of {tmp_path} that are no images (the '
          f'first: {broken}).') in capfd.readouterr().err


def _eval_images(info, config):
  batches = list(pipeline.eval_batches(info, config, batch_size=4))
  images = np.concatenate([b['image'] for b in batches])
  mask = np.concatenate([b['mask'] for b in batches]) > 0
  return {image.tobytes() for image in images[mask]}


def test_image_folder_sub_splits(tmp_path, tiny_config):
  """'folder:' specs cut a folder as tfds' split specs: 'train[:60%]' and
  'train[60%:]' part the 20 training images."""
  tiny_config.dataset = _image_folder(tmp_path, 10)
  tiny_config.pp.train = 'folder:train[:60%]'
  tiny_config.pp.test = 'folder:train[60%:]'
  info = _info(tiny_config)
  assert (info.num_train, info.num_test) == (12, 8)
  held_out = _eval_images(info, tiny_config)
  tiny_config.pp.test = 'folder:train[:60%]'
  trained_on = _eval_images(_info(tiny_config), tiny_config)
  tiny_config.pp.test = 'train'  # a subfolder's name reads it
  everything = _eval_images(_info(tiny_config), tiny_config)
  assert len(held_out) == 8 and len(trained_on) == 12
  assert not held_out & trained_on and held_out | trained_on == everything
  batch = next(pipeline.train_iterator(info, tiny_config, batch_size=4))
  assert batch['image'].shape == (4, 32, 32, 3)
  tiny_config.pp.test = 'folder:validation[:10%]'
  with pytest.raises(ValueError, match="Split 'validation"):
    _info(tiny_config)


def test_image_folder_ignores_tfds_specs(tmp_path, tiny_config, caplog):
  """A folder's train/ and test/ are read whatever a tfds dataset's specs
  say, as the original release reads them: 'train[90%:]' does not turn 10%
  of the training images into the test split; a warning says so."""
  tiny_config.dataset = _image_folder(tmp_path, 10)
  test_only = _eval_images(_info(tiny_config), tiny_config)
  assert 'is for tfds datasets' not in caplog.text
  tiny_config.pp.train, tiny_config.pp.test = 'train[:90%]', 'train[90%:]'
  info = _info(tiny_config)
  assert "test reads its test/" in caplog.text
  assert "'folder:train[90%:]' would cut the folder" in caplog.text
  assert (info.train_split, info.test_split) == ('train', 'test')
  assert (info.num_train, info.num_test) == (20, 6)
  assert _eval_images(info, tiny_config) == test_only
  tiny_config.pp.test = 'validation'  # ImageNet's: no such subfolder
  assert _info(tiny_config).num_test == 6


def test_unknown_dataset(tiny_config):
  tiny_config.dataset = 'no_such_dataset_xyz'
  with pytest.raises(ValueError, match="Unknown dataset 'no_such_dataset_xyz'"):
    pipeline.get_builder(tiny_config)


def test_unprepared_dataset_fails_fast(tiny_config, tmp_path):
  tiny_config.dataset = 'cifar10'
  tiny_config.tfds_data_dir = str(tmp_path)
  start = time.time()
  with pytest.raises(FileNotFoundError, match='cannot download'):
    pipeline.get_builder(tiny_config)
  assert time.time() - start < 30


def test_download_when_online(tiny_config, tmp_path, monkeypatch):
  """With the network, an unprepared tfds dataset is downloaded once; with
  tfds_download off it fails at once, saying so."""
  tiny_config.dataset = 'cifar10'
  tiny_config.tfds_data_dir = str(tmp_path)
  calls = []
  monkeypatch.setattr(pipeline, '_online', lambda: True)
  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare',
                      lambda self, **kw: calls.append(self.name))
  assert pipeline.get_builder(tiny_config).name == 'cifar10'
  assert calls == ['cifar10']
  tiny_config.tfds_download = False
  with pytest.raises(FileNotFoundError, match='tfds_download is off'):
    pipeline.get_builder(tiny_config)


def test_missing_manual_files(tiny_config, tmp_path):
  tiny_config.tfds_manual_dir = str(tmp_path)
  tiny_config.tfds_data_dir = str(tmp_path / 'data')
  with pytest.raises(FileNotFoundError, match='apt-get install'):
    pipeline.get_builder(tiny_config)


def test_truncated_idx(tmp_path):
  write_idx(tmp_path / 'x.gz', np.zeros((5, 28, 28), np.uint8))
  with open(tmp_path / 'x.gz', 'rb') as f:
    data = f.read()
  import gzip  # pylint: disable=g-import-not-at-top
  raw = gzip.decompress(data)[:-10]
  with gzip.open(tmp_path / 'y.gz', 'wb') as f:
    f.write(raw)
  with pytest.raises(ValueError, match='truncated'):
    local_datasets._read_idx(str(tmp_path / 'y.gz'))


def test_unknown_split(tiny_config):
  tiny_config.pp.test = 'validation'
  with pytest.raises(ValueError, match="Split 'validation'"):
    _info(tiny_config)


def test_fake_data_helper_is_learnable(tmp_path):
  # The class is in the image, so the training tests can check learning.
  root = fake_fashion_mnist(str(tmp_path), n_train=20, n_test=10)
  images = local_datasets._read_idx(f'{root}/train-images-idx3-ubyte.gz')
  labels = local_datasets._read_idx(f'{root}/train-labels-idx1-ubyte.gz')
  rows = images.mean(-1).argmax(-1)
  np.testing.assert_array_equal((rows - 4) // 2, labels)


def test_mnist5k_builder(tmp_path, tiny_config):
  import gzip  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  labels = np.repeat(np.arange(10), 110)
  rows = np.concatenate([rng.integers(0, 255, (1100, 784)), labels[:, None]],
                        1)
  with gzip.open(tmp_path / 'mnist_5k.csv.gz', 'wt') as f:
    np.savetxt(f, rows, fmt='%d', delimiter=',')
  tiny_config.dataset = 'mnist5k'
  tiny_config.tfds_manual_dir = str(tmp_path)
  tiny_config.tfds_data_dir = str(tmp_path / 'data')
  info = _info(tiny_config)
  assert (info.num_train, info.num_test) == (100, 1000)
  test = info.builder.as_dataset(split='test')
  counts = np.bincount([int(ex['label']) for ex in test], minlength=10)
  np.testing.assert_array_equal(counts, np.full(10, 100))
  # The held-out split is each class's last 100 rows.
  held_out = {ex['image'].numpy().tobytes() for ex in test}
  last = rows[labels == 3][-100:, :-1].reshape(-1, 28, 28, 1).astype(np.uint8)
  assert all(im.tobytes() in held_out for im in last)
