"""The `internvl` and `prismatic` arms of configs/captioning_fmnist.py end
to end on tiny Fashion-MNIST: 40 steps offline, scoring accuracy and
caption metrics, the export reopened by `load_captioner`."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import launch
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.configs import captioning_fmnist
from vit_jax.configs import common
from vit_jax.data import tiling
from vit_jax.tasks import captioning as captioning_task

pytestmark = pytest.mark.xdist_group('captioning')


@pytest.fixture(scope='module')
def encoders(tmp_path_factory):
  """Two published-layout ViT files (the testing preset at initialization,
  two seeds), in place of the default job's and DINO's exports."""
  folder = tmp_path_factory.mktemp('encoders')
  config = common.with_model(captioning_fmnist.get_config().unlock(),
                             'testing')
  model = models.VisionTransformer(num_classes=None, **config.model)
  paths = []
  for seed in (0, 1):
    params = model.init(jax.random.key(seed), jnp.zeros((1, 32, 32, 3)),
                        train=False)['params']
    paths.append(str(folder / f'encoder{seed}.npz'))
    files.save(params, paths[-1])
  return paths


def _config(arm, fmnist_dirs, encoders):
  config = captioning_fmnist.get_config(arm).unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.tfds_download = False
  common.with_model(config, 'testing')  # patch 16: 2 x 2 tokens at 32 px
  config.model_name = f'ViT-fmnist-{arm}'
  config.pp.crop = 32
  config.pp.test = 'test[:16]'
  config.captioning.decoder = dict(width=16, num_layers=1, num_heads=2,
                                   mlp_dim=32, remat=False, dtype='float32')
  config.captioning.block = -1  # the testing ViT has one block
  config.captioning.vocab_size = 64
  if arm == 'internvl':
    config.pretrained_path = encoders[0]
    config.pp.tiles = dict(min=1, max=2)  # an item: 1 tile, 2 padding slots
  else:  # 32 px (2 x 2 tokens) and 16 px (1 x 1) fused on a 2 x 2 grid
    config.captioning.encoders = (dict(path=encoders[0], size=32),
                                  dict(path=encoders[1], size=16))
    config.captioning.fusion_grid = 2
  config.update(total_steps=40, warmup_steps=1, batch=8, batch_eval=16,
                base_lr=0.01, progress_every=40, checkpoint_every=0,
                shuffle_buffer=64)
  return config


@pytest.mark.parametrize('arm', ['internvl', 'prismatic'])
def test_connector_arms_run_offline_and_export(arm, fmnist_dirs, encoders,
                                               tmp_path):
  config = _config(arm, fmnist_dirs, encoders)
  workdir = str(tmp_path / arm)
  params = launch.train_and_evaluate(config, workdir)
  assert set(params) == {'text', 'projector'}  # the encoders frozen
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 <= results['scoring_accuracy'] <= 1
  assert {'exact_match', 'token_f1', 'cider_d'} <= results.keys()
  npz = os.path.join(workdir, f'ViT-fmnist-{arm}.npz')
  model, loaded, _, saved = captioning_task.load_captioner(npz)
  jax.tree.map(np.testing.assert_array_equal, loaded['projector'],
               params['projector'])
  if arm == 'internvl':
    assert saved['pp']['tiles'] == {'min': 1, 'max': 2}
    images = jnp.zeros((2, tiling.slots(2), 32, 32, 3))
    images = images.at[:, 1:].set(jnp.nan)
    # One tile's 2 x 2 tokens, shuffled into one; the padding's NaN.
    assert model.apply({'params': loaded}, images,
                       method='encode').shape == (2, 3, 16)
    jax.tree.map(np.testing.assert_array_equal, loaded['encoder'],
                 files.load(encoders[0]))
  else:
    assert model.connector == 'fused_mlp' and model.encoder.sizes == (32, 16)
    for i, path in enumerate(encoders):  # each encoder as it was given
      jax.tree.map(np.testing.assert_array_equal,
                   loaded['encoder'][f'encoders_{i}'],
                   jax.tree.map(np.asarray, params_of(path, 32 // (i + 1))))
    memory = model.apply({'params': loaded}, jnp.zeros((2, 32, 32, 3)),
                         method='encode')
    assert memory.shape == (2, 4, 16)  # a 2 x 2 grid, projected


def params_of(path, size):
  """A file's parameters as the run loads them at `size` px."""
  config = common.with_model(captioning_fmnist.get_config().unlock(),
                             'testing')
  return loading.load_model(config.model, path, size)[1]


def test_fusion_settings_are_named(fmnist_dirs, encoders, tmp_path):
  for change, message in (
      (dict(trained='all'), 'frozen'),
      (dict(encoders=(dict(path=encoders[0]),)), r"lacks \['size'\]"),
      (dict(encoders=(dict(path=str(tmp_path / 'absent.npz'), size=32),)),
       'absent.npz')):
    config = _config('prismatic', fmnist_dirs, encoders)
    config.captioning.update(change)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
      launch.train_and_evaluate(config, str(tmp_path / 'bad'))
  config = _config('internvl', fmnist_dirs, encoders)
  config.captioning.connector = 'cross_attention'
  with pytest.raises(ValueError, match='pp.tiles'):
    launch.train_and_evaluate(config, str(tmp_path / 'bad'))


def test_an_encoders_dtype_is_recorded_by_name():
  """captioner.json keeps a ViT's `dtype=jnp.bfloat16` as 'bfloat16' (a
  loaded checkpoint's encoder has one)."""
  config = common.with_model(captioning_fmnist.get_config().unlock(),
                             'testing')
  module = models.VisionTransformer(
      num_classes=None, **dict(config.model.to_dict(), dtype=jnp.bfloat16))
  assert captioning_task._attributes(module)['dtype'] == 'bfloat16'
