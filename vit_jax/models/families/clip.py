"""CLIP's image towers (Radford et al., 2021), as timm builds them: a
LayerNorm before the blocks, no patch bias, LayerNorm eps 1e-5, CLIP's
mean and std; '-quickgelu': OpenAI's QuickGELU."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_CLIPS = {
    'CLIP-testing': (32, 64, 2, 2, 16),
    'CLIP-B_32': (768, 3072, 12, 12, 32),
    'CLIP-B_16': (768, 3072, 12, 12, 16),
    'CLIP-L_14': (1024, 4096, 16, 24, 14),
}


def _clips(name, *row):
  """The CLIP image tower `name` and its '-quickgelu' twin (OpenAI's)."""
  for suffix in ('', '-quickgelu'):
    config = vit_families.timm_vit_config(name + suffix, *row)
    config.patch_bias = False
    config.transformer.update(pre_norm=True, layer_norm_eps=1e-5,
                              quick_gelu=bool(suffix))
    yield config


registry.register(vit_families.vit_family(
    'CLIP', [c for name, row in _CLIPS.items() for c in _clips(name, *row)],
    weights='timm', normalization='clip',
    timm_architecture=r'.*_clip(_quickgelu)?_\d+'))
