"""AIMv2 (Fini et al., 2025), Apple's autoregressively pre-trained image
encoders, as timm's `aimv2_*` VisionTransformer builds them: RMSNorm (eps
1e-5) on the patch embedding (`embedding_norm`), in the blocks and after
them; SwiGLU; no biases in the attention nor the MLP (the patch embedding
has one); no class token, the patch mean ('gap'); CLIP's mean and std.

One preset per architecture: the published 224/336/448 px files of one size
differ only in their tables' grid, which the image size sets at init.
Shapes from timm's entrypoints: mlp_dim is each SwiGLU half, int(D *
mlp_ratio) with mlp_ratio 2.75 (L, 1B) or 2.6667 (H, 3B)."""

from vit_jax.models.families import vit as vit_families
from vit_jax.models import registry

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_AIMV2S = {
    'AIMv2-testing': (32, 64, 2, 2, 14),
    'AIMv2-L_14': (1024, 2816, 8, 24, 14),
    'AIMv2-H_14': (1536, 4096, 12, 24, 14),
    'AIMv2-1B_14': (2048, 5632, 16, 24, 14),
    'AIMv2-3B_14': (3072, 8192, 24, 24, 14),
}


def aimv2_config(name, *row):
  """An AIMv2 image encoder."""
  config = vit_families.timm_vit_config(name, *row, swiglu=True)
  config.classifier, config.patch_norm = 'gap', True
  config.transformer.update(norm='rmsnorm', layer_norm_eps=1e-5,
                            qkv_bias='none', out_bias=False, mlp_bias=False)
  return config


registry.register(vit_families.vit_family(
    'AIMv2', [aimv2_config(name, *row) for name, row in _AIMV2S.items()],
    weights='timm', normalization='clip', timm_layout='aimv2',
    timm_architecture=r'aimv2_\w+'))
