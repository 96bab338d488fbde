"""Google's ViTs (the paper's presets) and hybrids, and the config builders
that every ViT family shares (`vit_config`, `timm_vit_config`)."""

import ml_collections

from vit_jax.models import posemb
from vit_jax.models import registry
from vit_jax.models import vit

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, dropout_rate,
#        classifier)
VITS = {
    'testing': (10, 10, 2, 1, 16, 0.1, 'token'),
    'testing-unpooled': (10, 10, 2, 1, 16, 0.1, 'unpooled'),
    'ViT-Ti_16': (192, 768, 3, 12, 16, 0.0, 'token'),
    'ViT-S_16': (384, 1536, 6, 12, 16, 0.0, 'token'),
    'ViT-S_32': (384, 1536, 6, 12, 32, 0.0, 'token'),
    'ViT-B_16': (768, 3072, 12, 12, 16, 0.0, 'token'),
    'ViT-B_8': (768, 3072, 12, 12, 8, 0.0, 'token'),
    'ViT-B_32': (768, 3072, 12, 12, 32, 0.0, 'token'),
    'ViT-L_16': (1024, 4096, 16, 24, 16, 0.1, 'token'),
    'ViT-L_32': (1024, 4096, 16, 24, 32, 0.0, 'token'),
    'ViT-H_14': (1280, 5120, 16, 32, 14, 0.1, 'token'),
    'ViT-B_16-gap-norep': (768, 3072, 12, 12, 16, 0.0, 'gap'),
    'ViT-B_32-gap-norep': (768, 3072, 12, 12, 32, 0.0, 'gap'),
    'ViT-S_16-gap-norep': (384, 1536, 6, 12, 16, 0.0, 'gap'),
    'ViT-S_32-gap-norep': (384, 1536, 6, 12, 32, 0.0, 'gap'),
}

# Hybrids: the ViT `base` on a ResNet with `num_layers` units per stage. The
# ResNet root (stride-2 conv, stride-2 max-pool) downsamples 4x and each
# stage after the first another 2x (`posemb.resnet_stride`).
# name: (base, patch, num_layers, dropout_rate)
_HYBRIDS = {
    # Root alone with 8x8 patches: an effective patch of 32 (a 7x7 grid at
    # 224 px), as the original's preset, despite the name.
    'R+ViT-Ti_16': ('ViT-Ti_16', 8, (), 0.0),
    # Four stages of 2 units: 4 * 2**3 = 32.
    'R26+ViT-S_32': ('ViT-S_16', 1, (2, 2, 2, 2), 0.0),
    'R26+ViT-B_32': ('ViT-B_32', 1, (2, 2, 2, 2), 0.0),
    # (3, 4, 9) instead of ResNet-50's (3, 4, 6, 3) keeps the same depth at a
    # downsampling of 4 * 2**2 = 16.
    'R50+ViT-B_16': ('ViT-B_16', 1, (3, 4, 9), 0.1),
    # The stages of ResNet-50: 4 * 2**3 = 32.
    'R50+ViT-L_32': ('ViT-L_16', 1, (3, 4, 6, 3), 0.1),
}


def vit_config(name, hidden, mlp, heads, layers, patch, dropout, classifier):
  """A ViT ConfigDict with the original's fields."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patches': {'size': (patch, patch)},
      'hidden_size': hidden,
      'transformer': {
          'mlp_dim': mlp,
          'num_heads': heads,
          'num_layers': layers,
          'attention_dropout_rate': 0.0,
          'dropout_rate': dropout,
          # Position embedding (Appendix D.4) and stochastic depth options,
          # at the paper's values; listed so that they can be set on a
          # locked preset (as is `posemb` below).
          'relative_max_distance': 8,
          'stochastic_depth': 0.0,
          # Memory savers (docs/performance.md).
          'remat_policy': 'none',
          'scan': False,
          # timm's models' options (`timm_vit_config`), off for Google's.
          'gelu_approximate': True,
          # A typed None, which a command line can set.
          'layerscale_init': ml_collections.config_dict.placeholder(float),
          'swiglu': False,
      },
      'classifier': classifier,
      'representation_size': None,
      'posemb': 'learn',
      'num_registers': 0,
      'posemb_prefix': True,
      'fc_norm': False,
      'dtype': 'float32',  # of the computation; parameters stay float32
  })


def timm_vit_config(name, hidden, mlp, heads, layers, patch,
                    layerscale_init=None, posemb_prefix=True,
                    num_registers=0, swiglu=False):
  """A ViT preset of timm's weights: exact GELU, class token, no dropout."""
  config = vit_config(name, hidden, mlp, heads, layers, patch, 0.0, 'token')
  config.transformer.gelu_approximate = False
  config.transformer.layerscale_init = layerscale_init
  config.transformer.swiglu = swiglu
  config.posemb_prefix = posemb_prefix
  config.num_registers = num_registers
  return config


def _hybrid(name, base, patch, num_layers, dropout):
  """The ViT preset `base` on a ResNet, with its own patch and dropout."""
  config = vit_config(name, *VITS[base])
  config.patches.size = (patch, patch)
  config.transformer.dropout_rate = dropout
  config.resnet = ml_collections.ConfigDict(
      {'num_layers': num_layers, 'width_factor': 1})
  return config


def image_multiple(model_config):
  """Image sides are multiples of the patch size (a hybrid's ResNet takes
  any)."""
  if model_config.get('resnet') is not None:
    return None
  return posemb.patch_size(model_config['patches']), 'its patch size'


def patch_resizable(model_config) -> bool:
  """FlexiViT's PI-resize: a ViT without a ResNet, its table not 'learn2d'."""
  return (model_config.get('resnet') is None and
          model_config.get('posemb') != 'learn2d')


def vit_family(name, presets, **kw) -> registry.Family:
  """A family built by `VisionTransformer`, converted as timm's ViT."""
  return registry.Family(
      name, vit.VisionTransformer, presets, image_multiple=image_multiple,
      patch_resizable=patch_resizable, **{'timm_layout': 'vit', **kw})


registry.register(vit_family('ViT', [
    *(vit_config(name, *row) for name, row in VITS.items()),
    *(_hybrid(name, *row) for name, row in _HYBRIDS.items()),
]))
