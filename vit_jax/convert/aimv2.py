"""timm's AIMv2 (`aimv2_*`: its VisionTransformer with RMSNorm, SwiGLU and
no attention or MLP biases) <-> vit_jax's ViT.

Its config.json is read as the ViT's is: every setting that changes the
computation is mapped or refused by name. Its state dict is put in the ViT's
timm names first, so that `convert.names` maps it:

  blocks.{i}.mlp.fc1_g, fc1_x (SwiGLU)  blocks.{i}.mlp.fc1 ([gate, x])

The blocks' RMSNorms keep the LayerNorms' names (`LayerNorm_0`,
`LayerNorm_2`; `transformer.norm='rms'` says which they are);
`embedding_norm` is the patch embedding's (`patch_embed.norm`).
"""

import re
from typing import Any, Dict, List

import numpy as np

from vit_jax.convert import timm_config

Flat = Dict[str, np.ndarray]

# What timm's aimv2_{size}_patch14_{side} entrypoints pass.
_SIZES = {
    'large': dict(embed_dim=1024, depth=24, num_heads=8, mlp_ratio=2.75),
    'huge': dict(embed_dim=1536, depth=24, num_heads=12, mlp_ratio=2.6667),
    '1b': dict(embed_dim=2048, depth=24, num_heads=16, mlp_ratio=2.75),
    '3b': dict(embed_dim=3072, depth=24, num_heads=24, mlp_ratio=2.6667),
}
# RmsNorm(eps=1e-5) is a partial that config.json lacks: by name here.
_ARGS = dict(patch_size=14, class_token=False, fc_norm=False,
             global_pool='avg', qkv_bias=False, proj_bias=False,
             act_layer='silu', norm_layer='rmsnorm',
             embed_norm_layer='rmsnorm', mlp_layer='swiglu',
             layer_norm_eps=1e-5)
# timm's VisionTransformer (its arguments as `timm_config` reads them).
# pylint: disable=protected-access
_VIT_FIXED, _INERT = timm_config._FIXED, timm_config._INERT
_VIT_DEFAULTS = timm_config.VIT_DEFAULTS
# pylint: enable=protected-access
# What vit_jax computes of AIMv2 only at its entrypoints' values.
_AIMV2 = 'AIMv2 is computed at its entrypoints\' settings'
_FIXED = dict(
    _VIT_FIXED,
    **{key: (value, _AIMV2) for key, value in _ARGS.items()
       if key not in ('patch_size', 'layer_norm_eps', 'global_pool')},
    init_values=(None, 'LayerScale'), reg_tokens=(0, 'register tokens'),
    no_embed_class=(False, 'no_embed_class'), pre_norm=(False, 'a pre-norm'),
    distilled=(False, 'a distillation token'))
_KNOWN = {'embed_dim', 'depth', 'num_heads', 'mlp_ratio', 'patch_size',
          'layer_norm_eps', 'swiglu_mlp', 'global_pool'}
# timm's global_pool -> vit_jax's classifier; 'kv_pool' is transformers'
# attention-pooling head (`transformers_settings`), which timm lacks.
_POOLS = {'avg': 'gap', '': 'unpooled', 'kv_pool': 'kv_pool'}
_DEFAULTS = dict(_VIT_DEFAULTS, qkv_bias=True, proj_bias=True, norm_layer=None,
                 embed_norm_layer=None)


def is_aimv2(architecture: str) -> bool:
  return bool(re.fullmatch(r'aimv2_\w+', architecture))


def _architecture_args(name: str) -> Dict[str, Any]:
  match = re.fullmatch(r'aimv2_(large|huge|1b|3b)_patch14_\d+', name)
  if match is None:
    raise ValueError(f'timm architecture {name!r} is not one that '
                     'vit_jax.convert knows: AIMv2 is aimv2_{large,huge,1b,'
                     '3b}_patch14_S.')
  return dict(_SIZES[match[1]], **_ARGS)


def aimv2_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's VisionTransformer got, from its config.json (and
  `swiglu_mlp`, as `converter` checks an Eva's MLP)."""
  settings = timm_config.read_settings(config, _DEFAULTS, _architecture_args)
  return dict(settings, swiglu_mlp=True)


def aimv2_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for timm's AIMv2 `settings`, or a ValueError
  naming the first one that vit_jax cannot compute."""
  timm_config.check_settings(settings, _FIXED, _KNOWN | _INERT)
  pool = settings['global_pool']
  if pool not in _POOLS:
    raise timm_config.unsupported('global_pool', pool, "AIMv2's features are "
                                  "the patch mean ('avg') or every patch "
                                  "('')")
  return dict(
      classifier=_POOLS[pool], fc_norm=False, num_registers=0,
      posemb_prefix=True, patch_bias=True, patch_norm=True,
      transformer=dict(
          gelu_approximate=False, quick_gelu=False, swiglu=True,
          layerscale_init=None, pre_norm=False, norm='rms',
          layer_norm_eps=settings['layer_norm_eps'], qkv_bias='none',
          out_bias=False, mlp_bias=False))


def to_vit_state(state: Flat) -> Flat:
  """AIMv2's state dict in timm ViT's names: each SwiGLU's fc1_g and fc1_x
  fused as `fc1` ([gate, x], the order of vit_jax's `Dense_0`)."""
  out = {}
  for key, value in state.items():
    match = re.fullmatch(r'(blocks\.\d+\.mlp\.)fc1_(g|x)\.(weight|bias)', key)
    if match is None:
      out[key] = value
    elif match[2] == 'g':
      out[f'{match[1]}fc1.{match[3]}'] = np.concatenate(
          [value, state[f'{match[1]}fc1_x.{match[3]}']])
  return out


def from_vit_state(state: Flat) -> Flat:
  """`to_vit_state`'s reverse."""
  out = {}
  for key, value in state.items():
    match = re.fullmatch(r'(blocks\.\d+\.mlp\.)fc1\.(weight|bias)', key)
    if match is None:
      out[key] = value
    else:
      gate, x = np.split(value, 2)
      out[f'{match[1]}fc1_g.{match[2]}'] = gate
      out[f'{match[1]}fc1_x.{match[2]}'] = x
  return out


def missing_keys(flat: Flat) -> List[str]:
  """What an AIMv2 encoder's published names lack."""
  need = ['embedding/kernel', 'embedding/bias', 'embedding_norm/scale',
          'Transformer/posembed_input/pos_embedding',
          'Transformer/encoder_norm/scale']
  blocks = sorted({m[1] for k in flat for m in [
      re.match(r'Transformer/encoderblock_(\d+)/', k)] if m})
  leaves = ['LayerNorm_0/scale', 'LayerNorm_2/scale', 'MlpBlock_3/Dense_0/kernel',
            'MlpBlock_3/Dense_1/kernel'] + [
                f'MultiHeadDotProductAttention_1/{part}/kernel'
                for part in ('query', 'key', 'value', 'out')]
  need += [f'Transformer/encoderblock_{b}/{leaf}' for b in blocks
           for leaf in leaves]
  return [name for name in need if name not in flat]


def _refused(key: str, value, why: str) -> ValueError:
  return ValueError(f"transformers' Aimv2VisionModel setting {key}={value!r} "
                    f'is not supported by vit_jax: {why}.')


# Aimv2VisionConfig's settings that vit_jax computes at one value only.
_TRANSFORMERS_FIXED = {
    'qkv_bias': (False, 'its attention has biases'),
    'mlp_bias': (False, 'its MLP has biases'),
    'hidden_act': ('silu', "AIMv2's SwiGLU gates with SiLU"),
    'is_native': (False, "the native-resolution model's position embedding "
                  "is 2-D sin-cos at each image's grid"),
    'num_channels': (3, "vit_jax's pipelines feed RGB images"),
}


def transformers_settings(vision: Dict[str, Any]) -> Dict[str, Any]:
  """The settings (as `aimv2_settings`') of the AIMv2 that computes
  transformers' Aimv2VisionModel of config.json `vision` (a two-tower
  model's `vision_config`): with `use_head`, its attention pooling
  ('kv_pool'), else every patch ('')."""
  for key, (value, why) in _TRANSFORMERS_FIXED.items():
    if vision.get(key, value) != value:
      raise _refused(key, vision[key], why)
  width = vision['hidden_size']
  return dict(
      _ARGS, embed_dim=width, depth=vision['num_hidden_layers'],
      num_heads=vision['num_attention_heads'],
      patch_size=vision['patch_size'],
      mlp_ratio=vision['intermediate_size'] / width,
      layer_norm_eps=vision['rms_norm_eps'], init_values=None,
      global_pool='kv_pool' if vision.get('use_head', True) else '',
      swiglu_mlp=True)


def transformers_config(model: Dict[str, Any]) -> Dict[str, Any]:
  """config.json's AIMv2 settings of vit_jax's model config `model` (the
  sizes are `transformers_config`'s)."""
  transformer = model['transformer']
  return dict(rms_norm_eps=float(transformer['layer_norm_eps']),
              hidden_act='silu', qkv_bias=False, mlp_bias=False,
              is_native=False, use_head=model['classifier'] == 'kv_pool')
