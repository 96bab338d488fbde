r"""MAE (He et al., 2022) on Fashion-MNIST without labels, then fine-tuning
on the labeled 10% (configs/deit_fmnist.py's split), offline.

  pretrain: the default job's ViT as a masked autoencoder on the 60,000
            training images, labels unused; 75% of the 4x4 patches masked,
            per-patch normalized targets, a 2-block decoder. Writes the
            encoder as `ViT-fmnist.npz`, `mae_reconstructions.png`, and
            its 10-shot linear accuracy (shots from the labeled 10%).
  finetune: deit_fmnist.py's 'plain' arm (6,000 labeled images, 1,500
            steps) from `pretrained_path`, with MAE's layer-wise
            learning-rate decay 0.75; without a path, from scratch.

  python -m vit_jax.main --config=configs/mae_fmnist.py --workdir=/tmp/mae
  python -m vit_jax.main --config=configs/mae_fmnist.py:finetune \
      --config.pretrained_path=/tmp/mae/ViT-fmnist.npz --workdir=/tmp/mae_ft

scripts/mae_fmnist.py runs both against the same encoder from scratch over
seeds and prints the table of docs/recipes.md.
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

ARMS = ('pretrain', 'finetune')


def fewshot_10():
  """10-shot linear evaluation, the shots drawn from the labeled 10%."""
  settings = common.fewshot_evaluator()
  settings.update(train='train[:10%]', shots=(10,))
  return settings


def _pretrain(config):
  config.trainer = 'mae'
  config.mae = ml_collections.ConfigDict(dict(
      mask_ratio=0.75,
      norm_pix_loss=True,
      decoder=dict(hidden_size=128, num_layers=2, num_heads=4, mlp_dim=256)))
  config.evals = ml_collections.ConfigDict()  # no head: no test accuracy
  config.evals.fewshot = fewshot_10()
  config.evals.fewshot.every = 0  # at the end
  config.batch = 256
  config.base_lr = 1.5e-3
  config.warmup_steps = 200
  config.total_steps = 3000
  config.checkpoint_every = 1000
  return config


def get_config(arm: str = 'pretrain') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  if arm == 'pretrain':
    return _pretrain(default.get_config().unlock()).lock()
  return finetune(layer_decay=0.75)  # MAE's (docs/recipes.md)


def finetune(layer_decay: float) -> ml_collections.ConfigDict:
  """The 'finetune' arm with this layer-wise learning-rate decay (BEiT's
  and DINO's: 0.65)."""
  config = default.get_config().unlock()
  config.pp.train = 'train[:10%]'
  config.total_steps = 1500
  config.warmup_steps = 100
  config.evals.test.every = 0  # at the end
  config.evals.fewshot = fewshot_10()  # trainer='fewshot' runs it
  config.checkpoint_every = 0
  config.layer_decay = layer_decay
  return config.lock()
