"""DeiT (Touvron et al., 2021): ViTs with timm's exact GELU, each also with
the distillation token and its head ('-distilled', classifier='distilled')."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_DEITS = {
    'DeiT-testing': (32, 64, 2, 2, 8),
    'DeiT-Ti_16': (192, 768, 3, 12, 16),
    'DeiT-S_16': (384, 1536, 6, 12, 16),
    'DeiT-B_16': (768, 3072, 12, 12, 16),
}


def _deits(name, hidden, mlp, heads, layers, patch):
  """The DeiT preset `name` and its '-distilled' twin."""
  for suffix, classifier in (('', 'token'), ('-distilled', 'distilled')):
    config = vit_families.vit_config(name + suffix, hidden, mlp, heads,
                                     layers, patch, 0.0, classifier)
    config.transformer.gelu_approximate = False
    yield config


registry.register(vit_families.vit_family(
    'DeiT', [c for name, row in _DEITS.items() for c in _deits(name, *row)],
    weights='timm'))
