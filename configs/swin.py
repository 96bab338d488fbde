r"""Fine-tune a Swin Transformer (Liu et al., ICCV 2021) from timm's weights.

The datasets and schedules of configs/vit.py, at 224 px: a Swin takes
sides that are multiples of patch x window x 8 (224 px for the presets), so
ViT's 384 px would not fit. AdamW as Swin was trained (weight decay 0.05),
stochastic depth 0.1, ImageNet's mean and std (the preset's, `with_model`).
The learning rate is a starting point to sweep, as vit.py's.

  python -m vit_jax.convert swin_tiny_patch4_window7_224.safetensors \
      /tmp/Swin-T.npz --model_name=Swin-T
  python -m vit_jax.main --config=configs/swin.py:swin_t,cifar10 \
      --workdir=/tmp/swin_t_cifar10 --config.pretrained_path=/tmp/Swin-T.npz
"""

import ml_collections

from vit_jax.configs import common

MODELS = {'swin_t': 'Swin-T', 'swin_s': 'Swin-S', 'swin_b': 'Swin-B',
          'testing': 'Swin-testing'}


def get_config(arg: str = 'swin_t,cifar10') -> ml_collections.ConfigDict:
  model, dataset = arg.split(',')
  if model not in MODELS:
    raise ValueError(f'Unknown model {model!r}; known: {sorted(MODELS)}.')
  config = common.with_dataset(common.get_config(), dataset)
  config = common.with_model(config, MODELS[model])
  config.model.stochastic_depth = 0.1
  config.pp.crop = 224
  config.optimizer = 'adamw'
  config.weight_decay = 0.05
  config.base_lr = 1e-4
  return config.lock()
