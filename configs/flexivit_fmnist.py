r"""FlexiViT (Beyer et al., CVPR 2023) on Fashion-MNIST, offline: one ViT
trained at random patch sizes against ViTs trained at one, all evaluated at
patch sizes 4, 7 and 14 (7x7, 4x4 and 2x2 tokens of a 28x28 image).

  flexi:  each step's patch size drawn from (4, 7, 14); the kernel stored
          at 14x14 and PI-resized, the position table stored at 7x7 (the
          finest grid) and resized bilinearly, at every call.
  vit4, vit14: an ordinary ViT trained at patch size 4 or 14, evaluated at
          the other sizes the same way.

A tiny model and short training, to fit a CPU: the table of
docs/flexivit.md (3 seeds of each arm) is benchmarks/flexivit_fmnist.py.

  python -m vit_jax.main --config=configs/flexivit_fmnist.py:flexi \
      --workdir=/tmp/flexi
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

ARMS = ('flexi', 'vit4', 'vit14')
SIZES = (4, 7, 14)


def _model(arm):
  model = dict(
      patches=dict(size=(14, 14) if arm != 'vit4' else (4, 4)),
      hidden_size=64,
      transformer=dict(mlp_dim=128, num_heads=4, num_layers=3,
                       dropout_rate=0.0, attention_dropout_rate=0.0),
      classifier='token',
      representation_size=None,
      posemb='learn',
      dtype='float32')
  if arm == 'flexi':
    model.update(posemb_grid=(7, 7), patch_sizes=SIZES)
  return model


def get_config(arm: str = 'flexi') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  config = default.get_config().unlock()
  name = {'flexi': 'FlexiViT-fmnist', 'vit4': 'ViT-fmnist-4',
          'vit14': 'ViT-fmnist-14'}[arm]
  config = common.with_model(config, name, _model(arm))
  config.total_steps = 1000
  config.warmup_steps = 100
  config.checkpoint_every = 0
  # At the end, at each patch size: accuracy_patch4, _patch7, _patch14.
  config.evals = ml_collections.ConfigDict({
      f'test_patch{p}': dict(type='classification', every=0, patch_size=p)
      for p in SIZES})
  return config.lock()
