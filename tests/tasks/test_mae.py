"""MAE: the mask, the loss and patches against numpy; the exported encoder
as a classifier; short runs of configs/mae_fmnist.py through the loop."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from tests.conftest import make_tiny_config
from vit_jax.checkpoints import files
from vit_jax import checkpoint  # the original's helpers: load_pretrained
from vit_jax import models
from vit_jax import launch
from vit_jax.configs import mae_fmnist
from vit_jax.models import mae as models_mae
from vit_jax.models import vit as models_vit

DECODER = dict(hidden_size=8, num_layers=1, num_heads=2, mlp_dim=16)


@pytest.mark.parametrize('num_patches,ratio,k', [
    (16, 0.75, 4), (196, 0.75, 49), (10, 0.75, 2), (16, 0., 16)])
def test_the_mask_keeps_k_patches_from_the_seed(num_patches, ratio, k):
  keep, mask = models_mae.random_keep(jax.random.key(3), 6, num_patches,
                                      ratio)
  keep, mask = np.asarray(keep), np.asarray(mask)
  assert keep.shape == (6, k) and mask.shape == (6, num_patches)
  for row, m in zip(keep, mask):
    assert len(set(row)) == k  # no patch kept twice
    want = np.ones(num_patches)
    want[row] = 0
    np.testing.assert_array_equal(m, want)
  again, _ = models_mae.random_keep(jax.random.key(3), 6, num_patches, ratio)
  np.testing.assert_array_equal(keep, again)
  if k < num_patches:
    assert len({tuple(sorted(r)) for r in keep}) > 1  # images differ
    other, _ = models_mae.random_keep(jax.random.key(4), 6, num_patches,
                                      ratio)
    assert not np.array_equal(keep, other)


def test_a_ratio_that_keeps_nothing_is_refused():
  with pytest.raises(ValueError, match='none of the 4 patches'):
    models_mae.random_keep(jax.random.key(0), 2, 4, 0.8)
  with pytest.raises(ValueError, match=r'in \[0, 1\)'):
    models_mae.num_kept(16, 1.0)


def _numpy_loss(pred, target, mask, norm_pix):
  """Written from the paper: the mean squared error of each removed patch,
  averaged over those patches; per-patch normalized targets (MAE's
  unbiased variance, eps 1e-6)."""
  errors = []
  for i, j in zip(*np.nonzero(mask)):
    t = target[i, j]
    if norm_pix:
      t = (t - t.mean()) / np.sqrt(t.var(ddof=1) + 1e-6)
    errors.append(np.mean((pred[i, j] - t)**2))
  return np.mean(errors)


@pytest.mark.parametrize('norm_pix', [False, True])
def test_the_loss_counts_only_masked_patches(norm_pix):
  rng = np.random.default_rng(0)
  pred, target = rng.normal(size=(2, 3, 5, 12)) * [[[[1.]]], [[[3.]]]]
  mask = np.array([[1, 0, 1, 1, 0], [0, 0, 1, 0, 1], [1, 1, 1, 0, 0]],
                  np.float32)
  got = models_mae.mae_loss(pred, target, mask, norm_pix)
  np.testing.assert_allclose(got, _numpy_loss(pred, target, mask, norm_pix),
                             rtol=1e-5)
  visible = pred.copy()
  visible[mask == 0] += 100.  # what the encoder saw costs nothing
  np.testing.assert_allclose(
      models_mae.mae_loss(visible, target, mask, norm_pix), got, rtol=1e-5)


def test_patchify_is_a_row_major_reshape():
  images = np.random.default_rng(1).normal(size=(2, 14, 21, 3))
  patches = np.asarray(models_mae.patchify(images, (7, 7)))
  assert patches.shape == (2, 6, 7 * 7 * 3)
  for r in range(2):
    for c in range(3):
      want = images[:, 7 * r:7 * r + 7, 7 * c:7 * c + 7, :].reshape(2, -1)
      np.testing.assert_array_equal(patches[:, r * 3 + c], want)
  np.testing.assert_array_equal(
      models_mae.unpatchify(patches, (7, 7), (2, 3)), images)


def _encoder_config():
  config = models.MODEL_CONFIGS['testing'].to_dict()
  config['transformer']['dropout_rate'] = 0.
  return config


def test_the_exported_encoder_is_a_classifiers_checkpoint(tmp_path):
  encoder = models_mae.encoder_config(_encoder_config())
  mae = models_mae.MaskedAutoencoder(encoder=encoder, decoder=DECODER)
  images = np.random.default_rng(2).normal(size=(3, 32, 32, 3)).astype(
      np.float32)
  params = helpers.random_params(mae, images, jnp.zeros((3, 1), jnp.int32),
                                 train=False)
  path = str(tmp_path / 'encoder.npz')
  files.save(params['encoder'], path)

  classifier = models.VisionTransformer(num_classes=7, **encoder)
  fresh = classifier.init(jax.random.key(0), images[:1], train=False)
  loaded = checkpoint.load_pretrained(
      pretrained_path=path, init_params=fresh['params'], model_config=encoder)
  np.testing.assert_array_equal(loaded['head']['kernel'],
                                fresh['params']['head']['kernel'])
  loaded.pop('head')
  features = classifier.clone(num_classes=None).apply(
      {'params': loaded}, images, train=False)
  # The MAE's encoder on every patch, in order and shuffled: its class token.
  unpooled = models_vit.VisionTransformer(
      num_classes=None, **dict(encoder, classifier='token_unpooled'))
  for keep in (np.arange(4), np.array([2, 0, 3, 1])):
    tokens = unpooled.apply({'params': params['encoder']}, images,
                            train=False, keep=np.tile(keep, (3, 1)))
    np.testing.assert_allclose(features, tokens[:, 0], rtol=1e-5, atol=1e-6)


def test_decoder_predictions_do_not_depend_on_the_order_kept():
  encoder = models_mae.encoder_config(_encoder_config())
  mae = models_mae.MaskedAutoencoder(encoder=encoder, decoder=DECODER)
  images = np.random.default_rng(3).normal(size=(2, 32, 32, 3)).astype(
      np.float32)
  keep = np.array([[3, 0], [1, 2]], np.int32)
  params = helpers.random_params(mae, images, keep, train=False)
  pred = mae.apply({'params': params}, images, keep, train=False)
  assert pred.shape == (2, 4, 16 * 16 * 3)
  np.testing.assert_allclose(
      mae.apply({'params': params}, images, keep[:, ::-1], train=False),
      pred, rtol=1e-5, atol=1e-6)


def _small(config, fmnist_dirs):
  """A config of configs/mae_fmnist.py as a short job on tiny data."""
  config = config.unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.total_steps, config.warmup_steps = 3, 1
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 100
  config.progress_every, config.checkpoint_every = 1, 0
  config.evals.fewshot.update(train='train', shots=(2,), seeds=1)
  config.model.hidden_size = 16  # the default job's ViT, thinner, 1 block
  config.model.transformer.update(num_layers=1, mlp_dim=32, num_heads=2)
  if 'mae' in config:
    config.mae.decoder.update(DECODER)
  return config


def test_mae_fmnist_pretrains_then_fine_tunes(fmnist_dirs, tmp_path, capsys):
  config = _small(mae_fmnist.get_config(), fmnist_dirs)
  params = jax.device_get(launch.train_and_evaluate(config,
                                                   str(tmp_path / 'mae')))
  results = json.loads((tmp_path / 'mae' / 'results.json').read_text())
  assert 0 <= results['fewshot_2shot'] <= 1
  assert (tmp_path / 'mae' / 'mae_reconstructions.png').stat().st_size > 1000
  exported = files.read_params(str(tmp_path / 'mae' / 'ViT-fmnist.npz'))
  jax.tree.map(np.testing.assert_array_equal, exported, params['encoder'])
  assert 'few-shot linear accuracy' in capsys.readouterr().out

  finetune = _small(mae_fmnist.get_config('finetune'), fmnist_dirs)
  finetune.pretrained_path = str(tmp_path / 'mae' / 'ViT-fmnist.npz')
  launch.train_and_evaluate(finetune, str(tmp_path / 'finetune'))
  out = capsys.readouterr().out
  assert f'Fine-tuning from {finetune.pretrained_path}' in out
  assert 'Done: 3 steps, test accuracy' in out


def test_bad_mae_settings_fail_before_compiling(fmnist_dirs, tmp_path):
  config = make_tiny_config(fmnist_dirs)
  config.trainer = 'mae'
  with pytest.raises(ValueError, match='needs config.mae'):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = _small(mae_fmnist.get_config(), fmnist_dirs)
  config.mae.mask_ratio = 0.95  # of 16 patches
  with pytest.raises(ValueError, match='leaves none of the 16'):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
  config = _small(mae_fmnist.get_config(), fmnist_dirs)
  config.model.classifier = 'gap'
  with pytest.raises(ValueError, match="classifier='token'"):
    launch.train_and_evaluate(config, str(tmp_path / 'c'))
