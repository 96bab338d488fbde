"""AIMv2 (Fini et al., 2025), Apple's autoregressively pre-trained image
encoders, as timm's `aimv2_*` VisionTransformer builds them: RMSNorm (eps
1e-5) on the patch embedding (`embedding_norm`), in the blocks and after
them; SwiGLU; no biases in the attention nor the MLP (the patch embedding
has one); no class token, the patch mean ('gap'); CLIP's mean and std.

One preset per architecture: the published 224/336/448 px files of one size
differ only in their tables' grid, which the image size sets at init.
Shapes from timm's entrypoints: mlp_dim is each SwiGLU half, int(D *
mlp_ratio) with mlp_ratio 2.75 (L, 1B) or 2.6667 (H, 3B).

'NAME-towers': transformers' Aimv2Model (the LiT-tuned L/14, Apple's
aimv2-large-patch14-224-lit): the image tower with its attention pooling
('kv_pool') and a bias-free projection, and a causal text tower of the same
blocks (RMSNorm, SwiGLU, no biases) read at its first end token, CLIP's
vocabulary; the sizes are transformers' Aimv2Config defaults (text 768
wide, 12 layers, 6 heads, SwiGLU halves 2048; projection 512).
"""

from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.families import lit as lit_families
from vit_jax.models.families import vit as vit_families

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
  config.transformer.update(norm='rms', layer_norm_eps=1e-5,
                            qkv_bias='none', out_bias=False, mlp_bias=False)
  return config


registry.register(vit_families.vit_family(
    'AIMv2', [aimv2_config(name, *row) for name, row in _AIMV2S.items()],
    weights='timm', normalization='clip', timm_layout='aimv2',
    timm_architecture=r'aimv2_\w+'))

# Text towers: (width, mlp_dim, num_heads, num_layers, projection_dim).
_TEXTS = {'AIMv2-testing': (32, 64, 2, 2, 24),
          'AIMv2-L_14': (768, 2048, 6, 12, 512)}


def _towers(name, width, mlp, heads, layers, projection):
  """Both towers of image preset `name` (transformers' Aimv2Model)."""
  image = aimv2_config(name, *_AIMV2S[name])
  image.classifier = 'kv_pool'
  text = dict(width=width, num_heads=heads, num_layers=layers, mlp_dim=mlp,
              vocab_size=49_408, layer_norm_eps=1e-5, gelu_approximate=False,
              quick_gelu=False, causal=True, pool='eos', eos_token=49_407,
              norm='rms', swiglu=True, qkv_bias='none', out_bias=False,
              mlp_bias=False)
  return lit_families.two_towers(
      f'{name}-towers', image, text, (projection,) * 2, 'clip', 77,
      temperature_init=1 / 0.07)


registry.register(registry.Family(
    'AIMv2 towers', lit.LitModel,
    [_towers(name, *row) for name, row in _TEXTS.items()], weights='timm',
    normalization='clip', native=None))
