"""Dense depth and DPT on the scenes: Depth Anything's loss and the relative
depth metrics against numpy from their equations; the configs
segmentation_fmnist.py:dpt and :depth run offline and write their metrics."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax import launch
from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.configs import segmentation_fmnist
from vit_jax.data import local_datasets
from vit_jax.evaluators import depth as depth_eval


def _maps(seed, batch=4, size=(6, 7)):
  """Predictions, true disparities of a few levels (ties, as the scenes'),
  and known pixels: an even count, an odd one, all, and none."""
  rng = np.random.default_rng(seed)
  prediction = rng.normal(size=(batch, *size)).astype(np.float32)
  target = rng.integers(1, 6, (batch, *size)).astype(np.float32)
  valid = rng.uniform(size=target.shape) < 0.7
  valid[0].flat[:] = np.arange(valid[0].size) < 18  # even
  valid[1].flat[:] = np.arange(valid[1].size) < 23  # odd
  valid[2] = True
  valid[3] = False
  return prediction, target, valid


def _affine_invariant_numpy(prediction, target, valid):
  """Depth Anything's eq.: d^ = (d - median d) / mean |d - median d| over
  the known pixels, loss mean |d^_pred - d^_true|, averaged over images."""
  def normalized(d):
    t = np.median(d)
    return (d - t) / np.mean(np.abs(d - t))
  return np.mean([np.mean(np.abs(normalized(p[v]) - normalized(g[v])))
                  for p, g, v in zip(prediction, target, valid) if v.any()])


def test_affine_invariant_loss_is_its_equation():
  prediction, target, valid = _maps(0)
  loss = lambda p: float(losses.affine_invariant_depth(p, target, valid))
  want = _affine_invariant_numpy(prediction, target, valid)
  np.testing.assert_allclose(loss(prediction), want, rtol=1e-5)
  # Blind to the scale and shift of the prediction (a positive scale), not
  # to its shape; 0 on the truth up to scale and shift.
  np.testing.assert_allclose(loss(3 * prediction - 2), want, rtol=1e-5)
  assert loss(prediction ** 3) > want * 1.05 or loss(prediction ** 3) < (
      want * 0.95)
  assert loss(0.5 * target + 7) < 1e-6
  grads = jax.grad(lambda p: losses.affine_invariant_depth(p, target, valid))(
      jnp.asarray(prediction))
  assert np.isfinite(grads).all() and not np.any(grads[3])


def test_masked_median_is_numpys():
  prediction, _, valid = _maps(1)
  got = losses.masked_median(prediction.reshape(4, -1), valid.reshape(4, -1))
  want = [np.median(p[v]) for p, v in zip(prediction[:3], valid[:3])]
  np.testing.assert_allclose(got[:3], want, rtol=1e-6)
  assert got[3] == 0


def _depth_errors_numpy(prediction, disparity, valid):
  """MiDaS's protocol, by numpy's least squares: disparity aligned, held
  above 1 / the largest true depth, then AbsRel and delta1 on depth."""
  out = []
  for p, g, v in zip(prediction, disparity, valid):
    p, g = p[v].astype(np.float64), g[v].astype(np.float64)
    (s, t), *_ = np.linalg.lstsq(np.stack([p, np.ones_like(p)], 1), g,
                                 rcond=None)
    depth, true = 1 / np.maximum(s * p + t, g.min()), 1 / g
    out.append((np.mean(np.abs(depth - true) / true),
                np.mean(np.maximum(depth / true, true / depth) < 1.25)))
  return np.array(out)


def test_depth_metrics_are_midas_protocol():
  prediction, disparity, valid = _maps(2)
  # A prediction that is the truth's disparity up to scale and shift, with
  # noise: an alignment gone wrong leaves large errors.
  prediction = -0.3 * disparity + 4 + 0.3 * prediction
  abs_rel, delta1 = depth_eval.depth_errors(prediction, disparity, valid)
  want = _depth_errors_numpy(prediction[:3], disparity[:3], valid[:3])
  np.testing.assert_allclose(abs_rel[:3], want[:, 0], rtol=1e-4)
  np.testing.assert_allclose(delta1[:3], want[:, 1], rtol=1e-6)
  assert 0.05 < want[:, 0].min() and want[:, 1].min() < 1  # not trivial
  assert abs_rel[3] == 0 and delta1[3] == 0  # no pixel known
  abs_rel, delta1 = depth_eval.depth_errors(2 * disparity - 1, disparity,
                                            valid)
  np.testing.assert_allclose(abs_rel[:3], 0, atol=1e-5)
  np.testing.assert_allclose(delta1[:3], 1)


@pytest.fixture(scope='module')
def scenes_dir(fmnist_dirs, tmp_path_factory):
  """A tfds data_dir with 24 + 10 tiny scenes, prepared once."""
  data_dir = str(tmp_path_factory.mktemp('scenes'))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(local_datasets.FashionMnistScenes, 'NUM_TRAIN', 24)
    patch.setattr(local_datasets.FashionMnistScenes, 'NUM_TEST', 10)
    local_datasets.FashionMnistScenes(data_dir=data_dir).download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            manual_dir=fmnist_dirs[0]))
  return data_dir


def _config(arm, scenes_dir):
  """configs/segmentation_fmnist.py:ARM on the tiny scenes, 40 steps of 8
  images at 28 px (a 4x4 grid; the output upsampled to the 56 px labels);
  its ViT at initialization, both it and the DPT head narrower (compiling
  and running them is the test's cost)."""
  config = segmentation_fmnist.get_config(arm).unlock()
  config.model.hidden_size, config.model.transformer.mlp_dim = 32, 64
  config.segmentation.dpt.update(features=8, out_channels=(8, 8, 16, 16))
  config.tfds_data_dir = scenes_dir
  config.tfds_download = False
  config.pretrained_path = ''
  config.pp.crop = 28
  config.update(total_steps=40, warmup_steps=1, batch=8, batch_eval=8,
                progress_every=20, checkpoint_every=40, shuffle_buffer=24)
  return config


def test_dpt_config_writes_miou(scenes_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  launch.train_and_evaluate(_config('dpt', scenes_dir), workdir)
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 < results['miou'] <= 1 and len(results['iou_per_class']) == 11


def test_depth_config_writes_abs_rel(scenes_dir, tmp_path):
  workdir = str(tmp_path / 'run')
  config = _config('depth', scenes_dir)
  launch.train_and_evaluate(config, workdir)
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 < results['abs_rel'] < 1 and 0 < results['delta1'] <= 1
  # The export (encoder, DPT head; no BatchNorm) evaluates to the same.
  exported = files.load(os.path.join(workdir, 'ViT-fmnist.npz'))
  assert sorted(exported) == ['backbone', 'dpt']  # params/ is unwrapped
  config.trainer = 'evaluate'
  config.pretrained_path = os.path.join(workdir, 'ViT-fmnist.npz')
  again = launch.evaluate(config, str(tmp_path / 'eval'))
  assert again['abs_rel'] == pytest.approx(results['abs_rel'], abs=1e-6)


def test_linear_head_predicts_depth(scenes_dir, tmp_path):
  """The linear probe with the depth target: one output channel, the
  depth evaluator's metrics."""
  config = _config('depth', scenes_dir)
  config.segmentation.head = 'linear'
  del config.segmentation['dpt']
  config.update(total_steps=4, progress_every=2, checkpoint_every=0,
                base_lr=1e-2)
  workdir = str(tmp_path / 'run')
  launch.train_and_evaluate(config, workdir)
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 < results['abs_rel'] < 1 and 0 < results['delta1'] <= 1
  head = files.load(os.path.join(workdir, 'ViT-fmnist.npz'))['params']['head']
  assert head['conv_seg']['kernel'].shape == (4 * 32, 1)


def test_evaluators_read_their_own_target(scenes_dir, tmp_path):
  config = _config('depth', scenes_dir)
  config.evals.segmentation = dict(type='segmentation', every=0)
  with pytest.raises(ValueError, match="evals.segmentation: a segmentation "
                     "evaluator needs .* pp.label='segmentation_mask'"):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = _config('dpt', scenes_dir)
  config.evals.depth = dict(type='depth', every=0)
  with pytest.raises(ValueError, match="evals.depth: a depth evaluator "
                     "needs .* pp.label='depth'"):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
