"""DINOv3 (Simeoni et al., 2025), timm's Eva: no position table, DINOv3's
RoPE, 4 registers, LayerScale 1e-5, eps 1e-5, no q/k/v biases ('-qkvb': q
and v), patch mean as timm (classifier='token' for the class token)."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_DINOV3S = {
    'DINOv3-testing': (32, 64, 2, 2, 16),
    'DINOv3-S_16': (384, 1536, 6, 12, 16),
    'DINOv3-B_16': (768, 3072, 12, 12, 16),
    'DINOv3-L_16': (1024, 4096, 16, 24, 16),
}


def _dinov3s(name, *row):
  """The DINOv3 encoder `name` and its '-qkvb' twin."""
  for suffix, qkv_bias in (('', 'none'), ('-qkvb', 'qv')):
    config = vit_families.timm_vit_config(name + suffix, *row,
                                          layerscale_init=1e-5,
                                          num_registers=4)
    config.classifier, config.posemb = 'token_gap', 'none'
    config.transformer.update(qkv_bias=qkv_bias, layer_norm_eps=1e-5,
                              rope='dinov3', rope_theta=100.)
    yield config


registry.register(vit_families.vit_family(
    'DINOv3',
    [c for name, row in _DINOV3S.items() for c in _dinov3s(name, *row)],
    weights='timm', timm_layout='eva', timm_architecture=r'.*_dinov3\w*'))
