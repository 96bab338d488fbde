"""CLIP's image towers (Radford et al., 2021), as timm builds them: a
LayerNorm before the blocks, no patch bias, LayerNorm eps 1e-5, CLIP's
mean and std; '-quickgelu': OpenAI's QuickGELU."""

from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.families import lit as lit_families
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

# OpenAI's text towers: (width, heads, layers, projection) per image preset.
_TEXTS = {'CLIP-testing': (32, 2, 2, 32), 'CLIP-B_32': (512, 8, 12, 512),
          'CLIP-B_16': (512, 8, 12, 512), 'CLIP-L_14': (768, 12, 12, 768)}


def _towers(name, width, heads, layers, projection):
  """'NAME-quickgelu-towers': OpenAI's CLIP, both towers (transformers'
  CLIPModel): a causal text transformer read at its end token."""
  image = registry.MODEL_CONFIGS[name + '-quickgelu']
  text = dict(width=width, num_heads=heads, num_layers=layers,
              mlp_dim=4 * width, vocab_size=49_408, layer_norm_eps=1e-5,
              gelu_approximate=False, quick_gelu=True, causal=True,
              pool='argmax')
  return lit_families.two_towers(
      f'{name}-quickgelu-towers', image, text, (projection,) * 2, 'clip', 77,
      temperature_init=1 / 0.07)


registry.register(registry.Family(
    'CLIP towers', lit.LitModel,
    [_towers(name, *row) for name, row in _TEXTS.items()], weights='timm',
    normalization='clip', native=None))
