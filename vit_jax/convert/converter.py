"""Reading timm's checkpoints (a folder, a weights file, a hub name) and
converting them to the published .npz and back; the record beside it."""

import importlib
import json
import math
import os
import re
import sys
from typing import Any, Dict, NamedTuple, Optional

from flax import traverse_util
import numpy as np

from vit_jax import checkpoint
from vit_jax import cli
from vit_jax import models
from vit_jax.convert import eva as convert_eva
from vit_jax.convert import swin as convert_swin
from vit_jax.convert import transform as preprocess
from vit_jax.convert.names import missing_keys
from vit_jax.convert.names import npz_to_timm
from vit_jax.convert.names import timm_to_npz
from vit_jax.convert.timm_config import mlp_settings
from vit_jax.convert.timm_config import timm_settings
from vit_jax.convert.timm_config import uses_fc_norm
from vit_jax.convert.timm_config import vit_overrides
from vit_jax.models.attention import QKV_BIASES
from vit_jax.models.encoder import Encoder

Flat = Dict[str, np.ndarray]


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
      mlp_norm='Transformer/encoderblock_0/MlpBlock_3/norm/scale' in flat,
      layerscale='Transformer/encoderblock_0/ls1/scale' in flat,
      registers=flat['reg'].shape[1] if 'reg' in flat else 0,
      posemb_prefix=_posemb_prefix(flat),
      position_table='Transformer/posembed_input/pos_embedding' in flat,
      pre_norm='Transformer/norm_pre/scale' in flat,
      patch_bias='embedding/bias' in flat,
      qkv_bias=convert_eva.qkv_bias_of(flat),
      map_head='MAPHead_0/probe' in flat)


_OPTIONS = ('swiglu', 'mlp_norm', 'layerscale', 'registers', 'posemb_prefix')


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
              mlp_norm=bool(transformer.get('mlp_norm')),
              layerscale=transformer.get('layerscale_init') is not None,
              registers=config.get('num_registers') or 0,
              posemb_prefix=config.get('posemb_prefix', True),
              position_table=config.get('posemb', 'learn') == 'learn',
              pre_norm=bool(transformer.get('pre_norm')),
              patch_bias=config.get('patch_bias', True),
              qkv_bias=transformer.get('qkv_bias', 'qkv'),
              map_head=config.classifier == 'map')


def _misfits(name: str, want: Dict[str, Any]) -> list:
  """'what (preset: value)' for each of `want` that preset `name` lacks."""
  have = _preset_dims(name)
  return [f'{key} {value} ({name}: {have.get(key)})'
          for key, value in want.items() if have.get(key) != value]


def infer_preset(flat: Flat, heads: Optional[int] = None,
                 classifier: Optional[str] = None,
                 family: str = '',
                 overrides: Optional[Dict[str, Any]] = None) -> str:
  """The preset (its name starting with `family`) whose shapes (and
  `heads`) these published names have, and the fewest model options
  (`_OPTIONS`) to override; of several, the one with `classifier`
  (default: a class token's or 'gap'), then the one that the fewest
  `overrides` (timm's settings) differ from."""
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
  return min(same or found, key=lambda name: (
      len(misfits[name]),
      len(_flags(_differences(name, overrides))) if overrides else 0))


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


def _check_config_dims(settings, flat: Flat, path: str, eva: bool) -> None:
  """config.json and the weights must describe the same model."""
  have = _dims(flat)
  patch = settings['patch_size']
  patch = tuple(patch) if isinstance(patch, (list, tuple)) else (patch,) * 2
  hidden = int(settings['embed_dim'] * settings['mlp_ratio'])
  if eva:  # Eva's SwiGLU halves are each `hidden` wide
    swiglu, mlp_dim = settings['swiglu_mlp'], hidden
    registers = settings['num_reg_tokens']
  else:
    swiglu = mlp_settings(settings)['swiglu']
    mlp_dim, registers = hidden // 2 if swiglu else hidden, settings[
        'reg_tokens']
  said = dict(width=settings['embed_dim'], depth=settings['depth'],
              patch=patch, mlp_dim=mlp_dim, swiglu=swiglu,
              layerscale=settings['init_values'] is not None,
              registers=registers)
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
  if 'architecture' not in config:
    raise ValueError("config.json names no 'architecture': it is not timm's.")
  eva = convert_eva.is_eva(config['architecture'])
  settings = (convert_eva.eva_settings if eva else timm_settings)(config)
  overrides = (convert_eva.eva_overrides if eva else vit_overrides)(settings)
  if eva:
    state = convert_eva.to_vit_state(state)
  state = _fc_norm_as_final(state, overrides['classifier'] in (
      'token', 'distilled') and (
          uses_fc_norm(settings) if not eva else 'fc_norm.weight' in state))
  flat = timm_to_npz(state, settings['num_heads'])
  qkv_bias = overrides['transformer'].get('qkv_bias', 'qkv')
  if eva:
    flat = convert_eva.drop_biases(flat, qkv_bias)
  _check_complete(flat, weights, overrides)
  _check_config_dims(settings, flat, weights, eva)
  model_name = model_name or infer_preset(
      flat, settings['num_heads'], overrides['classifier'],
      family=_family(config), overrides=overrides)
  check_preset(flat, model_name, settings['num_heads'])
  return Source(flat, model_name, _differences(model_name, overrides),
                dict(config.get('pretrained_cfg') or {}))


def _family(config: Dict[str, Any]) -> str:
  """The preset family of timm's architecture (MAE's encoder has a plain
  ViT's: timm's pretrained tag tells)."""
  name = config['architecture']
  tag = (config.get('pretrained_cfg') or {}).get('tag') or ''
  for pattern, family in ((r'.*_clip(_quickgelu)?_\d+', 'CLIP-'),
                          (r'.*_siglip(_gap)?_\d+', 'SigLIP-'),
                          (r'eva02_.*', 'EVA02-'), (r'.*_dinov3\w*', 'DINOv3-')):
    if re.fullmatch(pattern, name):
      return family
  return 'MAE-' if tag.startswith('mae') else ''


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


def _check_complete(flat: Flat, path: str,
                    overrides: Optional[Dict[str, Any]] = None) -> None:
  overrides = overrides or {}
  missing = missing_keys(
      flat, patch_bias=overrides.get('patch_bias', True),
      position_table=overrides.get('posemb', 'learn') == 'learn',
      qkv_biases=QKV_BIASES[
          overrides.get('transformer', {}).get('qkv_bias', 'qkv')])
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
  for key, value in overrides.get('transformer', {}).items():
    # A field the preset lacks is the Encoder's default.
    preset['transformer'].setdefault(
        key, Encoder.__dataclass_fields__[key].default)
  for key in overrides:
    if key not in preset and key in models.VisionTransformer.__dataclass_fields__:
      preset[key] = models.VisionTransformer.__dataclass_fields__[key].default
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


def _is_eva_preset(name: str) -> bool:
  """Whether timm builds the preset `name` with its Eva (`convert.eva`)."""
  return name.startswith(('EVA02-', 'DINOv3-'))


def _to_eva(flat: Flat) -> Flat:
  """Published names -> the state dict of timm's Eva (EVA-02-B/L's
  projections and SwiGLU apart, as its MLP's inner norm shows)."""
  qkv_bias = convert_eva.qkv_bias_of(flat)
  state = npz_to_timm(convert_eva.with_zero_biases(flat))
  fused = not any(k.endswith('MlpBlock_3/norm/scale') for k in flat)
  return convert_eva.from_vit_state(state, fused=fused, qkv_bias=qkv_bias)


def convert(src: str, dst: str, model_name: str = None) -> str:
  """Converts `src` to `dst`, by their extensions; returns the preset."""
  _check_destination(src, dst)
  if src.endswith('.npz'):
    params = checkpoint.load(src)
    if 'img' in params and 'txt' in params:  # LiT's, big_vision's SigLIP
      print(f'Note: {src} holds two towers: converting the image tower '
            '(img).', file=sys.stderr)
      params = params['img']
    flat = checkpoint.published_flat(params)
    swin = convert_swin.is_swin(flat)
    model_name = model_name or (convert_swin.preset(flat) if swin else
                                infer_preset(flat))
    state = (convert_swin.npz_to_timm(flat) if swin else
             _to_eva(flat) if _is_eva_preset(model_name) else
             npz_to_timm(flat))
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
