r"""The default job: a small ViT trained from scratch on Fashion-MNIST, offline.

Fashion-MNIST comes from Debian's `dataset-fashion-mnist` package and is
prepared by vit_jax's local tfds builder; no network is used.

  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_default
"""

import ml_collections

from vit_jax.configs import common


def get_config() -> ml_collections.ConfigDict:
  config = common.get_config()
  config.dataset = 'fashion_mnist_local'
  config.pp.train = 'train'
  config.pp.test = 'test'
  config.pp.crop = 28
  # Short training underfits: whole images (no crops), random flips only.
  config.pp.area_min = 1.0
  config.pp.flip = True

  config = common.with_model(config, 'ViT-fmnist', dict(
      patches=dict(size=(7, 7)),  # 28x28 -> a 4x4 grid of tokens
      hidden_size=128,
      transformer=dict(mlp_dim=256, num_heads=4, num_layers=4,
                       dropout_rate=0.0, attention_dropout_rate=0.0,
                       remat_policy='none', scan=False),
      classifier='token',
      representation_size=None,
      posemb='learn',
      dtype='float32'))
  config.optimizer = 'adamw'
  config.weight_decay = 0.05
  config.base_lr = 2e-3
  config.warmup_steps = 200
  config.total_steps = 4500
  config.batch = 128
  config.batch_eval = 1000
  config.shuffle_buffer = 60_000
  config.evals.test.every = 1000
  config.progress_every = 100
  config.checkpoint_every = 500
  return config.lock()
