"""timm's Eva (`eva.py`: EVA-02, DINOv3, Perception Encoder) <-> vit_jax's
ViT.

Its config.json is read as the ViT's is: every setting that changes the
computation is mapped or refused by name. Its state dict is put in the ViT's
timm names first, so that `convert.names` maps it (timm -> ViT names):

  blocks.{i}.gamma_1, gamma_2             blocks.{i}.ls1.gamma, ls2.gamma
  blocks.{i}.attn.q_bias, v_bias (fused)  blocks.{i}.attn.qkv.bias (key: 0)
  (PE's attn_type='rope': qkv.bias as it is, the key's too)
  blocks.{i}.attn.{q,k,v}_proj (apart)    blocks.{i}.attn.qkv
  blocks.{i}.mlp.fc1_g, fc1_x (SwiGLU)    blocks.{i}.mlp.fc1 ([gate, x])

Biases that Eva lacks are dropped again after the mapping (`qkv_bias`).
"""

import re
from typing import Any, Dict

import numpy as np

from vit_jax.convert.timm_config import check_settings
from vit_jax.convert.timm_config import read_settings
from vit_jax.convert.timm_config import SIZES  # Eva's sizes are the ViT's
from vit_jax.convert.timm_config import unsupported
from vit_jax.models.posemb import ROPE_INDEXINGS

Flat = Dict[str, np.ndarray]

# timm Eva's defaults for what is read below.
_DEFAULTS = dict(
    global_pool='avg', patch_size=16, embed_dim=768, depth=12, num_heads=12,
    qkv_bias=True, mlp_ratio=4., swiglu_mlp=False, scale_mlp=False,
    init_values=None, class_token=True, num_reg_tokens=0,
    no_embed_class=False, use_abs_pos_emb=True, use_rot_pos_emb=False,
    rope_type='cat', rope_temperature=10000., rope_rotate_half=False,
    ref_feat_shape=None, use_pre_transformer_norm=False,
    use_post_transformer_norm=None, use_fc_norm=None, dynamic_img_size=False,
    layer_norm_eps=1e-6, attn_type='eva', rope_grid_offset=0.,
    rope_grid_indexing='ij', attn_pool_num_heads=None,
    attn_pool_mlp_ratio=None)
# Settings vit_jax computes only at timm's default, and why not else.
_FIXED = {
    'num_kv_heads': (None, 'grouped-query attention'),
    'qk_norm': (False, 'it normalizes queries and keys'),
    'scale_attn_inner': (False, 'it normalizes inside the attention'),
    'swiglu_align_to': (0, 'its SwiGLU pads the hidden width'),
    'attn_only_layer_scale': (False, 'LayerScale on attention only'),
    'use_post_norm': (False, 'post-norm blocks'),
    'rope_mrope_section': (None, 'multimodal RoPE'),
    'dynamic_img_pad': (False, 'it pads images to whole patches'),
    'in_chans': (3, "vit_jax's pipelines feed RGB images"),
    'norm_layer': (None, 'another norm'),
}
# Training, initialization, or what the weights' shapes say anyway; RoPE's
# coordinate augmentations act in training only.
_INERT = {'img_size', 'num_classes', 'drop_rate', 'pos_drop_rate',
          'patch_drop_rate', 'proj_drop_rate', 'attn_drop_rate',
          'drop_path_rate', 'head_init_scale', 'rope_shift_coords',
          'rope_jitter_coords', 'rope_rescale_coords',
          'qkv_fused'}  # fused or apart: the same products


def is_eva(architecture: str) -> bool:
  return bool(re.fullmatch(r'eva02_\w+|vit_\w+_dinov3\w*|vit_pe_\w+',
                           architecture))


def _architecture_args(name: str) -> Dict[str, Any]:
  """What timm's Eva entrypoint `name` passes."""
  eva02 = re.fullmatch(r'eva02_(tiny|small|base|large)_patch14_\d+', name)
  if eva02:
    args = dict(SIZES[eva02[1]], patch_size=14, mlp_ratio=4 * 2 / 3,
                swiglu_mlp=True, use_rot_pos_emb=True, ref_feat_shape=(16, 16))
    if eva02[1] in ('base', 'large'):
      args.update(qkv_fused=False, scale_mlp=True)
    return args
  dinov3 = re.fullmatch(r'vit_(small|base|large)_patch16_dinov3(_qkvb)?',
                        name)
  if dinov3:  # its LayerNorm(eps=1e-5) is a partial that config.json lacks
    return dict(SIZES[dinov3[1]], patch_size=16, dynamic_img_size=True,
                qkv_bias=bool(dinov3[2]), init_values=1e-5, rope_type='dinov3',
                rope_temperature=100, rope_rotate_half=True,
                use_rot_pos_emb=True, use_abs_pos_emb=False, num_reg_tokens=4,
                use_fc_norm=False, layer_norm_eps=1e-5)
  pe = re.fullmatch(r'vit_pe_(core|spatial|lang)_(tiny|small|base|large|'
                    r'gigantic)_patch(\d+)_\d+', name)
  if pe:
    return _pe_args(pe[1], pe[2], int(pe[3]))
  raise ValueError(
      f"timm architecture {name!r} is not one that vit_jax.convert knows. "
      'Known Eva models: eva02_{tiny,small,base,large}_patch14_S, '
      'vit_{small,base,large}_patch16_dinov3[_qkvb] and '
      'vit_pe_{core,spatial,lang}_SIZE_patchP_S.')


# Perception Encoder's sizes, and its Core's RoPE grids, as its entrypoints.
_PE_SIZES = dict(SIZES, gigantic=dict(embed_dim=1536, depth=50, num_heads=16,
                                      mlp_ratio=8960 / 1536))
_PE_CORE_GRIDS = {'tiny': 24, 'small': 24, 'base': 14, 'large': 24}


def _pe_args(kind: str, size: str, patch: int) -> Dict[str, Any]:
  """What timm's vit_pe_{kind}_{size}_* entrypoint passes: its
  LayerNorm(eps=1e-5) a partial that config.json lacks."""
  gigantic = size == 'gigantic'
  args = dict(_PE_SIZES[size], patch_size=patch, attn_type='rope',
              use_pre_transformer_norm=True, use_rot_pos_emb=True,
              ref_feat_shape=(32, 32), rope_grid_offset=0. if gigantic else 1.,
              rope_grid_indexing='xy', class_token=not gigantic,
              layer_norm_eps=1e-5)
  if kind == 'core':
    args.update(global_pool='map', attn_pool_num_heads=8,
                attn_pool_mlp_ratio=4.)
    args['ref_feat_shape'] = (_PE_CORE_GRIDS.get(size, 32),) * 2
  else:
    args.update(use_post_transformer_norm=False, use_fc_norm=False)
  if kind == 'lang':
    args.update(depth=47 if gigantic else 23, init_values=0.1)
  if (kind, size) == ('spatial', 'gigantic'):
    args['init_values'] = 0.1
  return args


def eva_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's Eva got, from its config.json."""
  return read_settings(config, _DEFAULTS, _architecture_args)


def _check_known(settings) -> None:
  check_settings(settings, _FIXED, set(_DEFAULTS) | _INERT)
  if settings['dynamic_img_size'] and settings['use_abs_pos_emb']:
    raise unsupported('dynamic_img_size', True, 'it resizes the position '
                      "table for each input; vit_jax's is resized once")


def _pooling(settings) -> Dict[str, Any]:
  """classifier, fc_norm and (for `transformer`) final_norm as Eva pools
  and normalizes (PE's Spatial and Lang: neither norm; its Core: the final
  norm, then the attention pool of `attn_pool_num_heads`)."""
  pool, cls = settings['global_pool'], settings['class_token']
  fc_norm = settings['use_fc_norm']
  fc_norm = pool == 'avg' if fc_norm is None else fc_norm
  post = settings['use_post_transformer_norm']
  post = not fc_norm if post is None else post
  if post and fc_norm:
    raise unsupported('use_post_transformer_norm', post, 'vit_jax '
                      'normalizes either before the pooling or after it')
  norms = {'fc_norm': fc_norm, 'final_norm': post or fc_norm}
  if pool == 'avg':
    return {'classifier': 'token_gap' if cls else 'gap', **norms}
  if pool == 'map':
    return {'classifier': 'token_map' if cls else 'map', **norms,
            'map_heads': settings['attn_pool_num_heads'],
            'map_mlp_dim': int(settings['embed_dim'] * (
                settings['attn_pool_mlp_ratio'] or settings['mlp_ratio']))}
  if pool == 'token' and cls:
    # fc_norm on the class token alone is the final norm on every token.
    return {'classifier': 'token', 'fc_norm': False,
            'final_norm': post or fc_norm}
  raise unsupported('global_pool', pool, "vit_jax converts Eva's 'avg', "
                    "'map' and 'token' (with its class token) pooling")


def _rope(settings) -> Dict[str, Any]:
  if not settings['use_rot_pos_emb']:
    return {'rope': None}
  kind, half = settings['rope_type'], settings['rope_rotate_half']
  if (kind, half) not in (('cat', False), ('dinov3', True)):
    raise unsupported('rope_type', kind, "vit_jax computes EVA-02's "
                      "('cat', interleaved) and DINOv3's ('dinov3', half) "
                      'RoPE only')
  offset, indexing = settings['rope_grid_offset'], settings[
      'rope_grid_indexing']
  if offset and kind != 'cat':
    raise unsupported('rope_grid_offset', offset, "vit_jax shifts the "
                      "positions of 'cat' RoPE only")
  if indexing not in ROPE_INDEXINGS:
    raise unsupported('rope_grid_indexing', indexing, 'expected one of '
                      f'{ROPE_INDEXINGS}')
  ref = settings['ref_feat_shape']
  return {'rope': 'eva02' if kind == 'cat' else 'dinov3',
          'rope_theta': float(settings['rope_temperature']),
          'rope_ref_grid': None if ref is None or kind != 'cat' else
                           tuple(ref) if isinstance(ref, (list, tuple))
                           else (ref, ref),
          'rope_offset': float(offset), 'rope_indexing': indexing}


def _qkv_bias(settings) -> str:
  """EvaAttention's q and v biases, or AttentionRope's ('rope': PE's) of
  all three."""
  if settings['attn_type'] not in ('eva', 'rope'):
    raise unsupported('attn_type', settings['attn_type'], "vit_jax computes "
                      "Eva's 'eva' and 'rope' attention")
  if not settings['qkv_bias']:
    return 'none'
  return 'qkv' if settings['attn_type'] == 'rope' else 'qv'


def eva_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for timm's Eva `settings`, or a ValueError
  naming the first one that vit_jax cannot compute."""
  _check_known(settings)
  pre_norm = settings['use_pre_transformer_norm']
  pooling = _pooling(settings)
  final_norm = pooling.pop('final_norm')
  return dict(
      pooling, num_registers=settings['num_reg_tokens'],
      posemb='learn' if settings['use_abs_pos_emb'] else 'none',
      posemb_prefix=not settings['no_embed_class'], patch_bias=not pre_norm,
      transformer=dict(
          _rope(settings), gelu_approximate=False, quick_gelu=False,
          swiglu=settings['swiglu_mlp'], mlp_norm=settings['scale_mlp'],
          qkv_bias=_qkv_bias(settings),
          layerscale_init=settings['init_values'], pre_norm=pre_norm,
          layer_norm_eps=settings['layer_norm_eps'], final_norm=final_norm))


def mlp_dim(settings) -> int:
  """Each SwiGLU half's width, or the MLP's."""
  return int(settings['embed_dim'] * settings['mlp_ratio'])


def to_vit_state(state: Flat) -> Flat:
  """Eva's state dict in timm ViT's names (the key's bias 0, biases Eva
  lacks 0: dropped after the mapping)."""
  out = {}
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.', key)
    if block is None:
      out[key] = value
      continue
    prefix, rest = block[0], key[block.end():]
    if rest in ('gamma_1', 'gamma_2'):
      out[f'{prefix}ls{rest[-1]}.gamma'] = value
    elif rest in ('attn.q_bias', 'attn.v_bias'):
      continue  # with the fused weight below
    elif rest == 'attn.qkv.weight':
      out[key] = value
      if f'{prefix}attn.qkv.bias' in state:  # AttentionRope's (PE's)
        continue
      q_bias = state.get(f'{prefix}attn.q_bias')
      zeros = np.zeros(value.shape[0] // 3, value.dtype)
      out[f'{prefix}attn.qkv.bias'] = np.concatenate(
          [zeros, zeros, zeros] if q_bias is None else
          [q_bias, zeros, state[f'{prefix}attn.v_bias']])
    elif re.fullmatch(r'attn\.[qkv]_proj\.(weight|bias)', rest):
      if rest.startswith('attn.q_proj'):
        kind = rest.rsplit('.', 1)[1]
        parts = [state.get(f'{prefix}attn.{n}_proj.{kind}') for n in 'qkv']
        parts[1] = np.zeros_like(parts[0]) if parts[1] is None else parts[1]
        out[f'{prefix}attn.qkv.{kind}'] = np.concatenate(parts)
    elif re.fullmatch(r'mlp\.fc1_[gx]\.(weight|bias)', rest):
      if rest.startswith('mlp.fc1_g'):
        kind = rest.rsplit('.', 1)[1]
        out[f'{prefix}mlp.fc1.{kind}'] = np.concatenate(
            [value, state[f'{prefix}mlp.fc1_x.{kind}']])
    else:
      out[key] = value
  return out


def drop_biases(flat: Flat, qkv_bias: str) -> Flat:
  """The converted names without the projection biases Eva lacks."""
  lacking = {'qkv': (), 'qv': ('key',),
             'none': ('query', 'key', 'value')}[qkv_bias]
  if not lacking:
    return flat
  pattern = re.compile(r'.*/MultiHeadDotProductAttention_1/(%s)/bias' %
                       '|'.join(lacking))
  return {k: v for k, v in flat.items() if not pattern.fullmatch(k)}


def qkv_bias_of(flat: Flat) -> str:
  """'qkv', 'qv' or 'none': the projection biases that converted names
  have."""
  have = {m[1] for k in flat for m in [re.fullmatch(
      r'.*/MultiHeadDotProductAttention_1/(query|key|value)/bias', k)] if m}
  return 'qkv' if 'key' in have else 'qv' if have else 'none'


def with_zero_biases(flat: Flat) -> Flat:
  """Converted names with zero biases where the projections have none, as
  `names.npz_to_timm` reads them."""
  out = dict(flat)
  for key, kernel in flat.items():
    match = re.fullmatch(r'(.*/MultiHeadDotProductAttention_1/'
                         r'(?:query|key|value))/kernel', key)
    if match:
      out.setdefault(f'{match[1]}/bias', np.zeros(kernel.shape[1:],
                                                  kernel.dtype))
  return out


def from_vit_state(state: Flat, *, fused: bool, qkv_bias: str) -> Flat:
  """timm ViT's names (from `names.npz_to_timm` of `with_zero_biases`) ->
  Eva's: q/k/v fused with q_bias and v_bias (EVA-02-Ti/S, DINOv3) or apart
  with a SwiGLU fc1_g/fc1_x (EVA-02-B/L: `fused` False); biases as
  `qkv_bias` says ('qkv': AttentionRope's qkv.bias, PE's)."""
  out = {}
  for key, value in state.items():
    block = re.match(r'blocks\.(\d+)\.', key)
    rest = key[block.end():] if block else None
    prefix = block[0] if block else ''
    if rest in ('ls1.gamma', 'ls2.gamma'):
      out[f'{prefix}gamma_{rest[2]}'] = value
    elif rest == 'attn.qkv.bias' and qkv_bias == 'qkv' and fused:
      out[key] = value  # AttentionRope's (PE's)
    elif rest == 'attn.qkv.bias':
      q, k, v = np.split(value, 3)
      if qkv_bias == 'none':
        continue
      if qkv_bias == 'qkv':  # AttentionRope's, apart
        out[f'{prefix}attn.k_proj.bias'] = k
      names = ('q_bias', 'v_bias') if fused else ('q_proj.bias', 'v_proj.bias')
      out.update({f'{prefix}attn.{n}': b for n, b in zip(names, (q, v))})
    elif rest == 'attn.qkv.weight' and not fused:
      for n, part in zip('qkv', np.split(value, 3)):
        out[f'{prefix}attn.{n}_proj.weight'] = part
    elif rest in ('mlp.fc1.weight', 'mlp.fc1.bias') and not fused:
      gate, x = np.split(value, 2)
      out[f'{prefix}mlp.fc1_g.{rest[8:]}'] = gate
      out[f'{prefix}mlp.fc1_x.{rest[8:]}'] = x
    else:
      out[key] = value
  return out
