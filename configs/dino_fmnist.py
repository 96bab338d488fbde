r"""DINO (Caron et al., 2021) with DINOv2's iBOT and KoLeo terms, on
Fashion-MNIST without labels, offline.

The default job's ViT is the student; its EMA teacher's encoder is
exported as `{workdir}/ViT-fmnist.npz` and evaluated by DINO's weighted
k-NN (k = 20, T = 0.07, the 60,000 training images as memory) and 10-shot
linear regression; labels are read by these evaluators only. Two global
crops of 28 px (4x4 tokens) and 4 local crops of 14 px (2x2).

  python -m vit_jax.main --config=configs/dino_fmnist.py --workdir=/tmp/dino
  python -m vit_jax.main --config=configs/dino_fmnist.py --workdir=/tmp/d40 \
      --config.total_steps=40
  python -m vit_jax.main --config=configs/dino_fmnist.py --workdir=/tmp/dsk \
      --config.dino.centering=sinkhorn

Arms: 'dino' (DINO + iBOT + KoLeo, default); 'dino_v1' (the class-token
loss alone, as DINO); 'finetune': configs/mae_fmnist.py:finetune with the
layer-wise learning-rate decay of DINO's and BEiT's fine-tuning (0.65),
from `pretrained_path`:

  python -m vit_jax.main --config=configs/dino_fmnist.py:finetune \
      --config.pretrained_path=/tmp/dino/ViT-fmnist.npz --workdir=/tmp/d_ft

docs/dino.md has the table it enters.
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default
from vit_jax.configs import mae_fmnist

ARMS = ('dino', 'dino_v1', 'finetune')


def dino_settings() -> ml_collections.ConfigDict:
  """`config.dino`, DINOv2's defaults where the image size allows them."""
  return ml_collections.ConfigDict(dict(
      # DINO's head; K prototypes (65,536 for ImageNet).
      head=dict(num_prototypes=1024, hidden_dim=512, bottleneck_dim=128,
                num_layers=3),
      ibot_head=None,  # None: iBOT shares the head (DINOv2's default)
      crops=dict(
          global_scale=(0.4, 1.0),
          local_scale=(0.1, 0.4),
          local_size=14,
          num_local=4,
          blur_sigma=(0.1, 1.0)),  # pixels (DINO: 0.1..2 at 224 px)
      centering='softmax',  # or 'sinkhorn' (DINOv2)
      sinkhorn_iterations=3,
      center_momentum=0.9,
      student_temp=0.1,
      warmup_teacher_temp=0.04,
      teacher_temp=0.07,
      warmup_teacher_temp_epochs=1.0,
      momentum_teacher=0.99,  # -> 1 on a cosine
      freeze_last_layer_epochs=1.0,
      dino_weight=1.0,
      ibot_weight=1.0,  # 0: no iBOT term
      mask_probability=0.5,  # iBOT: share of global crops masked
      mask_ratio=(0.1, 0.5),  # of their patches
      koleo_weight=0.1))  # 0: no KoLeo term


def knn_and_fewshot():
  """k-NN over the whole training set and 10-shot linear, at the end."""
  evals = ml_collections.ConfigDict()
  evals.knn = common.knn_evaluator(every=0)
  evals.fewshot = common.fewshot_evaluator(every=0)
  evals.fewshot.shots = (10,)
  return evals


def get_config(arm: str = 'dino') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  if arm == 'finetune':
    return mae_fmnist.finetune(layer_decay=0.65)
  config = default.get_config().unlock()
  config.trainer = 'dino'
  config.dino = dino_settings()
  if arm == 'dino_v1':
    config.dino.ibot_weight = 0.
    config.dino.koleo_weight = 0.
  config.evals = knn_and_fewshot()
  config.batch = 128
  config.base_lr = 1e-3
  config.warmup_steps = 200
  config.total_steps = 2000
  config.checkpoint_every = 500
  return config.lock()
