r"""NaViT (Dehghani et al., 2023) on Fashion-MNIST at any resolution, against
a plain ViT trained at 28 px, offline; the same budget of token slots.

  navit: each training image's longer side drawn from 14..56 px (2..8
         patches of 7x7), its aspect ratio from 1:2..2:1 by a random crop,
         random flips; packed greedily into 16 sequences of 256 tokens a
         step (at most 32 images each): 4,096 token slots a step.
  vit28: the default job's ViT at 28 px (16 tokens an image), 256 images a
         step: the same 4,096 tokens a step, for the same steps.

Both are evaluated at the end at 14, 28, 42 and 56 px (`accuracy_14px` ..
`accuracy_56px` in results.json; the ViT by resizing its position table);
NaViT also on the mixed test stream (`accuracy_mixed`), and writes the
training batches' `packing_efficiency`.

  python -m vit_jax.main --config=configs/navit_fmnist.py --workdir=/tmp/navit
  python -m vit_jax.main --config=configs/navit_fmnist.py:vit28 \
      --workdir=/tmp/vit28
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

ARMS = ('navit', 'vit28')


def _settings():
  return ml_collections.ConfigDict(dict(
      packed=True,
      max_tokens=256,
      window=64,  # pending images the greedy packer chooses from
      side_range=(14, 56),
      aspect_range=(0.5, 2.0),
      # NaViT's token dropping: a rate drawn per image from (lo, hi);
      # (r, r) drops a fixed fraction r.
      drop_rate=(0.0, 0.0),
      eval_sides=(14, 28, 42, 56),
      eval_every=0))  # at the end


def _navit(config):
  config.trainer = 'navit'
  config.evals = ml_collections.ConfigDict()  # the task evaluates
  config = common.with_model(config, 'NaViT-fmnist', dict(
      patches=dict(size=(7, 7)),
      hidden_size=128,
      transformer=dict(mlp_dim=256, num_heads=4, num_layers=4,
                       dropout_rate=0.0, attention_dropout_rate=0.0),
      posemb='factorized',
      max_grid=16,
      pool='map',
      max_images=32,
      dtype='float32'))
  config.batch = 16  # sequences
  config.batch_eval = 64
  return config


def get_config(arm: str = 'navit') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  config = default.get_config().unlock()
  config.navit = _settings()
  config.total_steps = 3000
  config.warmup_steps = 200
  config.checkpoint_every = 1000
  if arm == 'navit':
    return _navit(config).lock()
  config.trainer = 'navit'
  config.navit.packed = False
  config.batch = 256  # x 16 tokens: NaViT's 16 x 256
  config.evals.test.every = 0  # at the end, besides every side
  return config.lock()
