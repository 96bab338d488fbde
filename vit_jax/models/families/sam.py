"""SAM's image encoder (Kirillov et al., 2023), timm's samvit_*_patch16
and transformers' SamVisionModel: ViT-B/L/H with patches of 16, windows of
14 patches, four global blocks, a neck to 256 channels, 1024 px.

Parameters (`jax.eval_shape`) equal timm 1.0.31's samvit_{base,large,
huge}_patch16 (no head; tests/data/sam_param_counts.json): SAM-B
89_670_912, SAM-L 308_278_272, SAM-H 637_026_048. 'SAM-testing' is the
small model of the golden files (scripts/make_sam_golden.py): 128 px,
width 16, 4 blocks, windows of 4, global blocks 1 and 3.
"""

import ml_collections

from vit_jax.models import registry
from vit_jax.models import sam

# name: (hidden_size, num_layers, num_heads, global_blocks, window,
#        neck_channels, image_size)
_SAMS = {
    'SAM-testing': (16, 4, 2, (1, 3), 4, 8, 128),
    'SAM-B': (768, 12, 12, (2, 5, 8, 11), 14, 256, 1024),
    'SAM-L': (1024, 24, 16, (5, 11, 17, 23), 14, 256, 1024),
    'SAM-H': (1280, 32, 16, (7, 15, 23, 31), 14, 256, 1024),
}


def _sam(name, hidden, layers, heads, global_blocks, window, neck, side):
  """A SAM encoder ConfigDict: SAM's LayerNorm eps (1e-6), exact GELU,
  MLPs 4x wide."""
  return ml_collections.ConfigDict(dict(
      model_name=name, image_size=side, patch_size=16, hidden_size=hidden,
      num_layers=layers, num_heads=heads, mlp_dim=4 * hidden,
      window_size=window, global_blocks=global_blocks, neck_channels=neck,
      layer_norm_eps=1e-6, qkv_bias=True, gelu_approximate=False,
      stochastic_depth=0., dtype='float32'))


def image_multiple(model_config):
  """Sides are multiples of the patch (the grid is padded to windows)."""
  patch = model_config['patch_size']
  return (patch, patch), 'the patch size'


registry.register(registry.Family(
    'SAM', sam.SamImageEncoder,
    [_sam(name, *row) for name, row in _SAMS.items()], weights='timm',
    native=1024, native_sizes={'SAM-testing': 128}, timm_layout='sam',
    timm_architecture=r'samvit_.*', image_multiple=image_multiple))
