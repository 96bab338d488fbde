"""The preset that converted weights are: inferred from their published
names' shapes (and the family timm's architecture names), checked, and what
timm's settings add to it (`differences`)."""

import math
import re
from typing import Any, Dict, Optional

import numpy as np

from vit_jax import cli
from vit_jax.models import registry
from vit_jax.models import vit as models_vit
from vit_jax.convert import eva as convert_eva
from vit_jax.models.encoder import Encoder

Flat = Dict[str, np.ndarray]

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


def dims(flat: Flat) -> Dict[str, Any]:
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
      mlp_norm='Transformer/encoderblock_0/MlpBlock_3/norm/scale' in flat,
      layerscale='Transformer/encoderblock_0/ls1/scale' in flat,
      registers=flat['reg'].shape[1] if 'reg' in flat else 0,
      posemb_prefix=posemb_prefix(flat),
      position_table='Transformer/posembed_input/pos_embedding' in flat,
      pre_norm='Transformer/norm_pre/scale' in flat,
      patch_bias='embedding/bias' in flat,
      qkv_bias=convert_eva.qkv_bias_of(flat),
      relative_bias=relative_bias(flat),
      map_head='MAPHead_0/probe' in flat,
      final_norm=any(f'{k}/scale' in flat for k in ('Transformer/encoder_norm',
                                                    'fc_norm')),
      norm=('layer' if 'Transformer/encoderblock_0/LayerNorm_0/bias' in flat
            else 'rms'),
      qk_norm=qk_norm(flat),
      patch_norm='embedding_norm/scale' in flat)


_OPTIONS = ('swiglu', 'mlp_norm', 'layerscale', 'registers', 'posemb_prefix',
            'position_table', 'pre_norm', 'patch_bias', 'qkv_bias',
            'relative_bias', 'map_head', 'final_norm', 'norm', 'qk_norm')


def qk_norm(flat: Flat) -> Optional[str]:
  """The query/key norms that the names have: None, 'head' (a head's
  features wide) or 'all' (all heads')."""
  attention = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/'
  scale = flat.get(f'{attention}q_norm/scale')
  if scale is None:
    return None
  _, heads, depth = flat[f'{attention}query/kernel'].shape
  return 'head' if heads > 1 and scale.shape[0] == depth else 'all'


def relative_bias(flat: Flat) -> Optional[str]:
  """BEiT's tables that the names have: 'block', 'shared' or None."""
  if 'Transformer/relative_bias/table' in flat:
    return 'shared'
  if 'Transformer/encoderblock_0/relative_bias/table' in flat:
    return 'block'
  return None


def posemb_prefix(flat: Flat) -> Optional[bool]:
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
  """The presets that timm's ViTs, Evas, Beits, NaFlexVits and Mixers can
  be (no LiT, BiT or Swin: `convert.swin` has its own)."""
  return registry.presets_of('vit', 'eva', 'beit', 'mixer', 'naflex',
                             'aimv2')


def _preset_dims(name: str) -> Dict[str, Any]:
  config = registry.MODEL_CONFIGS[name]
  if registry.family(name).timm_layout == 'mixer':
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
              mlp_norm=bool(transformer.get('mlp_norm')),
              layerscale=transformer.get('layerscale_init') is not None,
              registers=config.get('num_registers') or 0,
              posemb_prefix=config.get('posemb_prefix', True),
              position_table=config.get('posemb', 'learn') == 'learn',
              pre_norm=bool(transformer.get('pre_norm')),
              patch_bias=config.get('patch_bias', True),
              qkv_bias=transformer.get('qkv_bias', 'qkv'),
              relative_bias=transformer.get('relative_bias'),
              map_head=config.classifier in ('map', 'token_map'),
              final_norm=(transformer.get('final_norm', True) or
                          bool(config.get('fc_norm'))),
              norm=transformer.get('norm', 'layer'),
              qk_norm=transformer.get('qk_norm'),
              patch_norm=bool(config.get('patch_norm')))


def _misfits(name: str, want: Dict[str, Any]) -> list:
  """'what (preset: value)' for each of `want` that preset `name` lacks."""
  have = _preset_dims(name)
  return [f'{key} {value} ({name}: {have.get(key)})'
          for key, value in want.items() if have.get(key) != value]


def infer_preset(flat: Flat, heads: Optional[int] = None,
                 classifier: Optional[str] = None,
                 family: Optional[registry.Family] = None,
                 overrides: Optional[Dict[str, Any]] = None) -> str:
  """The preset (of `family`, default any) whose shapes (and
  `heads`) these published names have, and the fewest model options
  (`_OPTIONS`) to override; of several, the one with `classifier`
  (default: a class token's or 'gap'), then the one that the fewest
  `overrides` (timm's settings) differ from."""
  want = dims(flat)
  if heads is not None:
    want['heads'] = heads
  if 'stem/kernel' not in flat:
    classifier = classifier or token_classifier(flat)
  names = _convertible_presets()
  if family is not None:
    names = [c.model_name for c in family.presets if c.model_name in names]
  misfits = {name: _misfits(name, want) for name in names}
  found = [name for name, wrong in misfits.items()
           if all(w.split()[0] in _OPTIONS for w in wrong)]
  if not found:
    raise ValueError(f'No {family.name + " " if family else ""}preset has '
                     f'these shapes ({want}).')
  return min(found, key=lambda name: (
      len(misfits[name]),
      registry.MODEL_CONFIGS[name].get('classifier') != classifier,
      len(flags(differences(name, overrides))) if overrides else 0))


def token_classifier(flat: Flat) -> str:
  """timm's default pooling of a ViT with these names, as vit_jax's."""
  if 'dist' in flat:
    return 'distilled'
  return 'token' if 'cls' in flat else 'gap'


def check_preset(flat: Flat, name: str, heads: Optional[int] = None) -> None:
  """Raises a ValueError unless preset `name` has these shapes (and heads)."""
  if name not in _convertible_presets():
    raise ValueError(cli.closest(name, _convertible_presets(), 'model'))
  want = dims(flat)
  if heads is not None:
    want['heads'] = heads
  misfits = [m for m in _misfits(name, want) if m.split()[0] not in _OPTIONS]
  if misfits:
    raise ValueError(f'--model_name={name} does not fit the checkpoint, '
                     f'which has {", ".join(misfits)}.')


def differences(name: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
  """The part of `overrides` that preset `name` does not already set."""
  preset = registry.MODEL_CONFIGS[name].to_dict()
  for key, value in overrides.get('transformer', {}).items():
    # A field the preset lacks is the Encoder's default.
    preset['transformer'].setdefault(
        key, Encoder.__dataclass_fields__[key].default)
  fields = models_vit.VisionTransformer.__dataclass_fields__
  for key in overrides:
    if key not in preset and key in fields:
      preset[key] = fields[key].default
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


def flags(overrides: Dict[str, Any], prefix: str = '') -> list:
  """'transformer.gelu_approximate=False', ... of nested `overrides`."""
  out = []
  for key, value in overrides.items():
    if isinstance(value, dict):
      out += flags(value, f'{prefix}{key}.')
    else:
      out.append(f'{prefix}{key}={value!r}')
  return out
