"""EVA-02 (Fang et al., 2024), timm's Eva at its eva02_*_patch14_224
settings: q and v biases only, SwiGLU (B and L: with its inner norm), 2-D
RoPE on a 16x16 reference grid beside a learned table, patch mean with
fc_norm, CLIP's mean and std."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, mlp_norm);
# mlp_dim is each SwiGLU half: int(D * 8 / 3).
_EVA02S = {
    'EVA02-testing': (32, 64, 2, 2, 14, False),
    'EVA02-Ti_14': (192, 512, 3, 12, 14, False),
    'EVA02-S_14': (384, 1024, 6, 12, 14, False),
    'EVA02-B_14': (768, 2048, 12, 12, 14, True),
    'EVA02-L_14': (1024, 2730, 16, 24, 14, True),
}


def _eva02(name, *row_and_mlp_norm):
  """An EVA-02 encoder."""
  *row, mlp_norm = row_and_mlp_norm
  config = vit_families.timm_vit_config(name, *row)
  config.classifier, config.fc_norm = 'token_gap', True
  config.transformer.update(swiglu=True, mlp_norm=mlp_norm, qkv_bias='qv',
                            rope='eva02', rope_theta=10_000.,
                            rope_ref_grid=(16, 16))
  return config


registry.register(vit_families.vit_family(
    'EVA02', [_eva02(name, *row) for name, row in _EVA02S.items()],
    weights='timm', normalization='clip', timm_layout='eva',
    timm_architecture=r'eva02_.*'))
