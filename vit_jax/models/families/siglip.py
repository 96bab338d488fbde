"""SigLIP's image towers (Zhai et al., 2023): no class token, a MAP head,
tanh GELU, Google's [-1, 1] inputs; '-gap': mean pooling."""

from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.families import lit as lit_families
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



def _towers(name, hidden, mlp, heads, layers, _):
  """'NAME-towers': both towers (transformers' SiglipModel): a text
  transformer as wide as the image tower, read at its last token."""
  text = dict(width=hidden, num_heads=heads, num_layers=layers, mlp_dim=mlp,
              vocab_size=32_000, layer_norm_eps=1e-6, gelu_approximate=True,
              quick_gelu=False, causal=False, pool='last')
  return lit_families.two_towers(
      f'{name}-towers', registry.MODEL_CONFIGS[name], text, (None, hidden),
      'siglip', 64, temperature_init=10.0, bias_init=-10.0)


registry.register(registry.Family(
    'SigLIP towers', lit.LitModel,
    [_towers(name, *row) for name, row in _SIGLIPS.items()], native=None))
