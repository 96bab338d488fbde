r"""BEiT (Bao et al., 2022; BEiT v2, Peng et al., 2022) on Fashion-MNIST
without labels, offline: first a visual tokenizer, then the default job's
ViT learns to predict the codes of its masked patches.

  vqkd_tokenizer: BEiT v2's tokenizer: a ViT, 256 codes of width 32 looked up
                  by cosine similarity (EMA updates, dead codes restarted),
                  a decoder that reconstructs the teacher's patch features.
                  The teacher is the default job's export, or any ViT-fmnist
                  encoder (DINO's, MAE's) by --config.beit.tokenizer.
                  teacher_path. Writes ViT-fmnist.tokenizer.npz (and .json).
  dvae_tokenizer: a discrete VAE on the pixels (Gumbel-softmax, as BEiT v1's
                  DALL-E tokenizer), 256 codes.
  vqkd, dvae:     BEiT pretraining on that tokenizer's codes: 40% of the
                  4x4 patches masked in blocks of at least 2 (BEiT: 75 of
                  14x14 in blocks of 16), then DINO's k-NN and 10-shot
                  linear evaluation of the exported encoder.
  finetune:       configs/mae_fmnist.py:finetune with BEiT's layer-wise
                  learning-rate decay 0.65, from `pretrained_path`.

  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_default
  python -m vit_jax.main --config=configs/beit_fmnist.py:vqkd_tokenizer \
      --workdir=/tmp/beit_tokenizer_vqkd
  python -m vit_jax.main --config=configs/beit_fmnist.py:vqkd \
      --workdir=/tmp/beit_vqkd
  python -m vit_jax.main --config=configs/beit_fmnist.py:finetune \
      --config.pretrained_path=/tmp/beit_vqkd/ViT-fmnist.npz --workdir=/tmp/b_ft

scripts/beit_fmnist.py compares BEiT, MAE, DINO and random init
(docs/self_supervised.md).
"""

import ml_collections

from vit_jax.configs import default
from vit_jax.configs import dino_fmnist
from vit_jax.configs import mae_fmnist

ARMS = ('vqkd', 'dvae', 'vqkd_tokenizer', 'dvae_tokenizer', 'finetune')
TOKENIZER_DIRS = {'vqkd': '/tmp/beit_tokenizer_vqkd',
                  'dvae': '/tmp/beit_tokenizer_dvae'}
TEACHER = '/tmp/vit_default/ViT-fmnist.npz'  # the default job's export


def beit_settings(kind: str) -> ml_collections.ConfigDict:
  """`config.beit`: the masking, the tokenizer's path and its settings."""
  return ml_collections.ConfigDict(dict(
      tokenizer_path=TOKENIZER_DIRS[kind],
      mask_ratio=0.4,
      min_patches=2,  # of a 4x4 grid (BEiT: 16 of 14x14)
      min_aspect=0.3,
      tokenizer=dict(
          kind=kind,
          codebook_size=256,
          code_dim=32,
          decoder=dict(hidden_size=128, num_layers=2, num_heads=4,
                       mlp_dim=256),
          teacher_path=TEACHER if kind == 'vqkd' else '',
          codebook_update='ema',  # or 'st': by gradient (straight-through)
          ema_decay=0.99,
          commitment=0.25,
          restart_threshold=0.03,  # of a uniform share; 0: no restarts
          temperature=(1.0, 1 / 16),  # dVAE's Gumbel-softmax, annealed
          # dVAE's KL to the uniform prior (0.01 used fewer codes).
          kl_weight=0.1)))


def get_config(arm: str = 'vqkd') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  if arm == 'finetune':
    return mae_fmnist.finetune(layer_decay=0.65)
  kind = arm.split('_')[0]
  config = default.get_config().unlock()
  config.beit = beit_settings(kind)
  config.batch = 128
  config.warmup_steps = 100
  config.checkpoint_every = 500
  if arm.endswith('_tokenizer'):
    config.trainer = 'beit_tokenizer'
    config.base_lr = 1e-3
    config.total_steps = 1000
    config.evals = ml_collections.ConfigDict()
    config.evals.codebook = ml_collections.ConfigDict(dict(
        type='codebook', every=0, dataset='', split=''))
    return config.lock()
  config.trainer = 'beit'
  config.base_lr = 1.5e-3
  config.total_steps = 1000
  config.evals = dino_fmnist.knn_and_fewshot()
  return config.lock()
