"""InternViT (Chen et al., 2024), InternVL's vision encoder: a ViT with a
class token, LayerScale 0.1 and no norm after the blocks, published at
448 px with ImageNet's mean and std (the hub's preprocessor_config.json).

- InternViT-300M-448px (and its V2.5, the same architecture): timm's
  `vit_intern300m_patch14_448`, transformers' `InternVLVisionModel` of
  InternVL2.5/3's 1B-38B: LayerNorm, query/key/value biases.
- InternViT-6B-448px (V1.2 on, V1.5, V2.5: 45 blocks): transformers'
  `InternVLVisionModel` of InternVL2.5/3's 78B (`norm_type='rms_norm'`,
  `use_qk_norm`, `attention_bias=False`): RMSNorm, queries and keys each
  RMS-normalized across all heads, projections without biases.

transformers' model returns every token (`classifier='token_unpooled'`,
as its conversion sets); timm's pools the class token ('token').
"""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, 6B's blocks)
_INTERNVITS = {
    'InternViT-testing': (16, 64, 2, 2, 14, False),
    'InternViT-6B-testing': (24, 48, 3, 2, 14, True),
    'InternViT-300M_14': (1024, 4096, 16, 24, 14, False),
    'InternViT-6B_14': (3200, 12800, 25, 45, 14, True),
}


def _internvit(name, *row_and_6b):
  """An InternViT encoder; 6B's blocks: RMSNorm, query/key norms across
  the heads, no query/key/value biases."""
  *row, six_b = row_and_6b
  config = vit_families.timm_vit_config(name, *row, layerscale_init=0.1)
  config.transformer.final_norm = False
  if six_b:
    config.transformer.update(norm='rms', qk_norm='all', qkv_bias='none')
  return config


registry.register(vit_families.vit_family(
    'InternViT', [_internvit(name, *row) for name, row in _INTERNVITS.items()],
    weights='timm', native=448, timm_architecture=r'vit_intern\w+'))
