"""Perception Encoder (Bolya et al., 2025), timm's Eva at its vit_pe_*
settings: a pre-norm and no patch bias, a learned table beside 2-D RoPE
(EVA-02's with positions from 1, columns first, on the pretraining grid),
q, k and v biases, exact GELU, LayerNorm eps 1e-5, inputs in [-1, 1].

- Core (CLIP-aligned): a class token, the final norm, then an attention
  pool of 8 heads (MLP 4 D) over every token and the projection `head`.
- Spatial and Lang (dense features, the LLM's eyes): no final norm, the
  patches' mean; Lang and Spatial-G with LayerScale 0.1.
- G: no class token, RoPE positions from 0, a 32x32 reference grid.
"""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch); G's mlp_dim
# is timm's int(1536 * 8960 / 1536).
_SIZES = {
    'T_16': (192, 768, 3, 12, 16),
    'S_16': (384, 1536, 6, 12, 16),
    'B_16': (768, 3072, 12, 12, 16),
    'L_14': (1024, 4096, 16, 24, 14),
    'G_14': (1536, 8960, 16, 50, 14),
    'testing': (32, 64, 2, 2, 16),
}
# kind: {size: (native side, reference grid side)}
_PUBLISHED = {
    'Core': {'testing': (64, 24), 'T_16': (384, 24), 'S_16': (384, 24),
             'B_16': (224, 14), 'L_14': (336, 24), 'G_14': (448, 32)},
    'Spatial': {'testing': (64, 32), 'T_16': (512, 32), 'S_16': (512, 32),
                'B_16': (512, 32), 'L_14': (448, 32), 'G_14': (448, 32)},
    'Lang': {'testing': (56, 32), 'L_14': (448, 32), 'G_14': (448, 32)},
}
_LANG_DEPTHS = {'L_14': 23, 'G_14': 47}  # the last block of Core's dropped


def _pe(kind, size, ref):
  """The PE `kind` encoder of `size`, RoPE on a `ref` x `ref` grid."""
  hidden, mlp, heads, layers, patch = _SIZES[size]
  if kind == 'Lang':
    layers = _LANG_DEPTHS.get(size, layers)
    patch = 14 if size == 'testing' else patch
  gigantic = size == 'G_14'
  config = vit_families.timm_vit_config(
      f'PE-{kind}-{size}', hidden, mlp, heads, layers, patch,
      layerscale_init=0.1 if kind == 'Lang' or (
          kind, gigantic) == ('Spatial', True) else None)
  if kind == 'Core':
    config.classifier = 'map' if gigantic else 'token_map'
    config.update(map_heads=8, map_mlp_dim=4 * hidden)
  else:
    config.classifier = 'gap' if gigantic else 'token_gap'
    config.transformer.final_norm = False
  config.patch_bias = False
  config.transformer.update(
      pre_norm=True, layer_norm_eps=1e-5, rope='eva02', rope_theta=10_000.,
      rope_ref_grid=(ref, ref), rope_offset=0. if gigantic else 1.,
      rope_indexing='xy')
  return config


def _family(kind, sizes):
  """The PE `kind` family: its presets at their sides; the inputs in
  [-1, 1] (NORMALIZATIONS' 'google': mean and std 0.5, timm's
  pretrained_cfg), timm's antialiased resize of the table."""
  return vit_families.vit_family(
      f'PE {kind}', [_pe(kind, size, ref) for size, (_, ref) in
                     sizes.items()],
      weights='timm', normalization='google', timm_layout='eva',
      timm_architecture=rf'vit_pe_{kind.lower()}_\w+', native=None,
      native_sizes={f'PE-{kind}-{size}': side
                    for size, (side, _) in sizes.items()})


for published in _PUBLISHED.items():
  registry.register(_family(*published))
