"""SigLIP's image towers (Zhai et al., 2023): no class token, a MAP head,
tanh GELU, Google's [-1, 1] inputs; '-gap': mean pooling."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_SIGLIPS = {
    'SigLIP-testing': (32, 64, 2, 2, 16),
    'SigLIP-B_16': (768, 3072, 12, 12, 16),
    'SigLIP-L_16': (1024, 4096, 16, 24, 16),
    'SigLIP-So400m_14': (1152, 4304, 16, 27, 14),
}

registry.register(vit_families.vit_family('SigLIP', [
    vit_families.vit_config(name + suffix, *row, 0.0, classifier)
    for name, row in _SIGLIPS.items()
    for suffix, classifier in (('', 'map'), ('-gap', 'gap'))],
    timm_architecture=r'.*_siglip(_gap)?_\d+'))
