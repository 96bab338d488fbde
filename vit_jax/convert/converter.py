"""Reading timm's and transformers' checkpoints (a folder, a weights file, a
hub name) into the published .npz and its record; `convert`, the command
line's, also writes an .npz back (`export`); `as_npz` converts once, into
a cache."""

import hashlib
import json
import math
import os
import re
import shutil
import sys
from typing import Any, Dict, NamedTuple, Optional

from flax import traverse_util
import ml_dtypes
import numpy as np

from vit_jax import cli
from vit_jax.checkpoints import files
from vit_jax.checkpoints import record as records
from vit_jax.convert import beit as convert_beit
from vit_jax.convert import eva as convert_eva
from vit_jax.convert import aimv2 as convert_aimv2
from vit_jax.convert import dpt as convert_dpt
from vit_jax.convert import export
from vit_jax.convert import hub
from vit_jax.convert import internvit as convert_internvit
from vit_jax.convert import naflex as convert_naflex
from vit_jax.convert.preset_inference import check_preset
from vit_jax.convert.preset_inference import differences
from vit_jax.convert.preset_inference import dims
from vit_jax.convert.preset_inference import flags
from vit_jax.convert.preset_inference import infer_preset
from vit_jax.convert.preset_inference import posemb_prefix
from vit_jax.convert.preset_inference import token_classifier
from vit_jax.convert import sam as convert_sam
from vit_jax.convert import swin as convert_swin
from vit_jax.convert import timesformer as convert_timesformer
from vit_jax.convert import transform
from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_defaults
from vit_jax.convert import transformers_layout
from vit_jax.convert import torch_files
from vit_jax.convert import transformers_text
from vit_jax.convert import transformers_video
from vit_jax.convert.names import missing_keys
from vit_jax.convert.names import timm_to_npz
from vit_jax.convert.timm_config import mlp_settings
from vit_jax.convert.timm_config import timm_settings
from vit_jax.convert.timm_config import uses_fc_norm
from vit_jax.convert.timm_config import vit_overrides
from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.attention import QKV_BIASES

Flat = Dict[str, np.ndarray]


def _fc_norm_as_final(state: Flat, token_pooling: bool) -> Flat:
  """Token pooling with fc_norm: its weights are the final norm's."""
  if not token_pooling:
    return state
  return {re.sub(r'^fc_norm\.', 'norm.', k): v for k, v in state.items()}


def _check_config_dims(settings, flat: Flat, path: str, layout: str) -> None:
  """config.json and the weights must describe the same model."""
  have = dims(flat)
  patch = settings['patch_size']
  patch = tuple(patch) if isinstance(patch, (list, tuple)) else (patch,) * 2
  hidden = int(settings['embed_dim'] * settings['mlp_ratio'])
  if layout in ('eva', 'beit', 'aimv2'):  # SwiGLU halves: each `hidden` wide
    swiglu, mlp_dim = settings['swiglu_mlp'], hidden
    registers = settings.get('num_reg_tokens', 0)
  else:
    swiglu = mlp_settings(settings)['swiglu']
    mlp_dim, registers = hidden // 2 if swiglu else hidden, settings[
        'reg_tokens']
  said = dict(width=settings['embed_dim'], depth=settings['depth'],
              patch=patch, mlp_dim=mlp_dim, swiglu=swiglu,
              layerscale=settings['init_values'] is not None,
              registers=registers)
  if have['posemb_prefix'] is not None:  # else config.json's says
    said['posemb_prefix'] = not settings.get('no_embed_class', False)
  wrong = [f'{key} {value} (weights: {have[key]})'
           for key, value in said.items() if have[key] != value]
  if wrong:
    raise ValueError(f"{path}'s config.json does not describe its weights: "
                     f'it says {", ".join(wrong)}.')


def read_timm(path: str) -> Flat:
  """A timm or transformers weights file (or the index of its shards) as
  float32 numpy arrays, without the buffers that hold no weights
  (`_without_buffers`); never unpickles objects, needs no torch."""
  state = _without_buffers(_read_file(path), path)
  return {k: v.astype(np.float32) if np.issubdtype(v.dtype, np.floating) or
          v.dtype == ml_dtypes.bfloat16 else v for k, v in state.items()}


def _read_file(path: str) -> Flat:
  """Every array of a weights file, or of the shards its index maps."""
  if path.endswith('.index.json'):
    return _read_shards(path)
  if path.endswith('.safetensors'):
    load_file = export.optional_import('safetensors.numpy', path).load_file
    try:
      return load_file(path)
    except export.optional_import('safetensors', path).SafetensorError as e:
      raise ValueError(f'Cannot read {path}: not a safetensors file, or '
                       f'truncated or corrupt ({e}).') from e
  if path.endswith(('.pth', '.bin', '.pt')):
    return torch_files.load(path)
  raise ValueError(f'{path}: expected a .safetensors, .pth or .bin file.')


def _read_shards(path: str) -> Flat:
  """The weights that a `*.index.json` maps to its shard files."""
  with open(path) as f:
    weight_map = json.load(f).get('weight_map') or {}
  if not weight_map:
    raise ValueError(f'{path} maps no weights (no "weight_map").')
  state = {}
  for shard in sorted(set(weight_map.values())):
    state.update(_read_file(os.path.join(os.path.dirname(path), shard)))
  missing = sorted(set(weight_map) - set(state))
  if missing:
    raise ValueError(f'{path} names {len(missing)} weight(s) that its shards '
                     f'lack: {", ".join(missing[:5])}.')
  return state


def _without_buffers(state: Flat, path: str) -> Flat:
  """`state` without the `position_ids` buffers that older files hold (an
  arange, which the model computes: dropped with a note); one that is no
  arange would change the result, and is refused by name. (Swin's and
  BEiT's index buffers are their readers', `convert.swin`, `convert.beit`
  and `transformers_layout`.)"""
  buffers = [k for k in state if k.rsplit('.', 1)[-1] == 'position_ids']
  for key in buffers:
    value = state[key]
    if not np.array_equal(value.reshape(-1), np.arange(value.size)):
      raise ValueError(f'{path}: the buffer {key} is not 0, 1, ..., '
                       f'{value.size - 1}: it would change what the model '
                       'computes, which vit_jax cannot hold.')
  if buffers:
    print(f'Note: {path}: {len(buffers)} position_ids buffer(s) dropped '
          '(an arange, which the model computes).', file=sys.stderr)
  return {k: v for k, v in state.items() if k not in buffers}


def locate(src: str):
  """(weights file, its config.json or None) of a file or a timm folder."""
  if os.path.isdir(src):
    found = [os.path.join(src, n) for n in hub.WEIGHTS
             if os.path.exists(os.path.join(src, n))]
    if not found:
      raise FileNotFoundError(f'{src} holds none of {", ".join(hub.WEIGHTS)}.')
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
  """Reads a checkpoint in timm's or transformers' layout (which its
  config.json tells), and the files beside it, for vit_jax."""
  weights, config_path = locate(src)
  state = read_timm(weights)
  config = {}
  if config_path is not None:
    with open(config_path) as f:
      config = json.load(f)
  if transformers_layout.is_transformers(config):
    # Settings the file leaves out are its class's defaults.
    config = transformers_defaults.complete_config(config)
    return _from_transformers(state, config, weights, model_name)
  if convert_swin.is_swin(state):
    return _from_swin(state, config, model_name)
  if convert_sam.is_sam(state):
    flat = convert_sam.timm_to_npz(state)
    return _from_sam(flat, convert_sam.timm_settings(config, flat, weights),
                     weights, model_name,
                     dict(config.get('pretrained_cfg') or {}))
  if config_path is None:
    if transformers_layout.looks_like_transformers(state):
      raise ValueError(f"{weights} is in transformers' layout, whose "
                       'settings only its config.json says: put it (and '
                       'preprocessor_config.json) beside the weights.')
    return _from_bare(weights, state, model_name)
  if 'architecture' not in config:
    raise ValueError(f"{config_path} is neither timm's (no 'architecture') "
                     "nor transformers' (no 'model_type' or "
                     "'architectures').")
  architecture = config['architecture']
  layout = ('eva' if convert_eva.is_eva(architecture) else
            'beit' if convert_beit.is_beit(architecture) else
            'aimv2' if convert_aimv2.is_aimv2(architecture) else
            'naflex' if convert_naflex.is_naflex(architecture) else
            'intern' if convert_internvit.is_intern(architecture) else 'vit')
  settings = _LAYOUTS[layout][0](config)
  if layout == 'naflex':  # the table's grid is the weights'
    settings['pos_embed_grid_size'] = convert_naflex.grid_of(state)
  return _from_vit(state, settings, weights, model_name,
                   layout=layout, family=_family(config),
                   transform=dict(config.get('pretrained_cfg') or {}))


# timm's model classes computed as a ViT: config.json's settings, vit_jax's
# model config of them, the state dict in timm ViT's names.
_LAYOUTS = {
    'vit': (timm_settings, vit_overrides, lambda state: state),
    'eva': (convert_eva.eva_settings, convert_eva.eva_overrides,
            convert_eva.to_vit_state),
    'beit': (convert_beit.beit_settings, convert_beit.beit_overrides,
             convert_beit.to_vit_state),
    'naflex': (convert_naflex.naflex_settings, convert_naflex.naflex_overrides,
               convert_naflex.to_vit_state),
    'intern': (convert_internvit.timm_settings, convert_internvit.overrides,
               lambda state: state),
    'aimv2': (convert_aimv2.aimv2_settings, convert_aimv2.aimv2_overrides,
              convert_aimv2.to_vit_state),
}


def _from_vit(state: Flat, settings, weights: str, model_name, *,
              layout='vit', family=None, transform=None) -> Source:
  """timm's ViT (Eva, Beit) state dict, computing as `settings` say."""
  overrides = _LAYOUTS[layout][1](settings)
  _check_width(settings, state, weights)
  state = _LAYOUTS[layout][2](state)
  state = _fc_norm_as_final(state, overrides['classifier'] in (
      'token', 'distilled') and (uses_fc_norm(settings) if layout == 'vit'
                                 else 'fc_norm.weight' in state))
  flat = timm_to_npz(state, settings['num_heads'], overrides.get('map_heads'))
  qkv_bias = overrides['transformer'].get('qkv_bias', 'qkv')
  if layout in ('eva', 'beit'):
    flat = convert_eva.drop_biases(flat, qkv_bias)
  _check_complete(flat, weights, overrides, layout)
  _check_config_dims(settings, flat, weights, layout)
  if model_name is None:
    try:
      model_name = infer_preset(flat, settings['num_heads'],
                                overrides['classifier'], family=family,
                                overrides=overrides)
    except ValueError:
      if family not in (None, registry.FAMILIES[registry.DEFAULT]) or (
          not _plain(flat)):
        raise
      return Source(flat, CUSTOM, _custom_vit(flat, settings, overrides),
                    dict(transform or {}))
  check_preset(flat, model_name, settings['num_heads'])
  return Source(flat, model_name, differences(model_name, overrides),
                dict(transform or {}))


# The name of a ViT that no preset has the shapes of (e.g. the default
# job's, written in transformers' layout and read back): its record holds
# the whole model.
CUSTOM = 'ViT-custom'


def _plain(flat: Flat) -> bool:
  """A plain ViT's names: no hybrid stem, distillation token, SwiGLU."""
  d = dims(flat)
  return not (d['resnet'] or d['dist_token'] or d['swiglu'] or
              d['relative_bias'])


def _custom_vit(flat: Flat, settings, overrides) -> Dict[str, Any]:
  """The whole model config of a plain ViT of these shapes."""
  d = dims(flat)
  pre_logits = flat.get('pre_logits/kernel')
  model = {'patches': {'size': list(d['patch'])}, 'hidden_size': d['width'],
           'representation_size': (None if pre_logits is None else
                                   pre_logits.shape[-1]),
           'transformer': {'mlp_dim': d['mlp_dim'], 'num_layers': d['depth'],
                           'num_heads': settings['num_heads']}}
  return transform.merged(model, overrides)


# The family of each kind of transformers' image tower.
_TRANSFORMERS_FAMILIES = {'vit': 'ViT', 'deit': 'DeiT', 'dinov2': 'DINOv2',
                          'mae': 'MAE', 'clip': 'CLIP', 'siglip': 'SigLIP',
                          'siglip2': 'SigLIP 2 NaFlex', 'swin': 'Swin',
                          'internvl': 'InternViT', 'aimv2': 'AIMv2'}


def _from_transformers(state: Flat, config, weights: str,
                       model_name: Optional[str]) -> Source:
  """A transformers checkpoint: its image tower, as timm's model computing
  the same, the eval transform from preprocessor_config.json; a two-tower
  model in full unless `model_name` names an image preset."""
  if convert_sam.is_transformers_sam(config):  # no timm's layout of it
    return _from_transformers_sam(state, config, weights, model_name)
  if convert_dpt.is_dpt(config):  # a depth model: a backbone and DPT's head
    return _from_dpt(state, config, weights, model_name)
  arch = transformers_layout.architecture(config)
  if convert_timesformer.is_timesformer(config):  # a video model: no timm's
    return _from_timesformer(state, config, weights, model_name)
  timm_state, extra, dropped = transformers_layout.to_timm(state, config)
  towers = arch in transformers_layout.TWO_TOWERS and (
      model_name is None or registry.model_class(model_name) is lit.LitModel)
  if transformers_layout.kind(config) in transformers_video.KINDS:
    image = Source(*transformers_video.read(timm_state, extra, config,
                                            weights, model_name))
  else:
    image = _tower_source(timm_state, extra, config, weights,
                          None if towers else model_name)
  if towers:
    return _two_towers(state, config, image, model_name)
  if dropped:
    what = ('the text tower, projection and temperature' if arch in
            transformers_layout.TWO_TOWERS else
            "pre-training's " + ', '.join(sorted({d.split('.')[0] for d in
                                                  dropped})))
    tower = ('encoder' if transformers_layout.kind(config) in
             transformers_video.KINDS else 'image tower')
    print(f"Note: {weights} is transformers' {arch}: converting the "
          f'{tower}, without {what} ({len(dropped)} names).', file=sys.stderr)
  return image


def _from_timesformer(state: Flat, config, weights: str,
                      model_name: Optional[str]) -> Source:
  """transformers' TimeSformer, by vit_jax's names directly."""
  config = convert_timesformer.complete(config)
  model = convert_timesformer.model_config(config)
  flat = convert_timesformer.to_npz(state, config)
  name, overrides = convert_timesformer.preset(model, registry.MODEL_CONFIGS,
                                               model_name)
  return Source(flat, name, overrides, convert_timesformer.eval_transform(
      os.path.dirname(weights), config))


def _from_transformers_sam(state: Flat, config, weights: str,
                           model_name: Optional[str]) -> Source:
  """transformers' SamVisionModel, or SamModel's vision encoder."""
  state = convert_sam.transformers_to_timm(
      state, config['architectures'][0], weights)
  flat = convert_sam.timm_to_npz(state)
  source = _from_sam(flat, convert_sam.transformers_settings(config),
                     weights, model_name, {})
  processor = transformers_defaults.read_processor(os.path.dirname(weights))
  return source._replace(transform=convert_sam.eval_transform(
      convert_sam.shapes(flat)['image_size'], processor, weights))


def _from_sam(flat: Flat, settings, weights: str,
              model_name: Optional[str], pretrained_cfg) -> Source:
  """SAM's image encoder by vit_jax's names, computing as `settings` say."""
  model = convert_sam.model_config(flat, settings, weights)
  name, overrides = convert_sam.preset(model, model_name)
  return Source(flat, name, overrides, pretrained_cfg)


def _from_dpt(state: Flat, config, weights: str,
               model_name: Optional[str]) -> Source:
  """transformers' Depth Anything or DPT: the backbone as the tower it is
  (a preset of its family, else the whole model in the record), the neck
  and head as `DPTHead`'s (`dpt/`), the record's `dpt` what builds them."""
  tower_state, tower, head, dpt = convert_dpt.split(state, config)
  tower = transformers_defaults.complete_config(tower)
  timm_state, extra, _ = transformers_layout.to_timm(tower_state, tower)
  kind = transformers_layout.kind(tower)
  transform = dict(convert_dpt.eval_transform(os.path.dirname(weights),
                                              config), dpt=dpt)
  # The table resized to each input as transformers does.
  transform['posemb_resize'] = ('bicubic_torch' if kind == 'dinov2' else
                                'bilinear_torch')
  settings = transformers_config.vit_settings(tower)
  family = registry.FAMILIES[_TRANSFORMERS_FAMILIES[kind]]
  try:
    source = _from_vit(timm_state, settings, weights, model_name,
                       family=family, transform=transform)
  except ValueError:  # no preset of its family: a custom ViT
    if model_name is not None:
      raise
    source = _from_vit(timm_state, settings, weights, None, transform=transform)
  return source._replace(flat={**source.flat, **extra, **head})


def _tower_source(timm_state: Flat, extra: Flat, config, weights: str,
                  model_name: Optional[str]) -> Source:
  """The image tower of `config`, renamed to timm's (`timm_state`)."""
  kind = transformers_layout.kind(config)
  family = registry.FAMILIES[_fixed_siglip2(weights) if kind == 'siglip'
                             else _TRANSFORMERS_FAMILIES[kind]]
  transform = _transformers_transform(weights, config, family)
  if kind == 'swin':
    transformers_config.swin_settings(config)  # refuses what it cannot
    source = _from_swin(timm_state, {}, model_name)
    return source._replace(transform=transform)
  if kind == 'aimv2':  # not a ViT's settings: read on their own
    settings, layout = convert_aimv2.transformers_settings(
        transformers_layout.vision_config(config)), 'aimv2'
  else:
    settings, layout = transformers_config.vit_settings(config), 'vit'
  if kind == 'internvl':
    layout = 'intern'
    settings = convert_internvit.transformers_settings(
        transformers_layout.vision_config(config), settings)
  source = _from_vit(timm_state, settings, weights, model_name,
                     layout=layout, family=family, transform=transform)
  return source._replace(flat={**source.flat, **extra})


def _fixed_siglip2(weights: str) -> str:
  """The family of a `SiglipModel` folder: SigLIP 2's fixed-size towers
  where it holds Gemma's tokenizer (`tokenizer.model`) and not SigLIP's
  (`spiece.model`), as the hub's google/siglip2-*-224 and its siblings;
  else SigLIP's."""
  folder = os.path.dirname(weights)
  gemma = os.path.exists(os.path.join(folder, _VOCABULARIES['gemma'])) and (
      not os.path.exists(os.path.join(folder, _VOCABULARIES['siglip'])))
  return 'SigLIP 2' if gemma else _TRANSFORMERS_FAMILIES['siglip']


def _two_towers(state: Flat, config, image: Source,
                model_name: Optional[str]) -> Source:
  """CLIPModel or SiglipModel in full: the `image` tower (CLIP's projection
  its head) under `img`, the text tower under `txt`, `t` and `b`; the
  preset `IMAGE-towers` (or `model_name`) with what differs."""
  text, fields, extras = transformers_text.text_tower(state, config)
  name = model_name or f'{image.model_name}-towers'
  if name not in registry.MODEL_CONFIGS:
    raise ValueError(f"transformers' {config['architectures'][0]}: its image "
                     f'tower is {image.model_name}, which has no two-tower '
                     f'preset {name}.')
  preset = registry.MODEL_CONFIGS[name].to_dict()
  has_head = 'head/kernel' in image.flat
  model = dict(
      image=transform.model_config(preset['image'], {'model': image.overrides}),
      text=dict(preset['text'], **fields),
      out_dim=(image.flat['head/kernel'].shape[-1] if has_head else None,
               extras['out_dim']),
      pp=dict(preset['pp'], max_len=extras['max_len'],
              size=transformers_layout.vision_config(config).get(
                  'image_size') or image.transform['input_size'][-1]),
      bias_init=preset['bias_init'] if extras['b'] is not None else None)
  flat = {**{f'img/{k}': v for k, v in image.flat.items()},
          **{f'txt/{k}': v for k, v in text.items()}, 't': extras['t']}
  if extras['b'] is not None:
    flat['b'] = extras['b']
  return Source(flat, name, transform.model_overrides(preset, model),
                image.transform)


def _transformers_transform(weights: str, config, family):
  """preprocessor_config.json's eval transform (timm's keys), and how the
  table is resized: transformers' DINOv2 resizes it to each input with
  torch's plain bicubic (its registers' twin antialiases, as timm)."""
  processor = transformers_defaults.read_processor(os.path.dirname(weights))
  if processor is not None:
    out = transformers_config.eval_transform(processor)
  else:
    vision = transformers_layout.vision_config(config)
    side = vision.get('image_size') or (  # NaFlex: its table's square image
        math.isqrt(vision.get('num_patches', 196)) * vision['patch_size'])
    if isinstance(side, (list, tuple)):  # InternVL's (height, width)
      side = side[0]
    print(f'Note: no preprocessor_config.json beside {weights}: assuming '
          f'{side} x {side} bicubic and the family\'s mean and std.',
          file=sys.stderr)
    mean, std = family.input_normalization
    out = dict(input_size=[3, side, side], crop_pct=1.0, crop_mode='squash',
               interpolation='bicubic', mean=list(mean), std=list(std))
  if transformers_layout.architecture(config) in ('Dinov2Model',
                                                  'InternVLVisionModel'):
    out['posemb_resize'] = 'bicubic_torch'
  return out


def _check_width(settings, state: Flat, path: str) -> None:
  """config.json's width is the weights' (before heads split them)."""
  kernel = state.get('patch_embed.proj.weight')
  if kernel is not None and kernel.shape[0] != settings['embed_dim']:
    raise ValueError(f"{path}'s config.json does not describe its weights: "
                     f"it says width {settings['embed_dim']} (weights: "
                     f'{kernel.shape[0]}).')


def _family(config: Dict[str, Any]) -> Optional[registry.Family]:
  """The family that claims timm's architecture (MAE's encoder has a plain
  ViT's: timm's pretrained tag tells); None: any ViT preset."""
  tag = (config.get('pretrained_cfg') or {}).get('tag') or ''
  return registry.timm_family(config['architecture'], tag)


def _from_swin(state: Flat, config: Dict[str, Any],
               model_name: Optional[str]) -> Source:
  """A timm Swin, its bias tables resized to the preset's window."""
  flat = convert_swin.timm_to_npz(state)
  model_name = convert_swin.preset(flat, model_name)
  window = registry.MODEL_CONFIGS[model_name].window_size
  return Source(convert_swin.fit_window(flat, window), model_name, {},
                dict(config.get('pretrained_cfg') or {}))


def _from_bare(weights: str, state: Flat, model_name: Optional[str]
               ) -> Source:
  """A state dict alone: timm's defaults, the heads of the preset."""
  # timm's default pooling for a class token is 'token', where fc_norm (set
  # explicitly) acts as the final norm; without one, 'avg' (fc_norm then).
  state = _fc_norm_as_final(state, 'cls_token' in state)
  _check_bare(state, weights)
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
  heads = registry.MODEL_CONFIGS[model_name].transformer.num_heads
  flat = timm_to_npz(state, heads)
  _check_complete(flat, weights)
  print(f"Note: no config.json beside {weights}: assuming timm's defaults "
        "(global_pool='token' with a class token, 'avg' without fc_norm "
        "without one; exact GELU; the eval transform of timm's "
        "resolve_data_config: center crop 0.875, bicubic, ImageNet's mean "
        f'and std) and the {heads} heads of {model_name}; put '
        "timm's config.json beside it, or pass --model_name.",
        file=sys.stderr)
  shapes = dims(flat)
  overrides = {'classifier': token_classifier(flat),
               'fc_norm': 'fc_norm/scale' in flat,
               'num_registers': shapes['registers'],
               'posemb_prefix': shapes['posemb_prefix'],
               'transformer': {'gelu_approximate': False,
                               'swiglu': shapes['swiglu'],
                               # Only an init: the weights hold the scales.
                               'layerscale_init': 1e-5 if shapes['layerscale']
                                                  else None}}
  return Source(flat, model_name, differences(model_name, overrides), {})


# What only config.json can say how to compute (its settings beside them).
_NEEDS_CONFIG = {'blocks.0.attn.relative_position_bias_table':
                     "timm's Beit (BEiT: its pooling)",
                 'rel_pos_bias.relative_position_bias_table':
                     "timm's Beit (BEiT: its pooling)",
                 'norm_pre.weight': 'a pre-norm (CLIP: eps, QuickGELU?)',
                 'blocks.0.attn.q_norm.weight':
                     'a query/key norm (per head, or across the heads?)',
                 'attn_pool.latent': 'attention pooling (SigLIP: its GELU)',
                 'blocks.0.gamma_1': "timm's Eva (EVA-02, DINOv3: RoPE)",
                 'blocks.0.attn.q_bias': "timm's Eva (EVA-02, DINOv3: RoPE)",
                 'patch_embed.norm.weight': 'a normalized patch embedding '
                                            "(AIMv2: RMSNorm's eps)"}


def _check_bare(state: Flat, path: str) -> None:
  for key, what in _NEEDS_CONFIG.items():
    if key in state:
      raise ValueError(f'{path} has {key!r}: {what}, whose settings only '
                       "timm's config.json says; put it beside the weights.")


def _check_complete(flat: Flat, path: str,
                    overrides: Optional[Dict[str, Any]] = None,
                    layout: str = 'vit') -> None:
  overrides = overrides or {}
  transformer = overrides.get('transformer', {})
  missing = convert_aimv2.missing_keys(flat) if layout == 'aimv2' else (
      missing_keys(
      flat, patch_bias=overrides.get('patch_bias', True),
      final_norm=transformer.get('final_norm', True),
      norm_bias=transformer.get('norm', 'layer') == 'layer',
      position_table=overrides.get('posemb', 'learn') == 'learn',
      qkv_biases=QKV_BIASES[transformer.get('qkv_bias', 'qkv')],
      relative_bias=transformer.get('relative_bias')))
  if missing:
    raise ValueError(f'{path} lacks what a vit_jax ViT has: '
                     f'{", ".join(missing[:6])} (timm: qkv_bias=False or '
                     'pre_norm=True?).')


def _check_posembed(flat: Flat, path: str) -> None:
  """Whether the table has the prefix tokens' entries must show."""
  if posemb_prefix(flat) is None:
    tokens = flat['Transformer/posembed_input/pos_embedding'].shape[1]
    raise ValueError(f'{path}: its {tokens} position embeddings do not say '
                     'whether they have entries for the class (and register) '
                     "tokens (timm's no_embed_class): put timm's config.json "
                     'beside it.')


def _record(dst: str, source: Source) -> None:
  """The eval transform and the model's settings, beside `dst` (replacing
  any record of the file that `dst` replaces). What the source does not say
  is timm's default (`resolve_data_config`'s): center crop 0.875, bicubic,
  ImageNet's mean and std."""
  sidecar = dict(transform.TIMM_DEFAULTS, **source.transform,
                 model_name=source.model_name)
  if source.overrides:
    sidecar['model'] = source.overrides
  path = transform.transform_path(dst)
  transform.save_transform(dst, sidecar)
  if source.overrides:
    print(f'Note: {dst} is {source.model_name} with '
          f'{", ".join(flags(source.overrides))}, as its source computes it; '
          f'{path.name} records them for predict '
          '(transform.model_config).', file=sys.stderr)


# A two-tower folder's tokenizer file, by the tokenizer its preset reads
# (`pp.tokenizer_name`): CLIP's, SigLIP's, SigLIP 2's (Gemma's).
_VOCABULARIES = {'clip': 'tokenizer.json', 'siglip': 'spiece.model',
                 'gemma': 'tokenizer.model'}


def _copy_vocabulary(src: str, dst: str, tokenizer_name: str) -> None:
  """The tokenizer of a two-tower folder, beside `dst` as NAME.FILE, and
  named in the record (`vocab`), which the zero-shot evaluator reads."""
  folder = src if os.path.isdir(src) else os.path.dirname(src)
  name = _VOCABULARIES.get(tokenizer_name)
  if name is None or not os.path.exists(os.path.join(folder, name)):
    print(f'Note: {folder} holds no {name or tokenizer_name} tokenizer: set '
          'config.lit.vocab_path for text.', file=sys.stderr)
    return
  shutil.copyfile(os.path.join(folder, name), transform.beside(dst, name))
  record = transform.load_transform(dst)
  transform.save_transform(dst, dict(record, vocab=name))


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


def convert(src: str, dst: str, model_name: str = None,
            layout: str = 'timm') -> str:
  """Converts `src` to `dst`, by their extensions; an .npz to a
  transformers folder with layout 'transformers'. Returns the preset."""
  if layout not in export.LAYOUTS:
    raise ValueError(cli.closest(layout, export.LAYOUTS, 'layout'))
  if os.path.isdir(src) and not hub.is_convertible(src):
    src = _workdir_export(src)
  recorded = (records.read(src) or {}) if src.endswith('.npz') else {}
  built = ('DPT' if 'dpt' in recorded and layout != 'transformers' else
           recorded.get('model_class'))
  if built in _NO_LAYOUT:
    raise ValueError(f'{src} holds a {built}, which has no timm or '
                     f'transformers layout here: {_NO_LAYOUT[built]}')
  if layout == 'transformers':
    if not src.endswith('.npz'):
      raise ValueError(f'--layout=transformers writes an .npz as a '
                       f'transformers folder; {src} is no .npz.')
    return export.to_transformers(src, dst, model_name)
  _check_destination(src, dst)
  if src.endswith('.npz'):
    return export.to_timm(src, dst, model_name)
  if not os.path.exists(src) and re.fullmatch(r'[\w.-]+/[\w.-]+', src):
    src = hub.fetch(src)
  source = from_timm(src, model_name)
  files.save(traverse_util.unflatten_dict(source.flat, sep='/'), dst)
  _record(dst, source)
  if registry.model_class(source.model_name) is lit.LitModel:
    _copy_vocabulary(src, dst, registry.MODEL_CONFIGS[
        source.model_name].pp.tokenizer_name)
  return source.model_name


# Exports that neither layout holds, and what takes them instead.
_NO_LAYOUT = {'ViViT': "evaluate it with trainer='video'.",
              'NaViT': "evaluate it with trainer='evaluate' and its config.",
              'LinearSegmenter': "evaluate it with trainer='segmentation'.",
              'DPT': 'write it with --layout=transformers, or predict depth '
                     'with `python -m vit_jax.predict --task=depth`.'}


def _workdir_export(src: str) -> str:
  """A training workdir's export (its .npz, with its record)."""
  path, _ = records.resolve(src)
  if not path.endswith('.npz'):
    raise ValueError(f'{src} holds no export (`{{model_name}}.npz`): '
                     'convert the one a finished run writes.')
  return path


def as_npz(src: str, model_name: Optional[str] = None) -> str:
  """`src` as a published .npz with its record: itself if it is none of
  `is_convertible`'s, else converted once into `hub.cache_dir()` (a new
  conversion when the files change)."""
  src = os.fspath(src)
  if not hub.is_convertible(src):
    return src
  if not os.path.exists(src):
    src = hub.fetch(src)
  weights, config = locate(src)
  key = [os.path.abspath(weights), model_name or '']
  for path in (weights, config, os.path.join(os.path.dirname(weights),
                                             'preprocessor_config.json')):
    if path and os.path.exists(path):
      stat = os.stat(path)
      key += [path, stat.st_size, stat.st_mtime_ns]
  digest = hashlib.sha1(repr(key).encode()).hexdigest()[:12]
  stem = os.path.basename(os.path.normpath(os.path.dirname(weights)))
  dst = os.path.join(hub.cache_dir(), f'{stem}-{digest}.npz')
  if not os.path.exists(dst):
    os.makedirs(hub.cache_dir(), exist_ok=True)
    # The record first, then the .npz by rename: a .npz here is complete.
    partial = f'{dst[:-4]}.partial-{os.getpid()}.npz'
    convert(src, partial, model_name)
    for name in (*_VOCABULARIES.values(), 'transform.json'):  # beside it
      if os.path.exists(transform.beside(partial, name)):
        os.replace(transform.beside(partial, name),
                   transform.beside(dst, name))
    os.replace(partial, dst)
    print(f'Note: {src} converted to {dst}.', file=sys.stderr)
  return dst


def checkpoint_and_record(src, model_name: Optional[str] = None):
  """(checkpoint, record) of any source by its path alone: `as_npz`'s
  file, or a training workdir's export (`records.resolve`)."""
  return records.resolve(as_npz(src, model_name))
