"""BEiT (Bao et al., ICLR 2022) and BEiT v2 (Peng et al., 2022), timm's
Beit as fine-tuned: no position table, a relative bias table in every
block, q and v biases only, LayerScale (BEiT-B: 0.1, else 1e-5), a class
token with the patch mean and fc_norm pooled. BEiT's inputs are in
[-1, 1], BEiT v2's normalized by ImageNet's mean and std: two families."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, layerscale)
_BEITS = {
    'BEiT-testing': (32, 64, 2, 2, 16, 0.1),
    'BEiT-B_16': (768, 3072, 12, 12, 16, 0.1),
    'BEiT-L_16': (1024, 4096, 16, 24, 16, 1e-5),
}
_BEITV2S = {
    'BEiTv2-testing': (32, 64, 2, 2, 16, 1e-5),
    'BEiTv2-B_16': (768, 3072, 12, 12, 16, 1e-5),
}


def _beit(name, *row_and_layerscale):
  """A BEiT encoder at timm's beit[v2]_*_patch16_224 settings."""
  *row, layerscale = row_and_layerscale
  config = vit_families.timm_vit_config(name, *row,
                                        layerscale_init=layerscale)
  config.classifier, config.fc_norm, config.posemb = 'token_gap', True, 'none'
  config.transformer.update(qkv_bias='qv', relative_bias='block')
  return config


registry.register(vit_families.vit_family(
    'BEiT', [_beit(name, *row) for name, row in _BEITS.items()],
    weights='timm', normalization='google', timm_layout='beit',
    timm_architecture=r'beit_\w+'))
registry.register(vit_families.vit_family(
    'BEiTv2', [_beit(name, *row) for name, row in _BEITV2S.items()],
    weights='timm', timm_layout='beit', timm_architecture=r'beitv2_\w+'))
