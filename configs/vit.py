r"""Fine-tune a ViT with the paper's recipe (Appendix B.1.1, Table 4 setups).

SGD momentum 0.9, batch 512, gradient clipping at 1, cosine decay, 384 px;
hybrids alike. MLP-Mixers at 224 px, as the original's Mixer configs: their
token-mixing MLPs fix the resolution of the published checkpoints.

  python -m vit_jax.main --config=configs/vit.py:b16,cifar10 \
      --workdir=/tmp/vit_b16_cifar10 --config.pretrained_dir=PATH
"""

import ml_collections

from vit_jax.configs import common

MODELS = {
    'ti16': 'ViT-Ti_16', 's16': 'ViT-S_16', 's32': 'ViT-S_32',
    'b16': 'ViT-B_16', 'b8': 'ViT-B_8', 'b32': 'ViT-B_32',
    'l16': 'ViT-L_16', 'l32': 'ViT-L_32', 'h14': 'ViT-H_14',
    'r_ti16': 'R+ViT-Ti_16', 'r26_s32': 'R26+ViT-S_32',
    'r26_b32': 'R26+ViT-B_32', 'r50_b16': 'R50+ViT-B_16',
    'r50_l32': 'R50+ViT-L_32',
    'mixer_b16': 'Mixer-B_16', 'mixer_b32': 'Mixer-B_32',
    'mixer_l16': 'Mixer-L_16',
    'testing': 'testing',
}


def get_config(arg: str = 'b16,cifar10') -> ml_collections.ConfigDict:
  model, dataset = arg.split(',')
  if model not in MODELS:
    raise ValueError(f'Unknown model {model!r}; known: {sorted(MODELS)}.')
  config = common.with_dataset(common.get_config(), dataset)
  config = common.with_model(config, MODELS[model])
  if model.startswith('mixer'):
    config.pp.crop = 224
  config.base_lr = 0.03  # the paper sweeps {0.001, 0.003, 0.01, 0.03}
  return config.lock()
