"""DeiT III (Touvron et al., 2022): timm's ViTs with LayerScale 1e-6 and a
position table without the class token."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_DEIT3S = {
    'DeiT3-testing': (32, 64, 2, 2, 16),
    'DeiT3-S_16': (384, 1536, 6, 12, 16),
    'DeiT3-M_16': (512, 2048, 8, 12, 16),
    'DeiT3-B_16': (768, 3072, 12, 12, 16),
    'DeiT3-L_16': (1024, 4096, 16, 24, 16),
    'DeiT3-H_14': (1280, 5120, 16, 32, 14),
}

registry.register(vit_families.vit_family('DeiT3', [
    vit_families.timm_vit_config(name, *row, layerscale_init=1e-6,
                                 posemb_prefix=False)
    for name, row in _DEIT3S.items()], weights='timm'))
