"""timm's `config.json`: every setting that changes the computation is
carried over to vit_jax's model config (pooling, GELU's form, LayerScale,
registers...) or refused, naming it."""

import re
from typing import Any, Dict

import numpy as np


Flat = Dict[str, np.ndarray]


# What timm's ViT entrypoints pass for each size; the hub's config.json
# records only the arguments given to `create_model`, not these.
SIZES = {
    'tiny': dict(embed_dim=192, depth=12, num_heads=3),
    'small': dict(embed_dim=384, depth=12, num_heads=6),
    'medium': dict(embed_dim=512, depth=12, num_heads=8),
    'base': dict(embed_dim=768, depth=12, num_heads=12),
    'large': dict(embed_dim=1024, depth=24, num_heads=16),
    'huge': dict(embed_dim=1280, depth=32, num_heads=16),
    'giant': dict(embed_dim=1536, depth=40, num_heads=24),  # DINOv2's
    'so400m': dict(embed_dim=1152, depth=27, num_heads=16,
                   mlp_ratio=3.7362),  # SigLIP's
}
# timm VisionTransformer's defaults for what is read below.
VIT_DEFAULTS = dict(global_pool='token', class_token=True, fc_norm=None,
                     act_layer=None, patch_size=16, mlp_ratio=4.,
                     distilled=False, init_values=None, no_embed_class=False,
                     reg_tokens=0, mlp_layer=None, pre_norm=False,
                     layer_norm_eps=1e-6)
# Arguments that vit_jax computes only at timm's default, and why not else.
_FIXED = {
    'qkv_bias': (True, 'its attention has no query/key/value biases'),
    'proj_bias': (True, "its attention's output projection has no bias"),
    'qk_norm': (False, 'it normalizes queries and keys (attn.q_norm, '
                'attn.k_norm)'),
    'scale_attn_norm': (False, 'it normalizes inside the attention'),
    'scale_mlp_norm': (False, 'it normalizes inside the MLP'),
    'final_norm': (True, 'no LayerNorm comes after the blocks'),
    'pos_embed': ('learn', 'vit_jax converts only a learned position table'),
    'pool_include_prefix': (False, 'the pooling includes the prefix tokens'),
    'dynamic_img_size': (False, 'it resizes the position embedding for each '
                         "input; vit_jax's is resized once, when loaded"),
    'dynamic_img_pad': (False, 'it pads images to whole patches'),
    'in_chans': (3, "vit_jax's pipelines feed RGB images"),
    'norm_layer': (None, "vit_jax's norms are LayerNorms (eps as the "
                   "entrypoint's)"),
    'embed_norm_layer': (None, 'the patch embedding is normalized'),
    'embed_layer': (None, 'another patch embedding'),
    'block_fn': (None, 'another block'),
    'attn_layer': (None, 'another attention'),
}
# Carried over to vit_jax (or checked against the weights and the preset).
_MAPPED = {'global_pool', 'class_token', 'fc_norm', 'act_layer', 'embed_dim',
           'depth', 'num_heads', 'mlp_ratio', 'patch_size', 'distilled',
           'init_values', 'no_embed_class', 'reg_tokens', 'mlp_layer',
           'pre_norm', 'layer_norm_eps'}
# Training, initialization, or what the weights' shapes say anyway.
_INERT = {'img_size', 'num_classes', 'drop_rate', 'pos_drop_rate',
          'patch_drop_rate', 'proj_drop_rate', 'attn_drop_rate',
          'drop_path_rate', 'weight_init', 'fix_init'}


def unsupported(key: str, value, why: str) -> ValueError:
  return ValueError(f'timm setting {key}={value!r} is not supported by '
                    f'vit_jax: {why}.')


def read_settings(config: Dict[str, Any], defaults: Dict[str, Any],
                  architecture_args) -> Dict[str, Any]:
  """The arguments that one of timm's model classes got: its `defaults`,
  what the entrypoint that config.json names passes (`architecture_args`),
  then config.json's global_pool and create_model's arguments (which win,
  as in timm)."""
  if 'architecture' not in config:
    raise ValueError("config.json names no 'architecture': it is not timm's.")
  settings = dict(defaults, **architecture_args(config['architecture']))
  if 'global_pool' in config:
    settings['global_pool'] = config['global_pool']
  settings.update(config.get('model_args') or {})
  return settings


def check_settings(settings: Dict[str, Any], fixed, known) -> None:
  """Refuses a setting of `fixed` ({name: (the value vit_jax computes, why
  not another)}) at another value, and one neither there nor `known`."""
  for key, value in settings.items():
    if key in fixed:
      if value != fixed[key][0]:
        raise unsupported(key, value, fixed[key][1])
    elif key not in known:
      raise unsupported(key, value, 'vit_jax.convert does not know what it '
                        'changes')


def _architecture_args(name: str) -> Dict[str, Any]:
  """What timm's entrypoint `name` passes to its VisionTransformer."""
  plain = re.fullmatch(r'(?:vit|deit)_(tiny|small|base|large|huge)_patch(\d+)'
                       r'_\d+', name)
  if plain:
    return dict(SIZES[plain[1]], patch_size=int(plain[2]))
  distilled = re.fullmatch(r'deit_(tiny|small|base)_distilled_patch(\d+)_\d+',
                           name)
  if distilled:  # timm's VisionTransformerDistilled
    return dict(SIZES[distilled[1]], patch_size=int(distilled[2]),
                distilled=True)
  gap = re.fullmatch(r'vit_(base|huge)_patch(\d+)_gap_\d+', name)
  if gap:  # 16 heads, also at the base width
    return dict(SIZES[gap[1]], patch_size=int(gap[2]), num_heads=16,
                class_token=False, global_pool='avg', fc_norm=False)
  hybrid = re.fullmatch(r'vit_(tiny|small|base|large)_r\d*_s\d+(?:_p(\d+))?'
                        r'_\d+', name)
  if hybrid:  # patches of the ResNet's feature map
    return dict(SIZES[hybrid[1]], patch_size=int(hybrid[2] or 1))
  deit3 = re.fullmatch(r'deit3_(small|medium|base|large|huge)_patch(\d+)_'
                       r'\d+(?:_\w+)?', name)
  if deit3:
    return dict(SIZES[deit3[1]], patch_size=int(deit3[2]),
                no_embed_class=True, init_values=1e-6)
  dinov2 = re.fullmatch(r'vit_(small|base|large|giant)_patch14_(reg4_)?'
                        r'dinov2', name)
  if dinov2:
    args = dict(SIZES[dinov2[1]], patch_size=14, init_values=1e-5)
    if dinov2[2]:
      args.update(reg_tokens=4, no_embed_class=True)
    if dinov2[1] == 'giant':  # timm's fc1 of 8192 = 2 x 4096 features
      args.update(mlp_ratio=2.66667 * 2, mlp_layer='swiglu_packed',
                  act_layer='silu')
    return args
  clip = re.fullmatch(r'vit_(base|large|huge)_patch(\d+)_clip(_quickgelu)?_'
                      r'\d+', name)
  if clip:  # its LayerNorm(eps=1e-5) is a partial that config.json lacks
    return dict(SIZES[clip[1]], patch_size=int(clip[2]), pre_norm=True,
                layer_norm_eps=1e-5,
                act_layer='quick_gelu' if clip[3] else None)
  siglip = re.fullmatch(r'vit_(base|large|so400m)_patch(\d+)_siglip(_gap)?_'
                        r'\d+', name)
  if siglip:
    pool = dict(global_pool='avg', fc_norm=False) if siglip[3] else dict(
        global_pool='map')
    return dict(SIZES[siglip[1]], patch_size=int(siglip[2]),
                class_token=False, **pool)
  if re.fullmatch(r'mixer_[sbl](16|32)_224', name):
    raise unsupported('act_layer', 'GELU', "timm's MlpMixer computes the "
                      "exact GELU, vit_jax's its tanh form")
  raise ValueError(
      f"timm architecture {name!r} is not one that vit_jax.convert knows: its "
      'entrypoint sets arguments that config.json does not record. Known: '
      'vit_{tiny,small,base,large,huge}_patchP_S, deit_*_patchP_S, '
      'deit_*_distilled_patchP_S, deit3_*_patchP_S, vit_*_patch14_[reg4_]'
      'dinov2, vit_{base,huge}_patchP_gap_S, the R+ViT hybrids vit_*_r*_s*, '
      'vit_*_clip[_quickgelu]_S, vit_*_siglip[_gap]_S, '
      'eva02_{tiny,small,base,large}_patch14_S and vit_*_patch16_dinov3'
      '[_qkvb].')


def timm_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's VisionTransformer got, from its config.json."""
  return read_settings(config, VIT_DEFAULTS, _architecture_args)


def uses_fc_norm(settings) -> bool:
  """Whether the final norm comes after the pooling (timm's rule)."""
  if settings['fc_norm'] is None:
    return settings['global_pool'] in ('avg', 'avgmax', 'max')
  return bool(settings['fc_norm'])


def _classifier(settings) -> str:
  """vit_jax's classifier that pools as timm's `global_pool` does."""
  pool, cls = settings['global_pool'], settings['class_token']
  if settings['distilled']:
    return _distilled_classifier(settings)
  if pool == 'token' and cls:
    # A LayerNorm acts on each token alone: after the pooling (fc_norm) on
    # the class token is the same as before it on every token.
    return 'token'
  if pool == 'avg':  # of the patch tokens, the prefix left out
    return 'token_gap' if cls else 'gap'
  if pool == 'token':
    raise unsupported('class_token', cls, "global_pool='token' needs it")
  if pool == 'map' and not cls:
    return 'map'
  if pool == 'map':
    raise unsupported('class_token', cls, "vit_jax's MAP head pools a ViT "
                      'without one')
  raise unsupported('global_pool', pool, "vit_jax converts 'token' and "
                    "'avg' pooling only")


def _distilled_classifier(settings) -> str:
  """'distilled', where timm's VisionTransformerDistilled computes it."""
  if settings['global_pool'] != 'token' or not settings['class_token']:
    raise unsupported('global_pool', settings['global_pool'], 'the '
                      'distilled heads read the class and distillation '
                      'tokens')
  if uses_fc_norm(settings):
    raise unsupported('fc_norm', settings['fc_norm'], "timm's distilled "
                      'heads skip it (and its final norm)')
  return 'distilled'


def _gelu_approximate(act) -> bool:
  if act in (None, 'gelu'):  # nn.GELU: the exact erf form
    return False
  if act in ('gelu_tanh', 'gelu_pytorch_tanh'):
    return True
  raise unsupported('act_layer', act, "vit_jax's MLP computes GELU (exact "
                    "or tanh), or SwiGLU, only")


def mlp_settings(settings) -> Dict[str, Any]:
  """vit_jax's MLP settings for timm's mlp_layer and act_layer."""
  if settings['mlp_layer'] is None and settings['act_layer'] == 'quick_gelu':
    return {'gelu_approximate': False, 'swiglu': False, 'quick_gelu': True}
  if settings['mlp_layer'] is None:
    return {'gelu_approximate': _gelu_approximate(settings['act_layer']),
            'swiglu': False, 'quick_gelu': False}
  if settings['mlp_layer'] == 'swiglu_packed' and settings['act_layer'] in (
      'silu', 'swish'):  # timm's SwiGLUPacked: silu(x1) * x2, x1 first
    return {'gelu_approximate': False, 'swiglu': True, 'quick_gelu': False}
  raise unsupported('mlp_layer', settings['mlp_layer'], "vit_jax's MLP is "
                    "timm's Mlp (GELU) or SwiGLUPacked (SiLU)")


def vit_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for timm's VisionTransformer `settings`, or a
  ValueError naming the first one that vit_jax cannot compute."""
  check_settings(settings, _FIXED, _MAPPED | _INERT)
  classifier = _classifier(settings)
  return {'classifier': classifier,
          'fc_norm': (classifier in ('gap', 'token_gap') and
                      uses_fc_norm(settings)),
          'num_registers': settings['reg_tokens'],
          'posemb_prefix': not settings['no_embed_class'],
          # timm's patch embedding has no bias before a pre-norm (CLIP).
          'patch_bias': not settings['pre_norm'],
          'transformer': dict(mlp_settings(settings),
                              layerscale_init=settings['init_values'],
                              pre_norm=settings['pre_norm'],
                              layer_norm_eps=settings['layer_norm_eps'])}
