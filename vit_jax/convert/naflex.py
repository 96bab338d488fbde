"""timm's NaFlexVit of SigLIP 2 (`naflexvit_*_siglip`): its state dict as
timm ViT's names, its config.json as a ViT's settings plus the table grid.

NaFlexVit embeds flattened patches by a Linear (`embeds.proj`, (D, p*p*C),
the patch in (p, p, C) order): the conv kernel (D, C, p, p) of a ViT,
reshaped. Its learned table `embeds.pos_embed` (1, gh, gw, D) is resized
to each image's grid bilinearly with antialias (torch's `interpolate`),
which a `VisionTransformer` with `posemb_grid=(gh, gw)` computes.
"""

import re
from typing import Any, Dict

import numpy as np

from vit_jax.convert import timm_config

Flat = Dict[str, np.ndarray]

# What timm's naflexvit_*_siglip entrypoints pass (timm/models/naflexvit.py).
_SIZES = {'base': dict(embed_dim=768, depth=12, num_heads=12),
          'so400m': dict(embed_dim=1152, depth=27, num_heads=16,
                         mlp_ratio=3.7362)}
# NaFlexVitCfg's defaults of what is read below.
_DEFAULTS = dict(patch_size=16, embed_dim=768, depth=12, num_heads=12,
                 mlp_ratio=4.0, act_layer=None, global_pool='map',
                 class_token=False, reg_tokens=0, fc_norm=None,
                 init_values=None, pre_norm=False, mlp_layer=None,
                 pos_embed_grid_size=(16, 16), pos_embed_interp_mode='bicubic',
                 embed_proj_type='linear')
# Computed only at these values (SigLIP 2's), and why not at another.
_FIXED = {
    **timm_config._FIXED,  # pylint: disable=protected-access
    'pos_embed': ('learned', 'vit_jax converts only a learned position table'),
    'pos_embed_interp_mode': ('bilinear', "vit_jax resizes NaFlex's table "
                              'bilinearly'),
    'pos_embed_antialias': (True, 'its table is resized without antialias'),
    'pos_embed_align_corners': (False, 'its table is resized with '
                                'align_corners'),
    'pos_embed_ar_preserving': (False, 'its table is resized to a square'),
    'pos_embed_use_grid_sample': (False, 'its table is sampled by '
                                  'grid_sample'),
    'patchify_channels_last': (True, 'its patches are flattened as (C, p, p)'),
    'class_token': (False, "vit_jax's MAP head pools a ViT without one"),
    'reg_tokens': (0, 'it has register tokens'),
    'global_pool': ('map', 'vit_jax converts NaFlex towers with a MAP head'),
    'attn_pool_num_heads': (None, 'its MAP head has its own heads'),
    'attn_pool_mlp_ratio': (None, 'its MAP head has its own MLP width'),
    'rope_type': ('', 'it has rotary position embeddings'),
    'attn_type': ('standard', 'another attention'),
    'input_norm_layer': (None, 'the patches are normalized'),
    'embed_norm_layer': (None, 'the patch embedding is normalized'),
    'num_kv_heads': (None, 'grouped keys and values'),
    'scale_attn_inner_norm': (False, 'it normalizes inside the attention'),
    'attn_gated': (False, 'a gated attention'),
    'swiglu_mlp': (False, 'a SwiGLU MLP'),
    'qkv_fused': (True, 'separate query, key and value'),
    'attn_only_layer_scale': (False, 'LayerScale on the attention only'),
    'enable_patch_interpolator': (False, 'patches of other sizes'),
}
_MAPPED = {'patch_size', 'embed_dim', 'depth', 'num_heads', 'mlp_ratio',
           'act_layer', 'fc_norm', 'init_values', 'pre_norm', 'mlp_layer',
           'pos_embed_grid_size', 'embed_proj_type'}
_INERT = timm_config._INERT | {  # pylint: disable=protected-access
    'use_key_only_attn_mask', 'rope_temperature', 'rope_ref_feat_shape',
    'rope_grid_offset', 'rope_grid_indexing', 'rope_rotate_half',
    'rope_shift_coords', 'rope_jitter_coords', 'rope_rescale_coords',
    'rope_mrope_section', 'swiglu_align_to', 'layer_norm_eps'}


def is_naflex(architecture: str) -> bool:
  return architecture.startswith('naflexvit_')


def _architecture_args(name: str) -> Dict[str, Any]:
  siglip = re.fullmatch(r'naflexvit_(base|so400m)_patch(\d+)_siglip', name)
  if not siglip:
    raise ValueError(f"timm architecture {name!r} is not one that "
                     'vit_jax.convert knows: of NaFlexVit, it converts '
                     "SigLIP 2's naflexvit_{base,so400m}_patch16_siglip.")
  return dict(_SIZES[siglip[1]], patch_size=int(siglip[2]),
              act_layer='gelu_tanh', global_pool='map',
              pos_embed_interp_mode='bilinear')


def naflex_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """timm ViT's settings of the same computation (`timm_config`'s keys),
  plus `pos_embed_grid_size`; refuses what vit_jax cannot compute."""
  settings = timm_config.read_settings(config, _DEFAULTS, _architecture_args)
  timm_config.check_settings(settings, _FIXED, _MAPPED | _INERT)
  settings.update(distilled=False, no_embed_class=False, layer_norm_eps=1e-6)
  return settings


def naflex_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config: a ViT's, its table resized per image."""
  vit = {k: v for k, v in settings.items()
         if k not in ('pos_embed_grid_size', 'embed_proj_type',
                      'pos_embed_interp_mode')}
  return dict(timm_config.vit_overrides(vit),
              posemb_grid=tuple(settings['pos_embed_grid_size']))


def to_vit_state(state: Flat) -> Flat:
  """NaFlexVit's names and shapes as timm ViT's: `embeds.proj` as a conv
  kernel, the (1, gh, gw, D) table as (1, gh * gw, D)."""
  out = {}
  for key, value in state.items():
    if key == 'embeds.proj.weight' and value.ndim == 2:
      d, flat = value.shape
      p = int(round(np.sqrt(flat / 3)))
      value = value.reshape(d, p, p, 3).transpose(0, 3, 1, 2)
    elif key == 'embeds.pos_embed':
      value = value.reshape(1, -1, value.shape[-1])
    out[re.sub(r'^embeds\.pos_embed$', 'pos_embed',
               re.sub(r'^embeds\.proj\.', 'patch_embed.proj.', key))] = value
  return out


def grid_of(state: Flat):
  """The (gh, gw) of NaFlexVit's table."""
  return tuple(state['embeds.pos_embed'].shape[1:3])
