"""trainer='segmentation': the probe's model, loss and metrics against numpy
from their definitions; a run on tiny Fashion-MNIST scenes with a converted
golden encoder that stays frozen."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax import convert
from vit_jax import launch
from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.configs import common
from vit_jax.configs import segmentation_fmnist
from vit_jax.data import local_datasets
from vit_jax.evaluators import segmentation as segmentation_eval
from vit_jax.models import segmentation
from vit_jax.run import loop


def _bilinear_numpy(x, size):
  """Half-pixel bilinear resize of (h, w) maps, edges clamped: torch's
  `interpolate(mode='bilinear', align_corners=False)` when upsampling."""
  def taps(n_in, n_out):
    src = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    low = np.floor(src).astype(int)
    high = np.minimum(low + 1, n_in - 1)
    return low, high, src - low
  (r0, r1, fr), (c0, c1, fc) = taps(x.shape[0], size[0]), taps(x.shape[1],
                                                              size[1])
  rows = x[r0] * (1 - fr)[:, None, None] + x[r1] * fr[:, None, None]
  return (rows[:, c0] * (1 - fc)[None, :, None] +
          rows[:, c1] * fc[None, :, None])


def test_upsample_is_torchs_bilinear():
  x = np.random.default_rng(0).normal(size=(1, 3, 5, 2)).astype(np.float32)
  np.testing.assert_allclose(segmentation.upsample(x, (12, 20))[0],
                             _bilinear_numpy(x[0], (12, 20)), atol=1e-5)


def test_head_is_batchnorm_then_a_linear_map():
  """In inference: (x - mean) / sqrt(var + eps) * scale + bias, then x W + b,
  on the maps concatenated along the channels."""
  rng = np.random.default_rng(0)
  maps = [rng.normal(size=(2, 3, 3, 4)), rng.normal(size=(2, 3, 3, 2))]
  head = segmentation.LinearHead(num_classes=5)
  variables = head.init(jax.random.key(0), maps, train=False)
  variables = jax.tree.map(
      lambda v: rng.uniform(0.5, 1.5, v.shape).astype(np.float32), variables)
  p, s = variables['params'], variables['batch_stats']
  x = np.concatenate(maps, -1)
  x = ((x - s['bn']['mean']) / np.sqrt(s['bn']['var'] + 1e-5) *
       p['bn']['scale'] + p['bn']['bias'])
  want = x @ p['conv_seg']['kernel'] + p['conv_seg']['bias']
  np.testing.assert_allclose(head.apply(variables, maps, train=False), want,
                             rtol=1e-5, atol=1e-5)


def test_pixel_loss_leaves_ignored_pixels_out():
  rng = np.random.default_rng(1)
  logits = rng.normal(size=(2, 4, 4, 3)).astype(np.float32)
  labels = rng.integers(0, 3, (2, 4, 4))
  labels[0, :2] = 255
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  keep = labels != 255
  want = -np.mean(np.take_along_axis(
      log_p, np.where(keep, labels, 0)[..., None], -1)[..., 0][keep])
  np.testing.assert_allclose(
      losses.pixel_cross_entropy(logits, labels, 255), want, rtol=1e-5)


def test_mean_iou_and_pixel_accuracy_from_their_definitions():
  """IoU of class c: |label c and predicted c| / |label c or predicted c|
  over the valid pixels; the mean over classes that occur; a class that
  occurs nowhere is left out."""
  rng = np.random.default_rng(2)
  labels = rng.integers(0, 4, (3, 6, 6))  # class 4 of 5 never occurs
  predictions = np.where(rng.uniform(size=labels.shape) < 0.6, labels,
                         rng.integers(0, 4, labels.shape))
  valid = rng.uniform(size=labels.shape) < 0.8
  got = segmentation_eval.scores(segmentation_eval.confusion(
      jnp.asarray(labels), jnp.asarray(predictions), jnp.asarray(valid), 5))
  ious = []
  for c in range(4):
    a, b = (labels == c) & valid, (predictions == c) & valid
    ious.append((a & b).sum() / (a | b).sum())
  np.testing.assert_allclose(got['iou_per_class'][:4], ious)
  assert np.isnan(got['iou_per_class'][4])
  np.testing.assert_allclose(got['miou'], np.mean(ious))
  np.testing.assert_allclose(got['pixel_accuracy'],
                             (labels == predictions)[valid].mean())


def probe_config(fmnist_dirs, root):
  """configs/segmentation_fmnist.py probing the golden DINOv2 with
  registers (converted from timm, into `root`), 56 px: a 4x4 grid."""
  npz = str(root / 'encoder.npz')
  convert.convert(os.path.join(helpers.DATA, 'timm_ssl', 'dinov2_reg4'), npz)
  config = segmentation_fmnist.get_config('last4').unlock()
  config.tfds_manual_dir = fmnist_dirs[0]
  config.tfds_data_dir = str(root / 'tfds')
  config.tfds_download = False
  common.with_model(config, 'DINOv2-testing-reg4')
  config.segmentation.indices = (0, -1)
  config.pretrained_path = npz
  return config


@pytest.fixture
def scenes_config(fmnist_dirs, tmp_path, monkeypatch):
  """`probe_config` on 24 + 10 tiny scenes."""
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TRAIN', 24)
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TEST', 10)
  config = probe_config(fmnist_dirs, tmp_path)
  config.update(total_steps=4, warmup_steps=1, batch=8, batch_eval=8,
                base_lr=0.05, progress_every=1, checkpoint_every=2,
                shuffle_buffer=24)
  return config


def test_probe_trains_a_frozen_encoder(scenes_config, tmp_path):
  """results.json has the metrics; the exported encoder is the checkpoint's,
  unchanged (position table resized as the loader does); only the head and
  its statistics moved, and the optimizer keeps no state for the encoder."""
  workdir = str(tmp_path / 'run')
  params = launch.train_and_evaluate(scenes_config, workdir)
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 <= results['miou'] <= 1 and 0 <= results['pixel_accuracy'] <= 1
  assert len(results['iou_per_class']) == 11
  exported = files.load(os.path.join(workdir, 'DINOv2-testing-reg4.npz'))
  source = files.load(scenes_config.pretrained_path)
  backbone = exported['params']['backbone']
  for key in ('cls', 'reg', 'embedding'):
    jax.tree.map(np.testing.assert_array_equal, backbone[key], source[key])
  jax.tree.map(np.testing.assert_array_equal,
               backbone['Transformer']['encoderblock_1'],
               source['Transformer']['encoderblock_1'])
  stats = exported['batch_stats']['head']['bn']
  assert not np.allclose(stats['mean'], 0)  # moved from the init's 0
  # The head reads two 32-wide maps: 64 channels, 11 classes.
  assert exported['params']['head']['conv_seg']['kernel'].shape == (64, 11)
  size = lambda tree: sum(np.size(x) for x in jax.tree.leaves(tree))
  encoder = size(source)
  assert size(params) == size(exported) - size(backbone) < encoder / 10
  task = launch.make_task(scenes_config, workdir)
  _, abstract, _ = loop.abstract_state(task, scenes_config, task.mesh)
  assert size(abstract.opt_state) <= 3 * size(params)  # Adam's, the head's


def test_evaluates_an_exported_probe(scenes_config, tmp_path):
  """trainer='evaluate' on the exported segmenter: the run's metrics; an
  encoder alone is refused by name."""
  workdir = str(tmp_path / 'run')
  launch.train_and_evaluate(scenes_config, workdir)
  trained = json.load(open(os.path.join(workdir, 'results.json')))
  config = scenes_config.copy_and_resolve_references()
  config.trainer = 'evaluate'
  encoder = config.pretrained_path
  config.pretrained_path = os.path.join(workdir, 'DINOv2-testing-reg4.npz')
  result = launch.evaluate(config, str(tmp_path / 'eval'))
  assert result['miou'] == pytest.approx(trained['miou'], abs=1e-6)
  config.pretrained_path = encoder
  with pytest.raises(files.CheckpointError, match='not a segmentation probe'):
    launch.evaluate(config, str(tmp_path / 'eval2'))


def test_bad_settings_are_named(scenes_config, tmp_path):
  with pytest.raises(ValueError, match="Unknown arm 'last3'"):
    segmentation_fmnist.get_config('last3')
  config = scenes_config.copy_and_resolve_references()
  config.pp.label = ''
  with pytest.raises(ValueError, match=r"reads pp.label in \['depth', "
                     r"'segmentation_mask'\], got ''"):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = scenes_config.copy_and_resolve_references()
  config.segmentation.head = 'upernet'
  with pytest.raises(ValueError, match=r"head='upernet'; expected one of "
                     r"\('linear', 'dpt'\)"):
    launch.train_and_evaluate(config, str(tmp_path / 'c'))
  config.segmentation.head = 'dpt'
  with pytest.raises(ValueError, match=r"needs config.segmentation.dpt"):
    launch.train_and_evaluate(config, str(tmp_path / 'd'))
  config = scenes_config.copy_and_resolve_references()
  config.segmentation.indices = (5,)
  with pytest.raises(ValueError, match=r'block indices in \[-2, 1\]'):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
