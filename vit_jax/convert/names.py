"""Parameter names and layouts: timm's state dict <-> the published .npz
(ViTs and DeiT's, CLIP's and SigLIP's towers with its MAP head `attn_pool`,
hybrids, MLP-Mixers, BEiT's relative position tables); Swin's are
`convert.swin`'s, and `convert.eva` puts EVA-02's, DINOv3's and BEiT's
blocks in the ViT's names first."""

import re
from typing import Dict

import numpy as np


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
    (r'norm_pre\.(weight|bias)', r'Transformer/norm_pre/\1'),
    (r'blocks\.(\d+)\.mlp\.norm\.(weight|bias)',
     r'Transformer/encoderblock_\1/MlpBlock_3/norm/\2'),
    (r'blocks\.(\d+)\.attn\.([qk])_norm\.(weight|bias)',
     r'Transformer/encoderblock_\1/MultiHeadDotProductAttention_1/\2_norm/\3'),
    (r'attn_pool\.latent', 'MAPHead_0/probe'),
    (r'attn_pool\.norm\.(weight|bias)', r'MAPHead_0/LayerNorm_0/\1'),
    (r'attn_pool\.mlp\.fc(\d)\.(weight|bias)',
     lambda m: f'MAPHead_0/MlpBlock_0/Dense_{int(m[1]) - 1}/{m[2]}'),
    (r'patch_embed\.proj\.(weight|bias)', r'embedding/\1'),
    (r'patch_embed\.norm\.(weight|bias)', r'embedding_norm/\1'),  # AIMv2's
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
# BEiT's tables of relative positions (offsets, heads), the same values on
# both sides: a block's, and one shared by the blocks.
_TABLES = [
    (r'blocks\.(\d+)\.attn\.relative_position_bias_table',
     r'Transformer/encoderblock_\1/relative_bias/table'),
    (r'rel_pos_bias\.relative_position_bias_table',
     'Transformer/relative_bias/table'),
]
_ATTENTION = re.compile(r'blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)')
_BLOCK_NPZ = 'Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/'
# timm's attention pooling (AttentionPoolLatent): the query of `latent`,
# keys and values fused.
_POOL = re.compile(r'attn_pool\.(q|kv|proj)\.(weight|bias)')
_POOL_NPZ = 'MAPHead_0/MultiHeadDotProductAttention_0/'


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


def _projections_to_npz(prefix, names, kind, value, heads) -> Flat:
  """timm's fused projections (weight (n H K, D) or bias) -> flax's
  `names` under `prefix`: kernels (D, H, K), biases (H, K)."""
  out = {}
  for name, part in zip(names, np.split(value, len(names))):
    if kind == 'weight':
      out[f'{prefix}{name}/kernel'] = part.T.reshape(part.shape[1], heads, -1)
    else:
      out[f'{prefix}{name}/bias'] = part.reshape(heads, -1)
  return out


def _output_to_npz(prefix, kind, value, heads) -> Flat:
  if kind == 'weight':  # (D, H K) -> (H, K, D)
    return {f'{prefix}out/kernel': value.T.reshape(heads, -1, value.shape[0])}
  return {f'{prefix}out/bias': value}


def _attention_to_npz(state: Flat, heads: int, pool_heads: int) -> Flat:
  """The fused qkv and proj of each block (`heads`), and of a MAP head (q,
  kv, proj; `pool_heads`) -> query/key/value/out."""
  out = {}
  for key, value in state.items():
    block, pool = _ATTENTION.fullmatch(key), _POOL.fullmatch(key)
    if block:
      prefix, part, kind = _BLOCK_NPZ.format(block[1]), block[2], block[3]
      split = heads
    elif pool:
      prefix, part, kind, split = _POOL_NPZ, pool[1], pool[2], pool_heads
    else:
      continue
    names = {'qkv': ('query', 'key', 'value'), 'q': ('query',),
             'kv': ('key', 'value')}.get(part)
    out.update(_projections_to_npz(prefix, names, kind, value, split) if names
               else _output_to_npz(prefix, kind, value, split))
  return out


def _npz_name(key: str, rules) -> str:
  """The published name of timm's `key`, or None."""
  for pattern, target in rules:
    match = re.fullmatch(pattern, key)
    if match:
      name = match.expand(target) if isinstance(target, str) else target(
          match)
      norm = re.search(r'(LayerNorm_\d|\w+_norm|norm_pre|/norm|'
                       r'pre_head_layer_norm|gn\w*)/weight$', name)
      return re.sub(r'/weight$', '/scale' if norm else '/kernel', name)
  return None


def timm_to_npz(state: Flat, heads: int, pool_heads=None) -> Flat:
  """A timm state dict (numpy) -> '/'-joined published names; a MAP head's
  attention of `pool_heads` (default: the blocks' `heads`)."""
  rules = _rules(mixer=any(k.startswith('stem.') for k in state))
  out = _attention_to_npz(state, heads, pool_heads or heads)
  unknown = []
  for key, value in state.items():
    if _ATTENTION.fullmatch(key) or _POOL.fullmatch(key):
      continue
    table = _npz_name(key, _TABLES)
    name = _npz_name(key, rules)
    if table is not None:
      out[table] = np.asarray(value)
    elif name is None:
      unknown.append(key)
    else:
      out[name] = _leaf_to_npz(np.asarray(value))
  if unknown:
    shown = ', '.join(repr(k) for k in unknown[:6])
    more = f' and {len(unknown) - 6} more' if len(unknown) > 6 else ''
    raise ValueError(
        f'timm key{"s" if len(unknown) > 1 else ""} {shown}{more} '
        f'{"have" if len(unknown) > 1 else "has"} no counterpart in vit_jax '
        '(attention pooling, or another layer that '
        'vit_jax does not have).')
  return out


def missing_keys(flat: Flat, *, patch_bias: bool = True,
                 final_norm: bool = True, norm_bias: bool = True,
                 position_table: bool = True,
                 qkv_biases=('query', 'key', 'value'),
                 relative_bias=None) -> list:
  """What a ViT's published names lack of what a ViT with this patch bias,
  final norm, norms with biases (not RMSNorms), position table, these
  projection biases and BEiT's `relative_bias` tables has."""
  if 'stem/kernel' in flat:
    return []
  norm = 'fc_norm' if 'fc_norm/scale' in flat else 'Transformer/encoder_norm'
  need = ['embedding/kernel']
  if final_norm or norm == 'fc_norm':
    need += [f'{norm}/scale'] + ([f'{norm}/bias'] if norm_bias else [])
  need += ['embedding/bias'] if patch_bias else []
  need += ['Transformer/posembed_input/pos_embedding'] if position_table else []
  if relative_bias == 'shared':
    need.append('Transformer/relative_bias/table')
  blocks = {m[1] for k in flat
            for m in [re.match(r'Transformer/encoderblock_(\d+)/', k)] if m}
  leaves = [f'{layer}/{leaf}' for layer in ('LayerNorm_0', 'LayerNorm_2')
            for leaf in ('scale', 'bias')[:2 if norm_bias else 1]]
  leaves += [f'MlpBlock_3/Dense_{i}/{leaf}' for i in (0, 1)
             for leaf in ('kernel', 'bias')]
  attention = 'MultiHeadDotProductAttention_1'
  leaves += [f'{attention}/{part}/kernel'
             for part in ('query', 'key', 'value', 'out')]
  leaves += [f'{attention}/{part}/bias' for part in (*qkv_biases, 'out')]
  if any(re.search('/ls[12]/scale$', k) for k in flat):  # all or none
    leaves += ['ls1/scale', 'ls2/scale']
  leaves += ['relative_bias/table'] if relative_bias == 'block' else []
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
    top = ['patch_embed.proj', 'patch_embed.norm', 'norm_pre', 'norm',
           'fc_norm', 'head',
           'head_dist', 'attn_pool.norm', 'attn_pool.mlp.fc1',
           'attn_pool.mlp.fc2']
    inner = ['norm1', 'norm2', 'mlp.fc1', 'mlp.norm', 'mlp.fc2',
             'attn.q_norm', 'attn.k_norm']
  modules = top + [f'blocks.{i}.{n}' for i in sorted(blocks) for n in inner]
  keys = ['cls_token', 'dist_token', 'reg_token', 'pos_embed',
          'attn_pool.latent'] + [
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


def _timm_tables(flat: Flat) -> list:
  """timm's keys of the tables of relative positions that `flat` may have."""
  blocks = {m[1] for k in flat
            for m in [re.match(r'Transformer/encoderblock_(\d+)/', k)] if m}
  return ['rel_pos_bias.relative_position_bias_table'] + [
      f'blocks.{i}.attn.relative_position_bias_table' for i in sorted(blocks)]


def npz_to_timm(flat: Flat) -> Flat:
  """'/'-joined published names -> a timm state dict (numpy)."""
  rules = _rules(mixer=any(k.startswith('MixerBlock_') for k in flat))
  names = {_npz_name(key, rules): key for key in _timm_keys(flat)}
  tables = {_npz_name(key, _TABLES): key for key in _timm_tables(flat)}
  out, attention = {}, {}
  for key, value in flat.items():
    match = re.fullmatch(r'(?:Transformer/encoderblock_(\d+)/'
                         r'MultiHeadDotProductAttention_1|MAPHead_0/'
                         r'MultiHeadDotProductAttention_0)/'
                         r'(query|key|value|out)/(\w+)', key)
    if match:
      attention[match[1], match[2], match[3]] = value
    elif key in tables:
      out[tables[key]] = value
    elif key in names:
      out[names[key]] = _leaf_to_timm(value)
    else:
      raise ValueError(f'{key!r} has no counterpart in timm (a pre_logits '
                       'head, or another position scheme).')
  for (block, name, kind), value in attention.items():
    if name == 'out':
      prefix = 'attn_pool.' if block is None else f'blocks.{block}.attn.'
      parts = ((('q', ('query',)), ('kv', ('key', 'value'))) if block is None
               else (('qkv', ('query', 'key', 'value')),))
      for part, names_in in parts:
        out[f'{prefix}{part}.{_TIMM_LEAF[kind]}'] = _projections_to_timm(
            [attention[block, n, kind] for n in names_in])
      out[f'{prefix}proj.{_TIMM_LEAF[kind]}'] = (
          value.reshape(-1, value.shape[-1]).T if kind == 'kernel' else value)
  return out


_TIMM_LEAF = {'kernel': 'weight', 'bias': 'bias'}


def _projections_to_timm(parts) -> np.ndarray:
  """flax's kernels (D, H, K) -> timm's fused (n H K, D); biases (H, K) ->
  (n H K,)."""
  if parts[0].ndim == 3:
    return np.concatenate([p.reshape(p.shape[0], -1).T for p in parts])
  return np.concatenate([p.reshape(-1) for p in parts])
