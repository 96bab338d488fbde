r"""Weights in timm's layout <-> the published .npz format.

  python -m vit_jax.convert timm_folder ViT-B_16.npz       # timm -> .npz
  python -m vit_jax.convert model.safetensors ViT-B_16.npz
  python -m vit_jax.convert ViT-B_16.npz model.safetensors  # .npz -> timm

A timm checkpoint is a folder holding `config.json` and `model.safetensors`
(or `pytorch_model.bin`): a Hugging Face hub download, `timm.models.
save_for_hf`'s output, or a weights file with `config.json` beside it.
`config.json` says how timm computes: each setting is either carried over
to vit_jax's model config (pooling, GELU's form) or refused, naming it;
nothing is written then. Without `config.json` timm's defaults are assumed,
as a note on stderr says. The preset is inferred from the shapes and the
heads (`--model_name` to choose it, refused if it does not fit). The eval
transform and the settings that differ from the preset go beside the `.npz`
(`preprocess.save_transform`). ViTs (DeiT's distilled ones too: `dist_token`
and `head_dist` become `dist` and `head_dist`; LayerScale, registers, a
table without the prefix entries, `fc_norm` and SwiGLU: DINOv2, DeiT III,
MAE), hybrids and (without `config.json`) MLP-Mixers are converted; so are Swin
Transformers (`convert_swin`, which lists the names). MAE's
encoder is a plain ViT: its `config.json` tag 'mae' (the hub's
`timm/vit_base_patch16_224.mae`) or `--model_name=MAE-B_16` picks the
preset. `.safetensors` is read with
safetensors' numpy API, a torch `.pth`/`.bin` with
`torch.load(weights_only=True)` (both optional: `pip install -e
'.[convert]'`).
"""

import importlib
import json
import math
import os
import re
import sys
from typing import Any, Dict, NamedTuple, Optional

from absl import flags
from flax import traverse_util
import numpy as np

from vit_jax import checkpoint
from vit_jax import cli
from vit_jax import convert_swin
from vit_jax import models
from vit_jax import preprocess

FLAGS = flags.FLAGS

Flat = Dict[str, np.ndarray]

# (timm key, npz key) regexes of the parameters that map one to one; the
# values are transposed by `_to_npz` / `_to_timm` as their ranks say.
_VIT = [
    (r'cls_token', 'cls'),
    (r'dist_token', 'dist'),
    (r'reg_token', 'reg'),
    (r'blocks\.(\d+)\.ls([12])\.gamma',
     r'Transformer/encoderblock_\1/ls\2/scale'),
    (r'pos_embed', 'Transformer/posembed_input/pos_embedding'),
    (r'patch_embed\.proj\.(weight|bias)', r'embedding/\1'),
    (r'blocks\.(\d+)\.norm1\.(weight|bias)',
     r'Transformer/encoderblock_\1/LayerNorm_0/\2'),
    (r'blocks\.(\d+)\.norm2\.(weight|bias)',
     r'Transformer/encoderblock_\1/LayerNorm_2/\2'),
    (r'blocks\.(\d+)\.mlp\.fc1\.(weight|bias)',
     r'Transformer/encoderblock_\1/MlpBlock_3/Dense_0/\2'),
    (r'blocks\.(\d+)\.mlp\.fc2\.(weight|bias)',
     r'Transformer/encoderblock_\1/MlpBlock_3/Dense_1/\2'),
    (r'norm\.(weight|bias)', r'Transformer/encoder_norm/\1'),
    (r'fc_norm\.(weight|bias)', r'fc_norm/\1'),
    (r'head\.(weight|bias)', r'head/\1'),
    (r'head_dist\.(weight|bias)', r'head_dist/\1'),
]
# The hybrids' ResNet (timm's ResNetV2 in `patch_embed.backbone`).
_BACKBONE = r'patch_embed\.backbone\.'
_UNIT = _BACKBONE + r'stages\.(\d+)\.blocks\.(\d+)\.'
_HYBRID = [
    (_BACKBONE + r'stem\.conv\.weight', 'conv_root/weight'),
    (_BACKBONE + r'stem\.norm\.(weight|bias)', r'gn_root/\1'),
    (_UNIT + r'downsample\.conv\.weight',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/conv_proj/weight'),
    (_UNIT + r'downsample\.norm\.(weight|bias)',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/gn_proj/{m[3]}'),
    (_UNIT + r'conv(\d)\.weight',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/conv{m[3]}/weight'),
    (_UNIT + r'norm(\d)\.(weight|bias)',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/gn{m[3]}/{m[4]}'),
]
_MIXER = [
    (r'stem\.proj\.(weight|bias)', r'stem/\1'),
    (r'blocks\.(\d+)\.norm1\.(weight|bias)', r'MixerBlock_\1/LayerNorm_0/\2'),
    (r'blocks\.(\d+)\.norm2\.(weight|bias)', r'MixerBlock_\1/LayerNorm_1/\2'),
    (r'blocks\.(\d+)\.mlp_tokens\.fc(\d)\.(weight|bias)',
     lambda m: f'MixerBlock_{m[1]}/token_mixing/Dense_{int(m[2]) - 1}/{m[3]}'),
    (r'blocks\.(\d+)\.mlp_channels\.fc(\d)\.(weight|bias)',
     lambda m: f'MixerBlock_{m[1]}/channel_mixing/Dense_{int(m[2]) - 1}/'
     f'{m[3]}'),
    (r'norm\.(weight|bias)', r'pre_head_layer_norm/\1'),
    (r'head\.(weight|bias)', r'head/\1'),
]
_ATTENTION = re.compile(r'blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)')
_BLOCK_NPZ = 'Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/'


def _leaf_to_npz(value: np.ndarray) -> np.ndarray:
  """torch's (out, in[, kh, kw]) weights -> flax's ([kh, kw,] in, out)."""
  if value.ndim == 4:
    return value.transpose(2, 3, 1, 0)
  return value.T if value.ndim == 2 else value


def _leaf_to_timm(value: np.ndarray) -> np.ndarray:
  if value.ndim == 4:
    return value.transpose(3, 2, 0, 1)
  return value.T if value.ndim == 2 else value


def _rules(mixer: bool) -> list:
  return _MIXER if mixer else _VIT + _HYBRID


def _attention_to_npz(state: Flat, heads: int) -> Flat:
  """The fused qkv and proj of each block -> query/key/value/out."""
  out = {}
  for key, value in state.items():
    match = _ATTENTION.fullmatch(key)
    if not match:
      continue
    prefix = _BLOCK_NPZ.format(match[1])
    if match[2] == 'qkv':
      for name, part in zip(('query', 'key', 'value'), np.split(value, 3)):
        if match[3] == 'weight':  # (H K, D) -> (D, H, K)
          out[f'{prefix}{name}/kernel'] = part.T.reshape(
              part.shape[1], heads, -1)
        else:
          out[f'{prefix}{name}/bias'] = part.reshape(heads, -1)
    elif match[3] == 'weight':  # (D, H K) -> (H, K, D)
      out[f'{prefix}out/kernel'] = value.T.reshape(heads, -1, value.shape[0])
    else:
      out[f'{prefix}out/bias'] = value
  return out


def _npz_name(key: str, rules) -> str:
  """The published name of timm's `key`, or None."""
  for pattern, target in rules:
    match = re.fullmatch(pattern, key)
    if match:
      name = match.expand(target) if isinstance(target, str) else target(
          match)
      norm = re.search(r'(LayerNorm_\d|encoder_norm|fc_norm|'
                       r'pre_head_layer_norm|gn\w*)/weight$', name)
      return re.sub(r'/weight$', '/scale' if norm else '/kernel', name)
  return None


def timm_to_npz(state: Flat, heads: int) -> Flat:
  """A timm state dict (numpy) -> '/'-joined published names."""
  rules = _rules(mixer=any(k.startswith('stem.') for k in state))
  out = _attention_to_npz(state, heads)
  unknown = []
  for key, value in state.items():
    if _ATTENTION.fullmatch(key):
      continue
    name = _npz_name(key, rules)
    if name is None:
      unknown.append(key)
    else:
      out[name] = _leaf_to_npz(np.asarray(value))
  if unknown:
    shown = ', '.join(repr(k) for k in unknown[:6])
    more = f' and {len(unknown) - 6} more' if len(unknown) > 6 else ''
    raise ValueError(
        f'timm key{"s" if len(unknown) > 1 else ""} {shown}{more} '
        f'{"have" if len(unknown) > 1 else "has"} no counterpart in vit_jax '
        '(a query/key norm, attention pooling, or another layer that '
        'vit_jax does not have).')
  return out


def _missing(flat: Flat) -> list:
  """What a ViT's published names lack of what every ViT has."""
  if 'stem/kernel' in flat:
    return []
  norm = 'fc_norm' if 'fc_norm/scale' in flat else 'Transformer/encoder_norm'
  need = ['embedding/kernel', 'embedding/bias',
          'Transformer/posembed_input/pos_embedding', f'{norm}/scale',
          f'{norm}/bias']
  blocks = {m[1] for k in flat
            for m in [re.match(r'Transformer/encoderblock_(\d+)/', k)] if m}
  leaves = [f'{layer}/{leaf}' for layer in ('LayerNorm_0', 'LayerNorm_2')
            for leaf in ('scale', 'bias')]
  leaves += [f'MlpBlock_3/Dense_{i}/{leaf}' for i in (0, 1)
             for leaf in ('kernel', 'bias')]
  leaves += [f'MultiHeadDotProductAttention_1/{part}/{leaf}'
             for part in ('query', 'key', 'value', 'out')
             for leaf in ('kernel', 'bias')]
  if any(re.search('/ls[12]/scale$', k) for k in flat):  # all or none
    leaves += ['ls1/scale', 'ls2/scale']
  need += [f'Transformer/encoderblock_{b}/{leaf}' for b in sorted(blocks)
           for leaf in leaves]
  return [name for name in need if name not in flat]


def _timm_keys(flat: Flat) -> list:
  """Every one-to-one timm key that a model with these npz names has."""
  blocks = {int(m[1]) for k in flat
            for m in [re.search(r'(?:encoderblock|MixerBlock)_(\d+)/', k)] if m}
  if any(k.startswith('MixerBlock_') for k in flat):
    top, inner = ['stem.proj', 'norm', 'head'], [
        'norm1', 'norm2', 'mlp_tokens.fc1', 'mlp_tokens.fc2',
        'mlp_channels.fc1', 'mlp_channels.fc2']
  else:
    top = ['patch_embed.proj', 'norm', 'fc_norm', 'head', 'head_dist']
    inner = ['norm1', 'norm2', 'mlp.fc1', 'mlp.fc2']
  modules = top + [f'blocks.{i}.{n}' for i in sorted(blocks) for n in inner]
  keys = ['cls_token', 'dist_token', 'reg_token', 'pos_embed'] + [
      f'{m}.{w}' for m in modules for w in ('weight', 'bias')]
  keys += [f'blocks.{i}.ls{j}.gamma' for i in sorted(blocks) for j in (1, 2)]
  backbone = 'patch_embed.backbone.'
  keys += [backbone + 'stem.conv.weight', backbone + 'stem.norm.weight',
           backbone + 'stem.norm.bias']
  for key in flat:  # the ResNet's units, as the .npz has them
    match = re.match(r'block(\d+)/unit(\d+)/(conv|gn)(\w+)/', key)
    if match:
      unit = f'{backbone}stages.{int(match[1]) - 1}.blocks.{int(match[2]) - 1}.'
      layer = ('downsample.' + ('conv' if match[3] == 'conv' else 'norm')
               if match[4] == '_proj' else f'{match[3].replace("gn", "norm")}'
               f'{match[4]}')
      keys += [f'{unit}{layer}.weight'] + (
          [f'{unit}{layer}.bias'] if match[3] == 'gn' else [])
  return keys


def npz_to_timm(flat: Flat) -> Flat:
  """'/'-joined published names -> a timm state dict (numpy)."""
  rules = _rules(mixer=any(k.startswith('MixerBlock_') for k in flat))
  names = {_npz_name(key, rules): key for key in _timm_keys(flat)}
  out, attention = {}, {}
  for key, value in flat.items():
    match = re.fullmatch(r'Transformer/encoderblock_(\d+)/'
                         r'MultiHeadDotProductAttention_1/(\w+)/(\w+)', key)
    if match:
      attention[match[1], match[2], match[3]] = value
    elif key in names:
      out[names[key]] = _leaf_to_timm(value)
    else:
      raise ValueError(f'{key!r} has no counterpart in timm (a pre_logits '
                       'or MAP head, or another position scheme).')
  for (block, name, kind), value in attention.items():
    if name != 'out':
      continue
    prefix = f'blocks.{block}.attn.'
    qkv = [attention[block, n, kind] for n in ('query', 'key', 'value')]
    if kind == 'kernel':  # (D, H, K) x 3 -> (3 H K, D); (H, K, D) -> (D, H K)
      out[prefix + 'qkv.weight'] = np.concatenate(
          [q.reshape(q.shape[0], -1).T for q in qkv])
      out[prefix + 'proj.weight'] = value.reshape(-1, value.shape[-1]).T
    else:
      out[prefix + 'qkv.bias'] = np.concatenate([q.reshape(-1) for q in qkv])
      out[prefix + 'proj.bias'] = value
  return out


# What timm's ViT entrypoints pass for each size; the hub's config.json
# records only the arguments given to `create_model`, not these.
_SIZES = {
    'tiny': dict(embed_dim=192, depth=12, num_heads=3),
    'small': dict(embed_dim=384, depth=12, num_heads=6),
    'medium': dict(embed_dim=512, depth=12, num_heads=8),
    'base': dict(embed_dim=768, depth=12, num_heads=12),
    'large': dict(embed_dim=1024, depth=24, num_heads=16),
    'huge': dict(embed_dim=1280, depth=32, num_heads=16),
    'giant': dict(embed_dim=1536, depth=40, num_heads=24),  # DINOv2's
}
# timm VisionTransformer's defaults for what is read below.
_VIT_DEFAULTS = dict(global_pool='token', class_token=True, fc_norm=None,
                     act_layer=None, patch_size=16, mlp_ratio=4.,
                     distilled=False, init_values=None, no_embed_class=False,
                     reg_tokens=0, mlp_layer=None)
# Arguments that vit_jax computes only at timm's default, and why not else.
_FIXED = {
    'qkv_bias': (True, 'its attention has no query/key/value biases'),
    'proj_bias': (True, "its attention's output projection has no bias"),
    'qk_norm': (False, 'it normalizes queries and keys (attn.q_norm, '
                'attn.k_norm)'),
    'scale_attn_norm': (False, 'it normalizes inside the attention'),
    'scale_mlp_norm': (False, 'it normalizes inside the MLP'),
    'pre_norm': (False, 'a LayerNorm (norm_pre) comes before the blocks'),
    'final_norm': (True, 'no LayerNorm comes after the blocks'),
    'pos_embed': ('learn', 'vit_jax converts only a learned position table'),
    'pool_include_prefix': (False, 'the pooling includes the prefix tokens'),
    'dynamic_img_size': (False, 'it resizes the position embedding for each '
                         "input; vit_jax's is resized once, when loaded"),
    'dynamic_img_pad': (False, 'it pads images to whole patches'),
    'in_chans': (3, "vit_jax's pipelines feed RGB images"),
    'norm_layer': (None, "vit_jax's norms are LayerNorms with eps 1e-6"),
    'embed_norm_layer': (None, 'the patch embedding is normalized'),
    'embed_layer': (None, 'another patch embedding'),
    'block_fn': (None, 'another block'),
    'attn_layer': (None, 'another attention'),
}
# Carried over to vit_jax (or checked against the weights and the preset).
_MAPPED = {'global_pool', 'class_token', 'fc_norm', 'act_layer', 'embed_dim',
           'depth', 'num_heads', 'mlp_ratio', 'patch_size', 'distilled',
           'init_values', 'no_embed_class', 'reg_tokens', 'mlp_layer'}
# Training, initialization, or what the weights' shapes say anyway.
_INERT = {'img_size', 'num_classes', 'drop_rate', 'pos_drop_rate',
          'patch_drop_rate', 'proj_drop_rate', 'attn_drop_rate',
          'drop_path_rate', 'weight_init', 'fix_init'}


def _unsupported(key: str, value, why: str) -> ValueError:
  return ValueError(f'timm setting {key}={value!r} is not supported by '
                    f'vit_jax: {why}.')


def _architecture_args(name: str) -> Dict[str, Any]:
  """What timm's entrypoint `name` passes to its VisionTransformer."""
  plain = re.fullmatch(r'(?:vit|deit)_(tiny|small|base|large|huge)_patch(\d+)'
                       r'_\d+', name)
  if plain:
    return dict(_SIZES[plain[1]], patch_size=int(plain[2]))
  distilled = re.fullmatch(r'deit_(tiny|small|base)_distilled_patch(\d+)_\d+',
                           name)
  if distilled:  # timm's VisionTransformerDistilled
    return dict(_SIZES[distilled[1]], patch_size=int(distilled[2]),
                distilled=True)
  gap = re.fullmatch(r'vit_(base|huge)_patch(\d+)_gap_\d+', name)
  if gap:  # 16 heads, also at the base width
    return dict(_SIZES[gap[1]], patch_size=int(gap[2]), num_heads=16,
                class_token=False, global_pool='avg', fc_norm=False)
  hybrid = re.fullmatch(r'vit_(tiny|small|base|large)_r\d*_s\d+(?:_p(\d+))?'
                        r'_\d+', name)
  if hybrid:  # patches of the ResNet's feature map
    return dict(_SIZES[hybrid[1]], patch_size=int(hybrid[2] or 1))
  deit3 = re.fullmatch(r'deit3_(small|medium|base|large|huge)_patch(\d+)_'
                       r'\d+(?:_\w+)?', name)
  if deit3:
    return dict(_SIZES[deit3[1]], patch_size=int(deit3[2]),
                no_embed_class=True, init_values=1e-6)
  dinov2 = re.fullmatch(r'vit_(small|base|large|giant)_patch14_(reg4_)?'
                        r'dinov2', name)
  if dinov2:
    args = dict(_SIZES[dinov2[1]], patch_size=14, init_values=1e-5)
    if dinov2[2]:
      args.update(reg_tokens=4, no_embed_class=True)
    if dinov2[1] == 'giant':  # timm's fc1 of 8192 = 2 x 4096 features
      args.update(mlp_ratio=2.66667 * 2, mlp_layer='swiglu_packed',
                  act_layer='silu')
    return args
  if re.fullmatch(r'mixer_[sbl](16|32)_224', name):
    raise _unsupported('act_layer', 'GELU', "timm's MlpMixer computes the "
                       "exact GELU, vit_jax's its tanh form")
  raise ValueError(
      f"timm architecture {name!r} is not one that vit_jax.convert knows: its "
      'entrypoint sets arguments that config.json does not record. Known: '
      'vit_{tiny,small,base,large,huge}_patchP_S, deit_*_patchP_S, '
      'deit_*_distilled_patchP_S, deit3_*_patchP_S, vit_*_patch14_[reg4_]'
      'dinov2, vit_{base,huge}_patchP_gap_S and the R+ViT hybrids '
      'vit_*_r*_s*.')


def timm_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's VisionTransformer got, from its config.json."""
  if 'architecture' not in config:
    raise ValueError("config.json names no 'architecture': it is not timm's.")
  settings = dict(_VIT_DEFAULTS, **_architecture_args(config['architecture']))
  model_args = config.get('model_args') or {}
  if 'global_pool' in config:
    settings['global_pool'] = config['global_pool']
  settings.update(model_args)  # create_model's arguments win, as in timm
  return settings


def _uses_fc_norm(settings) -> bool:
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
  if pool == 'avg' and cls:
    raise _unsupported('global_pool', pool, 'with class_token=True timm '
                       "averages the patch tokens, leaving out the class "
                       "token; vit_jax's 'gap' has no class token")
  if pool == 'avg':
    return 'gap'
  if pool == 'token':
    raise _unsupported('class_token', cls, "global_pool='token' needs it")
  if pool == 'map':
    raise _unsupported('global_pool', pool, "timm's attention pooling "
                       '(attn_pool) is not converted')
  raise _unsupported('global_pool', pool, "vit_jax converts 'token' and "
                     "'avg' pooling only")


def _distilled_classifier(settings) -> str:
  """'distilled', where timm's VisionTransformerDistilled computes it."""
  if settings['global_pool'] != 'token' or not settings['class_token']:
    raise _unsupported('global_pool', settings['global_pool'], 'the '
                       'distilled heads read the class and distillation '
                       'tokens')
  if _uses_fc_norm(settings):
    raise _unsupported('fc_norm', settings['fc_norm'], "timm's distilled "
                       'heads skip it (and its final norm)')
  return 'distilled'


def _gelu_approximate(act) -> bool:
  if act in (None, 'gelu'):  # nn.GELU: the exact erf form
    return False
  if act == 'gelu_tanh':
    return True
  raise _unsupported('act_layer', act, "vit_jax's MLP computes GELU (exact "
                     "or tanh), or SwiGLU, only")


def _mlp(settings) -> Dict[str, Any]:
  """vit_jax's MLP settings for timm's mlp_layer and act_layer."""
  if settings['mlp_layer'] is None:
    return {'gelu_approximate': _gelu_approximate(settings['act_layer']),
            'swiglu': False}
  if settings['mlp_layer'] == 'swiglu_packed' and settings['act_layer'] in (
      'silu', 'swish'):  # timm's SwiGLUPacked: silu(x1) * x2, x1 first
    return {'gelu_approximate': False, 'swiglu': True}
  raise _unsupported('mlp_layer', settings['mlp_layer'], "vit_jax's MLP is "
                     "timm's Mlp (GELU) or SwiGLUPacked (SiLU)")


def vit_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for timm's VisionTransformer `settings`, or a
  ValueError naming the first one that vit_jax cannot compute."""
  for key, value in settings.items():
    if key in _FIXED and value != _FIXED[key][0]:
      raise _unsupported(key, value, _FIXED[key][1])
    if key not in _FIXED and key not in _MAPPED | _INERT:
      raise _unsupported(key, value, 'vit_jax.convert does not know what it '
                         'changes')
  classifier = _classifier(settings)
  return {'classifier': classifier,
          'fc_norm': classifier == 'gap' and _uses_fc_norm(settings),
          'num_registers': settings['reg_tokens'],
          'posemb_prefix': not settings['no_embed_class'],
          'transformer': dict(_mlp(settings),
                              layerscale_init=settings['init_values'])}


def _fc_norm_as_final(state: Flat, token_pooling: bool) -> Flat:
  """Token pooling with fc_norm: its weights are the final norm's."""
  if not token_pooling:
    return state
  return {re.sub(r'^fc_norm\.', 'norm.', k): v for k, v in state.items()}


def _resnet_layers(flat: Flat):
  """Units per stage of a hybrid's ResNet, None for a plain ViT."""
  if 'conv_root/kernel' not in flat:
    return None
  units = {}
  for key in flat:
    match = re.match(r'block(\d+)/unit(\d+)/', key)
    if match:
      units[int(match[1])] = max(units.get(int(match[1]), 0), int(match[2]))
  return tuple(units[i] for i in sorted(units))


def _dims(flat: Flat) -> Dict[str, Any]:
  """The shapes that these published names say, by name."""
  blocks = {m[1] for k in flat
            for m in [re.search(r'(?:encoderblock|MixerBlock)_(\d+)/', k)] if m}
  if 'stem/kernel' in flat:
    kernel = flat['stem/kernel']
    return dict(
        width=kernel.shape[-1], depth=len(blocks), patch=kernel.shape[:2],
        tokens_mlp_dim=flat['MixerBlock_0/token_mixing/Dense_0/kernel'].shape[
            -1],
        channels_mlp_dim=flat['MixerBlock_0/channel_mixing/Dense_0/kernel']
        .shape[-1])
  kernel = flat['embedding/kernel']
  mlp = 'Transformer/encoderblock_0/MlpBlock_3/Dense_{}/kernel'
  mlp_dim = flat[mlp.format(1)].shape[0]
  return dict(
      width=kernel.shape[-1], depth=len(blocks), patch=kernel.shape[:2],
      mlp_dim=mlp_dim, resnet=_resnet_layers(flat), dist_token='dist' in flat,
      # Model options: a preset without them takes them as overrides.
      swiglu=flat[mlp.format(0)].shape[-1] == 2 * mlp_dim,
      layerscale='Transformer/encoderblock_0/ls1/scale' in flat,
      registers=flat['reg'].shape[1] if 'reg' in flat else 0,
      posemb_prefix=_posemb_prefix(flat))


_OPTIONS = ('swiglu', 'layerscale', 'registers', 'posemb_prefix')


def _posemb_prefix(flat: Flat) -> Optional[bool]:
  """Whether the position table has the prefix tokens' entries (None: a
  table whose length says neither, or both)."""
  table = flat.get('Transformer/posembed_input/pos_embedding')
  prefix = sum(k in flat for k in ('cls', 'dist')) + (
      flat['reg'].shape[1] if 'reg' in flat else 0)
  if table is None:  # another position scheme
    return True
  tokens = table.shape[1]
  square = lambda n: n > 0 and math.isqrt(n)**2 == n
  if not prefix or square(tokens - prefix) != square(tokens):
    return not prefix or square(tokens - prefix)
  return None


def _convertible_presets() -> list:
  """The presets that timm's ViTs and Mixers can be (no LiT, no BiT)."""
  return [name for name in models.MODEL_CONFIGS
          if models.model_class(name) in (models.VisionTransformer,
                                          models.MlpMixer)]


def _preset_dims(name: str) -> Dict[str, Any]:
  config = models.MODEL_CONFIGS[name]
  if models.model_class(name) is models.MlpMixer:
    return dict(width=config.hidden_dim, depth=config.num_blocks,
                patch=tuple(config.patches.size),
                tokens_mlp_dim=config.tokens_mlp_dim,
                channels_mlp_dim=config.channels_mlp_dim)
  resnet, transformer = config.get('resnet'), config.transformer
  return dict(width=config.hidden_size, depth=transformer.num_layers,
              patch=tuple(config.patches.size),
              mlp_dim=transformer.mlp_dim,
              resnet=tuple(resnet.num_layers) if resnet else None,
              heads=transformer.num_heads,
              dist_token=config.classifier == 'distilled',
              swiglu=bool(transformer.get('swiglu')),
              layerscale=transformer.get('layerscale_init') is not None,
              registers=config.get('num_registers') or 0,
              posemb_prefix=config.get('posemb_prefix', True))


def _misfits(name: str, want: Dict[str, Any]) -> list:
  """'what (preset: value)' for each of `want` that preset `name` lacks."""
  have = _preset_dims(name)
  return [f'{key} {value} ({name}: {have.get(key)})'
          for key, value in want.items() if have.get(key) != value]


def infer_preset(flat: Flat, heads: Optional[int] = None,
                 classifier: Optional[str] = None,
                 family: str = '') -> str:
  """The preset (its name starting with `family`) whose shapes (and
  `heads`) these published names have, and the fewest model options
  (`_OPTIONS`) to override; of several, the one with `classifier`
  (default: a class token's or 'gap')."""
  want = _dims(flat)
  if heads is not None:
    want['heads'] = heads
  if 'stem/kernel' not in flat:
    classifier = classifier or _token_classifier(flat)
  misfits = {name: _misfits(name, want) for name in _convertible_presets()
             if name.startswith(family)}
  found = [name for name, wrong in misfits.items()
           if all(w.split()[0] in _OPTIONS for w in wrong)]
  if not found:
    raise ValueError(f'No {family or ""}preset has these shapes ({want}).')
  same = [name for name in found
          if models.MODEL_CONFIGS[name].get('classifier') == classifier]
  return min(same or found, key=lambda name: len(misfits[name]))


def _token_classifier(flat: Flat) -> str:
  """timm's default pooling of a ViT with these names, as vit_jax's."""
  if 'dist' in flat:
    return 'distilled'
  return 'token' if 'cls' in flat else 'gap'


def check_preset(flat: Flat, name: str, heads: Optional[int] = None) -> None:
  """Raises a ValueError unless preset `name` has these shapes (and heads)."""
  if name not in _convertible_presets():
    raise ValueError(cli.closest(name, _convertible_presets(), 'model'))
  want = _dims(flat)
  if heads is not None:
    want['heads'] = heads
  misfits = [m for m in _misfits(name, want) if m.split()[0] not in _OPTIONS]
  if misfits:
    raise ValueError(f'--model_name={name} does not fit the checkpoint, '
                     f'which has {", ".join(misfits)}.')


def _check_config_dims(settings, flat: Flat, path: str) -> None:
  """config.json and the weights must describe the same model."""
  have = _dims(flat)
  patch = settings['patch_size']
  patch = tuple(patch) if isinstance(patch, (list, tuple)) else (patch,) * 2
  swiglu = _mlp(settings)['swiglu']
  hidden = int(settings['embed_dim'] * settings['mlp_ratio'])
  said = dict(width=settings['embed_dim'], depth=settings['depth'],
              patch=patch, mlp_dim=hidden // 2 if swiglu else hidden,
              swiglu=swiglu, layerscale=settings['init_values'] is not None,
              registers=settings['reg_tokens'])
  if have['posemb_prefix'] is not None:  # else config.json's says
    said['posemb_prefix'] = not settings['no_embed_class']
  wrong = [f'{key} {value} (weights: {have[key]})'
           for key, value in said.items() if have[key] != value]
  if wrong:
    raise ValueError(f"{path}'s config.json does not describe its weights: "
                     f'it says {", ".join(wrong)}.')


def _import(module: str, path: str):
  """`module`, or a ModuleNotFoundError saying how to install it."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"Reading {path} needs {module.split('.')[0]}: pip install -e "
        "'.[convert]'") from e


def read_timm(path: str) -> Flat:
  """A timm checkpoint file as numpy arrays; never unpickles objects."""
  if path.endswith('.safetensors'):
    load_file = _import('safetensors.numpy', path).load_file
    try:
      return load_file(path)
    except _import('safetensors', path).SafetensorError as e:
      raise ValueError(f'Cannot read {path}: not a safetensors file, or '
                       f'truncated or corrupt ({e}).') from e
  if not path.endswith(('.pth', '.bin', '.pt')):
    raise ValueError(f'{path}: expected a .safetensors, .pth or .bin file.')
  import pickle  # pylint: disable=g-import-not-at-top
  torch = _import('torch', path)
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except pickle.UnpicklingError as e:
    raise ValueError(
        f'{path} holds pickled Python objects besides tensors, or is not a '
        'torch file; objects are never loaded here: save its state_dict() '
        f'as .safetensors. torch: {str(e).splitlines()[0]}') from e
  except (RuntimeError, EOFError) as e:  # not a zip or pickle, truncated
    raise ValueError(f'Cannot read {path} with torch: {e}') from e
  state = state.get('state_dict', state)
  return {k: v.float().numpy() for k, v in state.items()}


# A timm folder's weights, as the hub and `save_for_hf` name them.
_WEIGHTS = ('model.safetensors', 'pytorch_model.bin')


def locate(src: str):
  """(weights file, its config.json or None) of a file or a timm folder."""
  if os.path.isdir(src):
    found = [os.path.join(src, n) for n in _WEIGHTS
             if os.path.exists(os.path.join(src, n))]
    if not found:
      raise FileNotFoundError(f'{src} holds none of {", ".join(_WEIGHTS)}.')
    src = found[0]
  elif not os.path.exists(src):
    raise FileNotFoundError(f'{src}: no such file or folder.')
  config = os.path.join(os.path.dirname(src), 'config.json')
  return src, config if os.path.exists(config) else None


class Source(NamedTuple):
  """A timm checkpoint as vit_jax sees it."""
  flat: Flat  # by published names
  model_name: str  # the preset
  overrides: Dict[str, Any]  # what differs from the preset, e.g. classifier
  transform: Dict[str, Any]  # timm's pretrained_cfg (eval transform)


def from_timm(src: str, model_name: Optional[str] = None) -> Source:
  """Reads timm's weights, and the config.json beside them, for vit_jax."""
  weights, config_path = locate(src)
  state = read_timm(weights)
  config = {}
  if config_path is not None:
    with open(config_path) as f:
      config = json.load(f)
  if convert_swin.is_swin(state):
    return _from_swin(state, config, model_name)
  if config_path is None:
    return _from_bare(weights, state, model_name)
  settings = timm_settings(config)
  overrides = vit_overrides(settings)
  state = _fc_norm_as_final(state, overrides['classifier'] in (
      'token', 'distilled') and _uses_fc_norm(settings))
  flat = timm_to_npz(state, settings['num_heads'])
  _check_complete(flat, weights)
  _check_config_dims(settings, flat, weights)
  # MAE's encoder has a plain ViT's keys: timm's pretrained tag tells.
  tag = (config.get('pretrained_cfg') or {}).get('tag') or ''
  model_name = model_name or infer_preset(
      flat, settings['num_heads'], overrides['classifier'],
      family='MAE-' if tag.startswith('mae') else '')
  check_preset(flat, model_name, settings['num_heads'])
  return Source(flat, model_name, _differences(model_name, overrides),
                dict(config.get('pretrained_cfg') or {}))


def _from_swin(state: Flat, config: Dict[str, Any],
               model_name: Optional[str]) -> Source:
  """A timm Swin, its bias tables resized to the preset's window."""
  flat = convert_swin.timm_to_npz(state)
  model_name = convert_swin.preset(flat, model_name)
  window = models.MODEL_CONFIGS[model_name].window_size
  return Source(convert_swin.fit_window(flat, window), model_name, {},
                dict(config.get('pretrained_cfg') or {}))


def _from_bare(weights: str, state: Flat, model_name: Optional[str]
               ) -> Source:
  """A state dict alone: timm's defaults, the heads of the preset."""
  # timm's default pooling for a class token is 'token', where fc_norm (set
  # explicitly) acts as the final norm; without one, 'avg' (fc_norm then).
  state = _fc_norm_as_final(state, 'cls_token' in state)
  flat = timm_to_npz(state, heads=1)
  if 'stem/kernel' not in flat:
    _check_posembed(flat, weights)
  model_name = model_name or infer_preset(flat)
  check_preset(flat, model_name)
  if 'stem/kernel' in flat:
    print(f'Note: no config.json beside {weights}: assuming an MLP-Mixer with '
          "GELU's tanh form, which vit_jax computes (timm's default is the "
          "exact form), and timm's default eval transform.", file=sys.stderr)
    return Source(flat, model_name, {}, {})
  heads = models.MODEL_CONFIGS[model_name].transformer.num_heads
  flat = timm_to_npz(state, heads)
  _check_complete(flat, weights)
  print(f"Note: no config.json beside {weights}: assuming timm's defaults "
        "(global_pool='token' with a class token, 'avg' without fc_norm "
        "without one; exact GELU; the eval transform of timm's "
        "resolve_data_config: center crop 0.875, bicubic, ImageNet's mean "
        f'and std) and the {heads} heads of {model_name}; put '
        "timm's config.json beside it, or pass --model_name.",
        file=sys.stderr)
  dims = _dims(flat)
  overrides = {'classifier': _token_classifier(flat),
               'fc_norm': 'fc_norm/scale' in flat,
               'num_registers': dims['registers'],
               'posemb_prefix': dims['posemb_prefix'],
               'transformer': {'gelu_approximate': False,
                               'swiglu': dims['swiglu'],
                               # Only an init: the weights hold the scales.
                               'layerscale_init': 1e-5 if dims['layerscale']
                                                  else None}}
  return Source(flat, model_name, _differences(model_name, overrides), {})


def _check_complete(flat: Flat, path: str) -> None:
  missing = _missing(flat)
  if missing:
    raise ValueError(f'{path} lacks what a vit_jax ViT has: '
                     f'{", ".join(missing[:6])} (timm: qkv_bias=False or '
                     'pre_norm=True?).')


def _check_posembed(flat: Flat, path: str) -> None:
  """Whether the table has the prefix tokens' entries must show."""
  if _posemb_prefix(flat) is None:
    tokens = flat['Transformer/posembed_input/pos_embedding'].shape[1]
    raise ValueError(f'{path}: its {tokens} position embeddings do not say '
                     'whether they have entries for the class (and register) '
                     "tokens (timm's no_embed_class): put timm's config.json "
                     'beside it.')


def _differences(name: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
  """The part of `overrides` that preset `name` does not already set."""
  preset = models.MODEL_CONFIGS[name].to_dict()
  preset['transformer'].setdefault('gelu_approximate', True)  # the Encoder's
  ls_init = preset['transformer'].get('layerscale_init')
  if (ls_init is None) == (
      overrides.get('transformer', {}).get('layerscale_init') is None):
    overrides = dict(overrides, transformer={  # an init, not in the weights
        k: v for k, v in overrides['transformer'].items()
        if k != 'layerscale_init'})
  out = {}
  for key, value in overrides.items():
    if isinstance(value, dict):
      inner = {k: v for k, v in value.items() if preset[key].get(k) != v}
      if inner:
        out[key] = inner
    elif preset.get(key) != value:
      out[key] = value
  return out


def _flags(overrides: Dict[str, Any], prefix: str = '') -> list:
  """'transformer.gelu_approximate=False', ... of nested `overrides`."""
  out = []
  for key, value in overrides.items():
    if isinstance(value, dict):
      out += _flags(value, f'{prefix}{key}.')
    else:
      out.append(f'{prefix}{key}={value!r}')
  return out


def fetch(name: str, timeout: float = 5.) -> str:
  """Downloads the hub checkpoint `name` (e.g. timm/vit_base_patch16_224.
  augreg_in21k) into huggingface_hub's cache; returns its folder. Fails in
  seconds offline."""
  import socket  # pylint: disable=g-import-not-at-top
  try:
    if os.environ.get('HF_HUB_OFFLINE', '0') not in ('', '0'):
      raise OSError('HF_HUB_OFFLINE is set')  # the hub's own switch
    socket.create_connection(('huggingface.co', 443), timeout=timeout).close()
  except OSError as e:
    raise ConnectionError(
        f'Cannot reach huggingface.co to fetch {name} ({e}). Download its '
        'model.safetensors and config.json where there is network, then '
        'convert their folder.') from e
  hub = _import('huggingface_hub', name)
  hub.hf_hub_download(name, 'config.json')
  return os.path.dirname(hub.hf_hub_download(name, 'model.safetensors'))


def _record(dst: str, source: Source) -> None:
  """The eval transform and the model's settings, beside `dst` (replacing
  any record of the file that `dst` replaces). What the source does not say
  is timm's default (`resolve_data_config`'s): center crop 0.875, bicubic,
  ImageNet's mean and std."""
  sidecar = dict(preprocess.TIMM_DEFAULTS, **source.transform)
  if source.overrides:
    sidecar['model'] = source.overrides
  path = preprocess.transform_path(dst)
  preprocess.save_transform(dst, sidecar)
  if source.overrides:
    print(f'Note: {dst} is {source.model_name} with '
          f'{", ".join(_flags(source.overrides))}, as timm computes it; '
          f'{path.name} records them for predict '
          '(preprocess.model_config).', file=sys.stderr)


def _check_destination(src: str, dst: str) -> None:
  """`dst` has the extension that `src`'s direction writes, in a folder that
  exists; checked before anything is read."""
  wanted = '.safetensors' if src.endswith('.npz') else '.npz'
  if not dst.endswith(wanted):
    raise ValueError(f'{dst}: converting {src} writes a {wanted} file; '
                     f'name the destination *{wanted}.')
  folder = os.path.dirname(os.path.abspath(dst))
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'{dst}: the folder {folder} does not exist.')


def convert(src: str, dst: str, model_name: str = None) -> str:
  """Converts `src` to `dst`, by their extensions; returns the preset."""
  _check_destination(src, dst)
  if src.endswith('.npz'):
    flat = checkpoint.published_flat(checkpoint.load(src))
    swin = convert_swin.is_swin(flat)
    model_name = model_name or (convert_swin.preset(flat) if swin else
                                infer_preset(flat))
    state = convert_swin.npz_to_timm(flat) if swin else npz_to_timm(flat)
    save_file = _import('safetensors.numpy', dst).save_file
    save_file({k: np.ascontiguousarray(v, np.float32)
               for k, v in state.items()}, dst)
    return model_name
  if not os.path.exists(src) and re.fullmatch(r'[\w.-]+/[\w.-]+', src):
    src = fetch(src)
  source = from_timm(src, model_name)
  checkpoint.save(traverse_util.unflatten_dict(source.flat, sep='/'), dst)
  _record(dst, source)
  return source.model_name


def main(argv):
  if len(argv) != 3:
    raise ValueError('Usage: python -m vit_jax.convert SRC DST (SRC: a timm '
                     'folder, weights file or hub name, or a .npz).')
  name = convert(argv[1], argv[2], FLAGS.model_name)
  print(f'{argv[1]} -> {argv[2]} ({name})')


if __name__ == '__main__':
  # Defined here, not on import, so that other modules may define theirs.
  flags.DEFINE_string('model_name', None,
                      'Preset (default: inferred from the shapes).')
  cli.run(main)
