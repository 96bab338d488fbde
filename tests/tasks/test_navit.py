"""NaViT's task: packed training batches (labels, exact resume, rows), the
loss over real images, evaluation covering every test image, and short
runs of both arms of configs/navit_fmnist.py on tiny Fashion-MNIST."""

import collections
import json

import numpy as np
import pytest

from vit_jax import launch
from vit_jax.configs import navit_fmnist
from vit_jax.data import navit as navit_data
from vit_jax.data import packing
from vit_jax.data import pipeline
from vit_jax.run import progress
from vit_jax.tasks import navit


def _config(fmnist_dirs, arm='navit', steps=40):
  """An arm of configs/navit_fmnist.py as a short job on tiny data, its
  model thinner (the packing is the config's)."""
  config = navit_fmnist.get_config(arm).unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.total_steps, config.progress_every = steps, 20
  config.shuffle_buffer, config.checkpoint_every = 100, 0
  config.model.hidden_size = 16
  config.model.transformer.update(num_layers=1, mlp_dim=32, num_heads=2)
  config.batch_eval = 8 if arm == 'navit' else 16
  if arm == 'vit28':
    config.batch = 16  # the tiny split has 96 images
  return config


def _info(config):
  return pipeline.dataset_info(pipeline.get_builder(config),
                                         config)


def _take(config, n, **kw):
  stream = navit_data.train_batches(_info(config), config, **kw)
  return [next(stream) for _ in range(n)]


def test_training_batches_hold_whole_labeled_images(fmnist_dirs):
  config = _config(fmnist_dirs)
  config.navit.drop_rate = (0.0, 0.5)
  recipes = packing.Recipes(config.seed, navit_data.sampling(config))
  counts = collections.Counter()
  for batch in _take(config, 2, batch_size=4):
    assert batch['patches'].shape == (4, 256, 147)
    for b in range(4):
      seg, labels = batch['segment_ids'][b], batch['labels'][b]
      images = int(seg.max())
      assert np.all(labels[:images] >= 0) and np.all(labels[images:] == -1)
      assert set(np.unique(seg)) - {0} == set(range(1, images + 1))
      assert np.all(np.diff(seg[seg > 0]) >= 0)  # images are contiguous
      assert np.all(seg[np.argmin(seg > 0):] == 0) or seg.all()
      for k in range(1, images + 1):
        at = seg == k
        h, w = batch['heights'][b][at], batch['widths'][b][at]
        assert len(set(h)) == len(set(w)) == 1
        assert 1 <= at.sum() <= h[0] * w[0]  # some tokens dropped
        assert np.all(batch['rows'][b][at] < h) and np.all(
            batch['cols'][b][at] < w)
        counts[int(labels[k - 1])] += 1
    assert packing.efficiency(batch['segment_ids']) > 0.9
  assert len(counts) >= 8  # labels of many classes
  # The first sequence's first image is stream position 0, as its recipe.
  first = _take(config, 1, batch_size=4)[0]
  at = first['segment_ids'][0] == 1
  assert at.sum() == recipes[0]['tokens']
  assert first['heights'][0][at][0] == recipes[0]['height']


def test_labels_are_the_images_own(fmnist_dirs):
  # The fake images carry their label as a bright band at rows 2l+4..2l+6:
  # packed alone at 28 px (one image per sequence, no crop), it is readable.
  config = _config(fmnist_dirs)
  config.navit.update(side_range=(28, 28), aspect_range=(1.0, 1.0))
  config.model.max_images = 1
  config.pp.flip = False
  for batch in _take(config, 2, batch_size=8):
    for b in range(8):
      patches = batch['patches'][b, :16].reshape(4, 4, 7, 7, 3)
      image = patches.transpose(0, 2, 1, 3, 4).reshape(28, 28, 3)
      band = int(np.argmax(image[:, :, 0].mean(1)))
      assert (band - 4) // 2 == batch['labels'][b, 0]


def test_resume_continues_the_same_stream(fmnist_dirs):
  config = _config(fmnist_dirs)
  config.navit.drop_rate = (0.0, 0.5)
  whole = _take(config, 6, batch_size=4)
  resumed = _take(config, 2, batch_size=4, start_step=4)
  for a, b in zip(whole[4:], resumed):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  rows = _take(config, 3, batch_size=4, rows=[1, 3], start_step=3)
  for a, b in zip(whole[3:], rows):
    for k in a:
      np.testing.assert_array_equal(a[k][[1, 3]], b[k])
  other = config.copy_and_resolve_references()
  other.seed = 1
  assert not np.array_equal(_take(other, 1, batch_size=4)[0]['labels'],
                            whole[0]['labels'])


def test_the_loss_counts_only_real_images():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  labels = np.array([[4, 0, -1], [2, -1, -1]])
  want = []
  for b, k in ((0, 0), (0, 1), (1, 0)):
    z = logits[b, k] - logits[b, k].max()
    want.append(np.log(np.exp(z).sum()) - z[labels[b, k]])
  got = navit.image_loss(logits, labels)
  np.testing.assert_allclose(got, np.mean(want), rtol=1e-5)
  logits[0, 2] += 100.  # an absent image costs nothing
  np.testing.assert_allclose(navit.image_loss(logits, labels), got,
                             rtol=1e-6)


@pytest.mark.parametrize('side', [14, 56, None])
def test_evaluation_packs_every_test_image_once(fmnist_dirs, side):
  config = _config(fmnist_dirs)
  info = _info(config)
  pairs = list(navit_data.eval_images(info, config))
  if side is None:
    sizes = navit_data.sampling(config, drop_rate=0.0)
    recipes = packing.Recipes(config.seed, sizes, stream=1)
    examples = (navit_data.mixed(i, im, lb, recipes, sizes, config.pp)
                for i, (im, lb) in enumerate(pairs))
  else:
    examples = (navit_data.fixed_side(im, lb, side, 7, config.pp)
                for im, lb in pairs)
  batches = list(navit_data.packed_test_batches(examples, config, 8))
  labels = np.concatenate([b['labels'].ravel() for b in batches])
  assert sorted(labels[labels >= 0]) == sorted(lb for _, lb in pairs)
  if side is not None:
    seg = np.concatenate([b['segment_ids'] for b in batches])
    heights = np.concatenate([b['heights'] for b in batches])
    assert (seg > 0).sum() == len(pairs) * (side // 7)**2
    assert set(heights[seg > 0]) == {side // 7}


def test_bad_navit_settings_fail_before_compiling(fmnist_dirs, tmp_path):
  config = _config(fmnist_dirs)
  del config.navit['window']
  with pytest.raises(ValueError, match=r"lacks \['window'\]"):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = _config(fmnist_dirs)
  config.navit.max_tokens = 49
  with pytest.raises(ValueError, match='8x8 patches does not fit'):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
  config = _config(fmnist_dirs)
  config.navit.eval_sides = (14, 140)
  config.navit.max_tokens = 400
  with pytest.raises(ValueError, match='exceeds config.model.max_grid=16'):
    launch.train_and_evaluate(config, str(tmp_path / 'c'))


def test_navit_arm_writes_accuracies_and_efficiency(fmnist_dirs, tmp_path,
                                                    capsys):
  launch.train_and_evaluate(_config(fmnist_dirs), str(tmp_path))
  results = json.loads((tmp_path / 'results.json').read_text())
  for key in ('accuracy_14px', 'accuracy_28px', 'accuracy_42px',
              'accuracy_56px', 'accuracy_mixed'):
    assert 0 <= results[key] <= 1
  assert results['packing_efficiency'] >= 0.9
  assert results['step'] == 40
  assert 'packing efficiency' in capsys.readouterr().out
  # trainer='evaluate' reads the workdir's NaViT back and runs its own
  # evaluator: the same accuracies as at the end of training.
  config = _config(fmnist_dirs)
  config.trainer = 'evaluate'
  launch.train_and_evaluate(config, str(tmp_path))
  again = json.loads((tmp_path / 'eval_results.json').read_text())
  for key in ('accuracy_14px', 'accuracy_56px', 'accuracy_mixed'):
    assert again[key] == pytest.approx(results[key])


def test_speed_counts_images_not_sequences(fmnist_dirs):
  """A packed step holds a varying number of images: img/s sums the
  steps' `images`, not steps x config.batch (16 sequences)."""
  written = {}

  class Writer:

    def write_scalars(self, step, scalars):
      del step
      written.update(scalars)

  reporter = progress.Progress(_config(fmnist_dirs), Writer(), 0)
  reporter._previous_step, reporter._previous_time = 0, 100.0
  reporter.add({'loss': np.float32(1.0), 'images': np.int32(30)})
  reporter.add({'loss': np.float32(2.0), 'images': np.int32(50)})
  reporter._apply(2, 110.0)
  assert written['img_per_sec'] == pytest.approx(8.0)  # 80 images in 10 s
  assert written['train_loss'] == pytest.approx(1.5)
  assert 'images' not in written


def test_vit28_arm_is_evaluated_at_every_side(fmnist_dirs, tmp_path):
  launch.train_and_evaluate(_config(fmnist_dirs, 'vit28', steps=8),
                           str(tmp_path))
  results = json.loads((tmp_path / 'results.json').read_text())
  for side in (14, 42, 56):
    assert 0 <= results[f'accuracy_{side}px'] <= 1
  # At its own 28 px the resized path is the input pipeline's test accuracy.
  assert results['accuracy_28px'] == pytest.approx(results['accuracy'])
