"""MAE (He et al., 2022): the encoders, plain ViTs of timm's weights; timm
names them as ViTs, so its pretrained tag ('mae') tells them apart."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_MAES = {
    'MAE-testing': (32, 64, 2, 2, 16),
    'MAE-B_16': (768, 3072, 12, 12, 16),
    'MAE-L_16': (1024, 4096, 16, 24, 16),
    'MAE-H_14': (1280, 5120, 16, 32, 14),
}

registry.register(vit_families.vit_family('MAE', [
    vit_families.timm_vit_config(name, *row) for name, row in _MAES.items()],
    weights='timm', timm_tag='mae'))
