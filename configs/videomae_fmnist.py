r"""VideoMAE (Tong et al., 2022) on moving Fashion-MNIST clips without
labels, then fine-tuning as a video classifier, offline.

  pretrain: configs/vivit_fmnist.py's clips (8 frames of 28 px, 2-frame
            tubelets of 7 px: 4 slots of 4x4) and its model's widths as
            VideoMAE's encoder (the fixed sin-cos table, mean pooling);
            tube masking at the paper's 0.9 (14 of a frame's 16 patches
            masked in every slot), per-tubelet normalized targets, a
            2-block decoder. Writes the encoder as `ViViT-fmnist.npz` (a
            ViViT checkpoint) and the k-NN accuracy of its clip features
            (`knn_accuracy`: the train clips the memory bank).
  finetune: vivit_fmnist.py's 'scratch' arm with this encoder's settings,
            from `pretrained_path` (default the pretrain command's export);
            writes `accuracy`.

  python -m vit_jax.main --config=configs/videomae_fmnist.py \
      --workdir=/tmp/videomae
  python -m vit_jax.main --config=configs/videomae_fmnist.py:finetune \
      --workdir=/tmp/videomae_ft
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import vivit_fmnist

DEFAULT_ENCODER = '/tmp/videomae/ViViT-fmnist.npz'
ARMS = ('pretrain', 'finetune')


def videomae_model(config):
  """`config.model` (vivit_fmnist's) as VideoMAE's encoder."""
  config.model.update(encoder='unfactorised', temporal_posemb='sincos',
                      classifier='gap', representation_size=None)
  return config


def _pretrain(config):
  config.trainer = 'videomae'
  config.pretrained_path = ''
  config.mae = ml_collections.ConfigDict(dict(
      mask_ratio=0.9,  # the paper's
      norm_pix_loss=True,
      decoder=dict(hidden_size=64, num_layers=2, num_heads=4, mlp_dim=128)))
  config.evals = ml_collections.ConfigDict()  # no head: no test accuracy
  config.evals.knn = common.knn_evaluator(every=0)
  config.base_lr = 1.5e-3
  config.warmup_steps = 100
  config.total_steps = 1200
  config.batch = 64
  config.checkpoint_every = 400
  return config


def get_config(arm: str = 'pretrain') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  config = videomae_model(vivit_fmnist.get_config('scratch').unlock())
  if arm == 'pretrain':
    return _pretrain(config).lock()
  config.pretrained_path = DEFAULT_ENCODER
  return config.lock()
