"""SAM's image encoder: timm's `samvit_*` and transformers' SamVisionModel
and SamModel (its vision encoder) <-> vit_jax's `models.sam` names.

transformers' names become timm's first (`_TRANSFORMERS`), then one table
maps timm's to vit_jax's (timm -> vit_jax):

  patch_embed.proj            embedding          (Conv)
  pos_embed                   pos_embedding      (1, h, w, D) as it is
  blocks.{i}.norm1, norm2     blocks_{i}/norm1, norm2
  blocks.{i}.attn.qkv, proj   blocks_{i}/attn/qkv, proj
  blocks.{i}.attn.rel_pos_h   blocks_{i}/attn/rel_pos_h (and _w), as they are
  blocks.{i}.mlp.fc1, fc2     blocks_{i}/mlp/Dense_0, Dense_1
  neck.0, 1, 2, 3             neck/conv1, norm1, conv2, norm2

The model config comes from the shapes (width, depth, MLP, head width from
the relative tables, grid from the absolute one, which blocks are global
from their tables' rows) and, for what shapes cannot say, from timm's
`model_args` (else its architecture's preset) or transformers'
config.json. timm's samvit computes its blocks' LayerNorms with eps 1e-5
(torch's default), transformers' with `layer_norm_eps` (SAM's 1e-6).
"""

import re
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from vit_jax.convert import transform
from vit_jax.models import registry

Flat = Dict[str, np.ndarray]
CUSTOM = 'SAM-custom'
TIMM_EPS = 1e-5  # timm's samvit: nn.LayerNorm's default
# timm's architectures and the presets of their shapes.
TIMM_PRESETS = {'samvit_base_patch16': 'SAM-B',
                'samvit_large_patch16': 'SAM-L',
                'samvit_huge_patch16': 'SAM-H'}
TRANSFORMERS = ('SamVisionModel', 'SamModel')
# SamVisionConfig's defaults (transformers 5.23), for a config.json that
# leaves some out.
DEFAULTS = dict(hidden_size=768, output_channels=256, num_hidden_layers=12,
                num_attention_heads=12, num_channels=3, image_size=1024,
                patch_size=16, hidden_act='gelu', layer_norm_eps=1e-6,
                qkv_bias=True, mlp_ratio=4.0, use_abs_pos=True,
                use_rel_pos=True, window_size=14,
                global_attn_indexes=[2, 5, 8, 11], mlp_dim=None)
_GELUS = {'gelu': False, 'gelu_pytorch_tanh': True, 'gelu_new': True}

# (timm module, vit_jax module); {i} is a block's index.
_MODULES = [
    ('patch_embed.proj', 'embedding'),
    ('blocks.{i}.norm1', 'blocks_{i}/norm1'),
    ('blocks.{i}.norm2', 'blocks_{i}/norm2'),
    ('blocks.{i}.attn.qkv', 'blocks_{i}/attn/qkv'),
    ('blocks.{i}.attn.proj', 'blocks_{i}/attn/proj'),
    ('blocks.{i}.mlp.fc1', 'blocks_{i}/mlp/Dense_0'),
    ('blocks.{i}.mlp.fc2', 'blocks_{i}/mlp/Dense_1'),
    ('blocks.{i}.attn', 'blocks_{i}/attn'),
    ('neck.0', 'neck/conv1'),
    ('neck.1', 'neck/norm1'),
    ('neck.2', 'neck/conv2'),
    ('neck.3', 'neck/norm2'),
]
# transformers' vision encoder -> timm's names.
_TRANSFORMERS = [
    (r'patch_embed\.projection\.', 'patch_embed.proj.'),
    (r'layers\.(\d+)\.layer_norm(\d)\.', r'blocks.\1.norm\2.'),
    (r'layers\.(\d+)\.mlp\.lin(\d)\.', r'blocks.\1.mlp.fc\2.'),
    (r'layers\.(\d+)\.attn\.', r'blocks.\1.attn.'),
    (r'neck\.conv1\.', 'neck.0.'), (r'neck\.layer_norm1\.', 'neck.1.'),
    (r'neck\.conv2\.', 'neck.2.'), (r'neck\.layer_norm2\.', 'neck.3.'),
]
_TABLES = ('rel_pos_h', 'rel_pos_w')


def is_sam(names) -> bool:
  """Whether timm keys or vit_jax names are SAM's (decomposed tables)."""
  return any(k.endswith(('attn.rel_pos_h', 'attn/rel_pos_h')) for k in names)


def is_transformers_sam(config: Dict[str, Any]) -> bool:
  return (config.get('architectures') or [None])[0] in TRANSFORMERS


def _pattern(template: str, sep: str) -> re.Pattern:
  parts = re.split(r'\{(\w)\}', template)
  return re.compile(''.join(
      re.escape(p) if k % 2 == 0 else rf'(?P<{p}>\d+)'
      for k, p in enumerate(parts)) + re.escape(sep) + r'(?P<leaf>\w+)')


def _rename(key: str, source: int) -> Optional[Tuple[str, str]]:
  """(other side's module, leaf) of `key` (source 0: timm, 1: vit_jax)."""
  if key in ('pos_embed', 'pos_embedding'):
    return ('pos_embedding', '') if source == 0 else ('pos_embed', '')
  sep = '.' if source == 0 else '/'
  for pair in _MODULES:
    match = _pattern(pair[source], sep).fullmatch(key)
    if match:
      fields = {k: v for k, v in match.groupdict().items() if k != 'leaf'}
      return pair[1 - source].format(**fields), match['leaf']
  return None


def _to_npz_leaf(module: str, leaf: str, value: np.ndarray):
  if leaf in _TABLES or leaf == '':
    return leaf, value
  if leaf == 'weight' and 'norm' in module.rsplit('/', 1)[-1]:
    return 'scale', value
  if leaf == 'weight':
    return 'kernel', value.transpose(2, 3, 1, 0) if value.ndim == 4 else value.T
  return leaf, value


def _to_timm_leaf(leaf: str, value: np.ndarray):
  if leaf in ('scale', 'kernel'):
    if leaf == 'kernel':
      value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T
    return 'weight', value
  return leaf, value


def _join(module: str, leaf: str, sep: str) -> str:
  return module + (sep + leaf if leaf else '')


def timm_to_npz(state: Flat) -> Flat:
  """timm's samvit state dict (numpy) -> '/'-joined vit_jax names; its
  classifier head, if any, is refused."""
  out, unknown = {}, []
  for key, value in state.items():
    found = _rename(key, 0)
    if found is None:
      unknown.append(key)
      continue
    leaf, value = _to_npz_leaf(found[0], found[1], np.asarray(value))
    out[_join(found[0], leaf, '/')] = value
  if unknown:
    names = ', '.join(sorted(unknown)[:6])
    raise ValueError(f'{len(unknown)} name(s) have no counterpart in '
                     f"vit_jax's SAM encoder: {names}.")
  return out


def npz_to_timm(flat: Flat) -> Flat:
  """vit_jax's names -> timm's samvit state dict (numpy)."""
  out = {}
  for key, value in flat.items():
    found = _rename(key, 1)
    if found is None:
      raise ValueError(f"{key} has no counterpart in timm's samvit.")
    leaf, value = _to_timm_leaf(found[1], np.asarray(value))
    out[_join(found[0], leaf, '.')] = value
  return out


def transformers_to_timm(state: Flat, architecture: str,
                         path: str) -> Flat:
  """transformers' vision encoder as timm's names; a SamModel's prompt
  encoder and mask decoder are dropped with a note."""
  out, dropped = {}, []
  for key, value in state.items():
    if not key.startswith('vision_encoder.'):
      dropped.append(key)
      continue
    key = key[len('vision_encoder.'):]
    for pattern, replacement in _TRANSFORMERS:
      key = re.sub('^' + pattern, replacement, key)
    out[key] = value
  if dropped and architecture != 'SamModel':
    raise ValueError(f"{path}: transformers' {architecture} with names "
                     f'outside its vision encoder: {", ".join(dropped[:4])}.')
  if dropped:
    parts = sorted({k.split('.')[0] for k in dropped})
    print(f"Note: {path} is transformers' SamModel: converting its image "
          f'encoder, without its {", ".join(parts)} ({len(dropped)} names).',
          file=sys.stderr)
  return out


def _blocks(flat: Flat) -> int:
  return 1 + max(int(m[1]) for k in flat for m in [
      re.match(r'blocks_(\d+)/', k)] if m)


def shapes(flat: Flat) -> Dict[str, Any]:
  """What vit_jax's names `flat` say of the model, and each block's
  relative table side (`sides`)."""
  kernel = flat['embedding/kernel']
  layers = _blocks(flat)
  depth = flat['blocks_0/attn/rel_pos_h'].shape[1]
  grid = flat['pos_embedding'].shape[1:3]
  return dict(patch_size=kernel.shape[0], hidden_size=kernel.shape[-1],
              num_layers=layers, num_heads=kernel.shape[-1] // depth,
              mlp_dim=flat['blocks_0/mlp/Dense_0/kernel'].shape[-1],
              neck_channels=flat['neck/conv1/kernel'].shape[-1],
              qkv_bias='blocks_0/attn/qkv/bias' in flat,
              image_size=grid[0] * kernel.shape[0], grid=grid,
              sides=[(flat[f'blocks_{i}/attn/rel_pos_h'].shape[0] + 1) // 2
                     for i in range(layers)])


def model_config(flat: Flat, settings: Dict[str, Any], path: str
                 ) -> Dict[str, Any]:
  """vit_jax's SAM config of the weights `flat` computing as `settings`
  (window_size, global_blocks, num_heads, layer_norm_eps,
  gelu_approximate) say; refuses settings that the shapes contradict."""
  have = shapes(flat)
  if have['grid'][0] != have['grid'][1]:
    raise ValueError(f'{path}: its position table is {have["grid"]}; vit_jax '
                     "reads SAM's square ones.")
  window = settings['window_size']
  global_blocks = tuple(int(i) for i in settings['global_blocks'])
  grid = have['grid'][0]
  want = [grid if i in global_blocks else window
          for i in range(have['num_layers'])]
  if want != have['sides']:
    raise ValueError(f'{path}: its relative tables are sized for sides '
                     f'{have["sides"]} (block by block), not those of windows '
                     f'of {window} with global blocks {global_blocks} on a '
                     f'grid of {grid}.')
  heads = settings.get('num_heads', have['num_heads'])
  if heads != have['num_heads']:
    raise ValueError(f'{path}: {heads} heads, but its relative tables are '
                     f'{have["hidden_size"] // have["num_heads"]} wide.')
  return dict(
      image_size=int(have['image_size']), patch_size=int(have['patch_size']),
      hidden_size=int(have['hidden_size']), num_layers=have['num_layers'],
      num_heads=int(heads), mlp_dim=int(have['mlp_dim']), window_size=window,
      global_blocks=global_blocks,
      neck_channels=int(have['neck_channels']),
      layer_norm_eps=settings['layer_norm_eps'], qkv_bias=have['qkv_bias'],
      gelu_approximate=settings.get('gelu_approximate', False),
      stochastic_depth=0., dtype='float32')


def _windows_of(flat: Flat, path: str) -> Dict[str, Any]:
  """Windows and global blocks as the tables' rows tell them: a block
  whose tables fit the grid is global, the others' fit the window."""
  have = shapes(flat)
  grid = have['grid'][0]
  windows = {side for side in have['sides'] if side != grid}
  if len(windows) != 1:
    raise ValueError(f"{path}: its relative tables do not tell the windows "
                     f'(sides {have["sides"]} on a grid of {grid}): put '
                     "timm's config.json beside it.")
  return dict(window_size=windows.pop(), global_blocks=tuple(
      i for i, side in enumerate(have['sides']) if side == grid))


def timm_settings(config: Dict[str, Any], flat: Optional[Flat] = None,
                  path: str = '') -> Dict[str, Any]:
  """The settings of timm's config.json that shapes cannot tell: its
  `model_args`, else its architecture's preset's; without a config.json
  (a bare state dict, as `convert` writes), the tables' (`flat`)."""
  args = config.get('model_args') or {}
  preset = TIMM_PRESETS.get(config.get('architecture'))
  if preset is None and not args and flat is not None:
    return dict(_windows_of(flat, path), layer_norm_eps=TIMM_EPS)
  base = registry.MODEL_CONFIGS[preset or 'SAM-B']
  for key, value in (('use_rel_pos', True), ('use_abs_pos', True),
                     ('qk_norm', False), ('pre_norm', False),
                     ('init_values', None), ('use_rope', False)):
    if key in args and args[key] != value:
      raise ValueError(f"timm's samvit with {key}={args[key]!r} is not "
                       "SAM's encoder, which vit_jax computes.")
  return dict(window_size=args.get('window_size', base.window_size),
              global_blocks=args.get('global_attn_indexes',
                                     base.global_blocks),
              num_heads=args.get('num_heads', base.num_heads),
              layer_norm_eps=TIMM_EPS)


def transformers_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The settings of transformers' config.json (SamModel: its
  `vision_config`), its defaults completed."""
  vision = dict(DEFAULTS, **(config.get('vision_config') or config))
  if vision['hidden_act'] not in _GELUS:
    raise ValueError(f"transformers' SAM with hidden_act="
                     f"{vision['hidden_act']!r}: vit_jax computes "
                     f'{", ".join(_GELUS)}.')
  if not (vision['use_abs_pos'] and vision['use_rel_pos']):
    raise ValueError("transformers' SAM without absolute or relative "
                     "positions is not SAM's encoder, which vit_jax computes.")
  return dict(window_size=vision['window_size'],
              global_blocks=vision['global_attn_indexes'],
              num_heads=vision['num_attention_heads'],
              layer_norm_eps=vision['layer_norm_eps'],
              gelu_approximate=_GELUS[vision['hidden_act']])


def preset(model: Dict[str, Any], model_name: Optional[str] = None
           ) -> Tuple[str, Dict[str, Any]]:
  """(preset, what `model` changes of it): `model_name`, else the SAM
  preset of `model`'s shapes (its settings may differ), else (CUSTOM,
  `model` whole)."""
  presets = registry.MODEL_CONFIGS
  if model_name is not None:
    if registry.family(model_name).name != 'SAM':
      raise ValueError(f"The weights are SAM's encoder, which preset "
                       f'{model_name} is not.')
    return model_name, transform.model_overrides(
        presets[model_name].to_dict(), model)
  shaped = ('image_size', 'patch_size', 'hidden_size', 'num_layers',
            'num_heads', 'mlp_dim', 'window_size', 'global_blocks',
            'neck_channels')
  for name in registry.presets_of('sam'):
    changed = transform.model_overrides(presets[name].to_dict(), model)
    if not set(changed) & set(shaped):
      return name, changed
  return CUSTOM, model


def npz_preset(flat: Flat) -> str:
  """The SAM preset of vit_jax's names `flat` (CUSTOM if none has its
  shapes)."""
  settings = dict(_windows_of(flat, 'the .npz'), layer_norm_eps=1e-6)
  return preset(model_config(flat, settings, 'the .npz'))[0]


def eval_transform(side: int, processor: Optional[Dict[str, Any]],
                   path: str) -> Dict[str, Any]:
  """The record's eval transform of a transformers SAM: SamImageProcessor
  resizes the longer side to `side` and pads; vit_jax squashes to `side`
  (the same for square images), with the processor's mean and std."""
  processor = processor or {}
  print(f"Note: {path}: SamImageProcessor's resize of the longer side and "
        f'padding is recorded as a squash to {side} x {side} px (the same '
        'for square images).', file=sys.stderr)
  return dict(input_size=[3, side, side], crop_pct=1.0, crop_mode='squash',
              interpolation='bilinear',
              mean=list(processor.get('image_mean', transform.IMAGENET_MEAN)),
              std=list(processor.get('image_std', transform.IMAGENET_STD)))
