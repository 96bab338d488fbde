"""timm's Beit (`beit.py`: BEiT, BEiT v2) <-> vit_jax's ViT.

Its config.json is read as the ViT's is: every setting that changes the
computation is mapped or refused by name. Its state dict is put in the ViT's
timm names first (`eva.to_vit_state`: its blocks are named as Eva's), so
that `convert.names` maps it (timm -> ViT names):

  blocks.{i}.gamma_1, gamma_2             blocks.{i}.ls1.gamma, ls2.gamma
  blocks.{i}.attn.q_bias, v_bias          blocks.{i}.attn.qkv.bias (key: 0)
  blocks.{i}.attn.relative_position_bias_table
                                      Transformer/encoderblock_{i}/
                                      relative_bias/table
  rel_pos_bias.relative_position_bias_table
                                      Transformer/relative_bias/table

The buffers `relative_position_index` (of an original checkpoint) are
dropped: the model derives them (`posemb.relative_bias_index`).
"""

import re
from typing import Any, Dict

import numpy as np

from vit_jax.convert import eva as convert_eva
from vit_jax.convert.timm_config import check_settings
from vit_jax.convert.timm_config import read_settings
from vit_jax.convert.timm_config import SIZES  # BEiT's sizes are the ViT's
from vit_jax.convert.timm_config import unsupported

Flat = Dict[str, np.ndarray]

# timm Beit's defaults for what is read below.
_DEFAULTS = dict(
    global_pool='avg', patch_size=16, embed_dim=768, depth=12, num_heads=12,
    qkv_bias=True, mlp_ratio=4., init_values=None, use_abs_pos_emb=True,
    use_rel_pos_bias=False, use_shared_rel_pos_bias=False, use_fc_norm=None,
    swiglu_mlp=False, scale_mlp=False)
# Settings vit_jax computes only at timm's default, and why not else.
_FIXED = {
    'swiglu_mlp': (False, 'no BEiT has a SwiGLU MLP'),
    'scale_mlp': (False, 'no BEiT normalizes inside its MLP'),
    'attn_head_dim': (None, 'heads narrower or wider than width / heads'),
    'in_chans': (3, "vit_jax's pipelines feed RGB images"),
    'norm_layer': (None, 'another norm'),
}
# Training, initialization, or what the weights' shapes say anyway.
_INERT = {'img_size', 'num_classes', 'drop_rate', 'pos_drop_rate',
          'proj_drop_rate', 'attn_drop_rate', 'drop_path_rate',
          'head_init_scale'}
_INDEX = 'relative_position_index'


def is_beit(architecture: str) -> bool:
  return bool(re.fullmatch(r'beit(v2)?_\w+', architecture))


def _architecture_args(name: str) -> Dict[str, Any]:
  """What timm's Beit entrypoint `name` passes."""
  match = re.fullmatch(r'beit(v2)?_(base|large)_patch16_\d+', name)
  if not match:
    raise ValueError(
        f"timm architecture {name!r} is not one that vit_jax.convert knows. "
        'Known BEiTs: beit_{base,large}_patch16_S and '
        'beitv2_{base,large}_patch16_S.')
  return dict(SIZES[match[2]], patch_size=16, use_abs_pos_emb=False,
              use_rel_pos_bias=True,
              init_values=0.1 if match[0].startswith('beit_base') else 1e-5)


def beit_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments timm's Beit got, from its config.json."""
  settings = read_settings(config, _DEFAULTS, _architecture_args)
  # Beit has LayerScale where init_values is truthy.
  settings['init_values'] = settings['init_values'] or None
  return settings


def _check_known(settings) -> None:
  check_settings(settings, _FIXED, set(_DEFAULTS) | _INERT)
  if settings['use_rel_pos_bias'] and settings['use_shared_rel_pos_bias']:
    raise unsupported('use_shared_rel_pos_bias', True, 'beside '
                      "use_rel_pos_bias: vit_jax's blocks have their own "
                      'table or a shared one, not both')


def _pooling(settings) -> Dict[str, Any]:
  """classifier and fc_norm as Beit pools (its class token always there)."""
  pool, fc_norm = settings['global_pool'], settings['use_fc_norm']
  fc_norm = pool == 'avg' if fc_norm is None else fc_norm
  if pool == 'avg':
    return {'classifier': 'token_gap', 'fc_norm': fc_norm}
  if pool == 'token':
    # fc_norm on the class token alone is the final norm on every token.
    return {'classifier': 'token', 'fc_norm': False}
  raise unsupported('global_pool', pool, "vit_jax converts Beit's 'avg' "
                    "and 'token' pooling")


def beit_overrides(settings: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's model config for timm's Beit `settings`, or a ValueError
  naming the first one that vit_jax cannot compute."""
  _check_known(settings)
  relative = ('block' if settings['use_rel_pos_bias'] else 'shared'
              if settings['use_shared_rel_pos_bias'] else None)
  return dict(
      _pooling(settings),
      posemb='learn' if settings['use_abs_pos_emb'] else 'none',
      transformer=dict(
          gelu_approximate=False, relative_bias=relative,
          qkv_bias='qv' if settings['qkv_bias'] else 'none',
          layerscale_init=settings['init_values'], layer_norm_eps=1e-6))


def to_vit_state(state: Flat) -> Flat:
  """Beit's state dict in timm ViT's names (`eva.to_vit_state`), without
  the index buffers."""
  return convert_eva.to_vit_state(
      {k: v for k, v in state.items() if not k.endswith(_INDEX)})

