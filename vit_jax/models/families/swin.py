"""Swin Transformer (Liu et al., 2021), timm's swin_*_patch4_window7_224.
'Swin-testing' matches the small timm model of the golden files
(scripts/make_swin_golden.py)."""

import ml_collections

from vit_jax.models import registry
from vit_jax.models import swin

# name: (embed_dim, depths, num_heads, patch, window)
_SWINS = {
    'Swin-testing': (4, (2, 2, 2, 2), (1, 2, 2, 4), 2, 2),
    'Swin-T': (96, (2, 2, 6, 2), (3, 6, 12, 24), 4, 7),
    'Swin-S': (96, (2, 2, 18, 2), (3, 6, 12, 24), 4, 7),
    'Swin-B': (128, (2, 2, 18, 2), (4, 8, 16, 32), 4, 7),
    # timm's swin_base_patch4_window12_384: windows of 12 at 384 px.
    'Swin-B_384': (128, (2, 2, 18, 2), (4, 8, 16, 32), 4, 12),
}


def _swin(name, embed_dim, depths, num_heads, patch, window):
  """A Swin ConfigDict: timm's exact GELU, no dropout."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patch_size': patch,
      'embed_dim': embed_dim,
      'depths': depths,
      'num_heads': num_heads,
      'window_size': window,
      'dropout_rate': 0.0,
      'attention_dropout_rate': 0.0,
      'stochastic_depth': 0.0,
      'gelu_approximate': False,
      'dtype': 'float32',
  })


def image_multiple(model_config):
  """Sides are multiples of patch x window x 2**(stages - 1)."""
  multiple = swin.image_multiple(model_config['patch_size'],
                                 model_config['window_size'],
                                 len(model_config['depths']))
  return (multiple, multiple), 'patch x window x 2**(stages - 1)'


registry.register(registry.Family(
    'Swin', swin.SwinTransformer,
    [_swin(name, *row) for name, row in _SWINS.items()], weights='timm',
    native_sizes={'Swin-B_384': 384}, timm_layout='swin',
    image_multiple=image_multiple))
