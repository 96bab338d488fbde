"""DINOv2 (Oquab et al., 2023): timm's ViTs with LayerScale 1e-5, each with
a '-reg4' twin with 4 registers (Darcet et al., 2024) and a table without
the prefix tokens; DINOv2-g's MLP is a SwiGLU. Published at 518 px."""

from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, swiglu)
_DINOV2S = {
    'DINOv2-testing': (32, 64, 2, 2, 14, False),
    'DINOv2-S_14': (384, 1536, 6, 12, 14, False),
    'DINOv2-B_14': (768, 3072, 12, 12, 14, False),
    'DINOv2-L_14': (1024, 4096, 16, 24, 14, False),
    # timm's fc1 of 8192 features: both halves of the SwiGLU.
    'DINOv2-g_14': (1536, 4096, 24, 40, 14, True),
}


def _dinov2s(name, *row_and_swiglu):
  """The DINOv2 preset `name` and its '-reg4' twin (4 registers)."""
  *row, swiglu = row_and_swiglu
  yield vit_families.timm_vit_config(name, *row, layerscale_init=1e-5,
                                     swiglu=swiglu)
  yield vit_families.timm_vit_config(
      name + '-reg4', *row, layerscale_init=1e-5, posemb_prefix=False,
      num_registers=4, swiglu=swiglu)


registry.register(vit_families.vit_family(
    'DINOv2',
    [c for name, row in _DINOV2S.items() for c in _dinov2s(name, *row)],
    weights='timm', native=518))
