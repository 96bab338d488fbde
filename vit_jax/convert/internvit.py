"""InternViT's settings: timm's `vit_intern*` config.json and transformers'
`InternVLVisionModel` config.json, as vit_jax's model config.

Both are read as timm's VisionTransformer arguments (`timm_config`), plus
what InternViT adds: no norm after the blocks (`final_norm`), timm's
per-head `qk_norm` or transformers' across the heads (`use_qk_norm`, an
RMSNorm), RMSNorm blocks (`norm_type='rms_norm'`), projections without
biases (`attention_bias=False`), and transformers' every token
(`classifier='token_unpooled'`). The weights keep timm ViT's names
(`transformers_layout` renames transformers').

timm's entrypoint sets `dynamic_img_size`: it resizes the table to each
input, with the antialiased bicubic that vit_jax's loader uses for timm's
weights once, at the size it loads for; the outputs at that size are the
same.
"""

import re
from typing import Any, Dict

from vit_jax.convert import timm_config

# What timm's InternViT entrypoints pass.
_ARCHITECTURES = {
    'vit_intern300m_patch14_448': dict(
        timm_config.SIZES['large'], patch_size=14, init_values=0.1,
        final_norm=False, dynamic_img_size=True),
}
# InternViT's settings beyond timm's ViT's (its defaults' values).
_EXTRA = dict(final_norm=True, dynamic_img_size=False, qk_norm=False,
              norm='layer', qkv_bias=True, unpooled=False)


def is_intern(architecture: str) -> bool:
  return bool(re.fullmatch(r'vit_intern\w+', architecture))


def _architecture_args(name: str) -> Dict[str, Any]:
  if name not in _ARCHITECTURES:
    raise ValueError(f'timm architecture {name!r} is not one that '
                     f'vit_jax.convert knows; known: {", ".join(_ARCHITECTURES)}.')
  return _ARCHITECTURES[name]


def timm_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's InternViT got, from its config.json."""
  return timm_config.read_settings(
      config, dict(timm_config.VIT_DEFAULTS, **_EXTRA), _architecture_args)


def transformers_settings(vision: Dict[str, Any],
                          settings: Dict[str, Any]) -> Dict[str, Any]:
  """`settings` (`transformers_config.vit_settings`) with what an
  InternVLVisionModel's config (`vision`) adds; refuses what vit_jax does
  not compute."""
  arch = 'InternVLVisionModel'
  rms = vision['norm_type'] == 'rms_norm'
  if vision['norm_type'] not in ('layer_norm', 'rms_norm'):
    raise ValueError(f"transformers' {arch} with norm_type="
                     f"{vision['norm_type']!r} is not supported.")
  if vision['use_qk_norm'] and (not rms or vision['layer_norm_eps'] != 1e-6):
    raise ValueError(f"transformers' {arch} with use_qk_norm: its query and "
                     'key norms are RMSNorms of epsilon 1e-6, which vit_jax '
                     "computes as the blocks' norms: norm_type='rms_norm' "
                     'and layer_norm_eps=1e-6 only.')
  if rms and not vision['use_mean_pooling']:
    raise ValueError(f"transformers' {arch} with norm_type='rms_norm' and "
                     'use_mean_pooling=False: its final norm is a LayerNorm '
                     "after RMSNorm blocks, which vit_jax's one norm kind "
                     'does not compute.')
  if not vision['use_absolute_position_embeddings']:
    raise ValueError(f"transformers' {arch} without "
                     'use_absolute_position_embeddings is not supported.')
  return dict(
      settings, init_values=vision['layer_scale_init_value'],
      final_norm=not vision['use_mean_pooling'],
      qk_norm='all' if vision['use_qk_norm'] else False,
      norm='rms' if rms else 'layer', qkv_bias=vision['attention_bias'],
      dynamic_img_size=False, unpooled=True)


def overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for InternViT's `settings`."""
  settings = dict(settings)
  extra = {key: settings.pop(key) for key in _EXTRA}
  out = timm_config.vit_overrides(settings)
  if extra['unpooled']:  # transformers' model returns every token
    out['classifier'] = 'token_unpooled'
  qk_norm = extra['qk_norm']
  out['transformer'].update(
      qk_norm={True: 'head', False: None}.get(qk_norm, qk_norm),
      norm=extra['norm'], qkv_bias='qkv' if extra['qkv_bias'] else 'none',
      final_norm=extra['final_norm'])
  return out
