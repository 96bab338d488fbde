"""An .npz in another layout: timm's state dict (`to_timm`) or a
transformers folder (`to_transformers`), with the record's settings."""

import importlib
import json
import os
import sys
from typing import Any, Dict, Optional

import numpy as np

from vit_jax.checkpoints import files
from vit_jax.convert import aimv2 as convert_aimv2
from vit_jax.convert import dpt as convert_dpt
from vit_jax.convert import eva as convert_eva
from vit_jax.convert import swin as convert_swin
from vit_jax.convert import timesformer as convert_timesformer
from vit_jax.convert import transform
from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_layout
from vit_jax.convert import transformers_video
from vit_jax.convert.names import npz_to_timm
from vit_jax.convert.preset_inference import infer_preset
from vit_jax.models import registry
from vit_jax.models import vivit

Flat = Dict[str, np.ndarray]

LAYOUTS = ('timm', 'transformers')


def optional_import(module: str, path: str):
  """`module`, or a ModuleNotFoundError saying how to install it."""
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"Reading {path} needs {module.split('.')[0]}: pip install -e "
        "'.[convert]'") from e


def _is_eva_preset(name: str) -> bool:
  """Whether timm builds the preset `name` with its Eva (`convert.eva`) or
  Beit (`convert.beit`), whose blocks have the same names."""
  return registry.family(name).timm_layout in ('eva', 'beit')


def _to_eva(flat: Flat) -> Flat:
  """Published names -> the state dict of timm's Eva or Beit (EVA-02-B/L's
  projections and SwiGLU apart, as its MLP's inner norm shows)."""
  qkv_bias = convert_eva.qkv_bias_of(flat)
  state = npz_to_timm(convert_eva.with_zero_biases(flat))
  fused = not any(k.endswith('MlpBlock_3/norm/scale') for k in flat)
  return convert_eva.from_vit_state(state, fused=fused, qkv_bias=qkv_bias)


def _is_aimv2_preset(name: str) -> bool:
  return (name in registry.MODEL_CONFIGS and
          registry.family(name).timm_layout == 'aimv2')


def _to_aimv2(flat: Flat) -> Flat:
  """Published names -> the state dict of timm's AIMv2."""
  return convert_aimv2.from_vit_state(npz_to_timm(flat))


def _npz_flat(src: str) -> Flat:
  """The published names of an .npz (of a two-tower one's image tower)."""
  params = files.load(src)
  if 'img' in params and 'txt' in params:  # LiT's, big_vision's SigLIP
    print(f'Note: {src} holds two towers: converting the image tower '
          '(img).', file=sys.stderr)
    params = params['img']
  return files.published_flat(params)


def _npz_preset(flat: Flat) -> str:
  """The preset that published names have the shapes of."""
  return (convert_swin.preset(flat) if convert_swin.is_swin(flat) else
          infer_preset(flat))


def _timm_state(flat: Flat, model: Dict[str, Any]):
  """(timm's state dict of published names, those that timm has no name
  for: `pre_logits`); a Swin's bias tables at `model`'s window."""
  extra = {k: v for k, v in flat.items()
           if k.startswith(('pre_logits/', 'KVPoolHead_0/'))}
  rest = {k: v for k, v in flat.items() if k not in extra}
  if convert_swin.is_swin(flat):
    rest = convert_swin.fit_window(rest, model['window_size'])
    return convert_swin.npz_to_timm(rest), extra
  if model.get('patch_norm'):  # AIMv2's
    return _to_aimv2(rest), extra
  return npz_to_timm(rest), extra


def _eval_transform(name: str, record: Dict[str, Any],
                    normalization) -> transform.Transform:
  """The transform that predict applies to the checkpoint: its record's,
  else the preset's `normalization` at its native side."""
  side = (transform.recorded_size(record) or
          registry.native_resolution(name) or 224)
  return transform.resolve(side, record, normalization)


def _write_folder(dst: str, config, weights: Flat, processor,
                  processor_file='preprocessor_config.json') -> None:
  """A transformers folder: config.json, model.safetensors (float32, torch's
  layout) and the processor's file."""
  save_file = optional_import('safetensors.numpy', dst).save_file
  os.makedirs(dst, exist_ok=True)
  save_file({k: np.ascontiguousarray(v, np.float32)
             for k, v in weights.items()},
            os.path.join(dst, 'model.safetensors'), metadata={'format': 'pt'})
  for name, content in (('config.json', config),
                        (processor_file, processor)):
    with open(os.path.join(dst, name), 'w') as f:
      f.write(json.dumps(content, indent=2, sort_keys=True) + '\n')


def to_transformers(src: str, dst: str, model_name: Optional[str]) -> str:
  """Writes the .npz `src` as the transformers folder `dst` (nothing when
  transformers cannot compute it); returns the preset: `model_name`, else
  the record's, else inferred from the shapes."""
  if os.path.exists(dst) and not os.path.isdir(dst):
    raise ValueError(f'{dst}: --layout=transformers writes a folder, and '
                     'this is a file.')
  flat = _npz_flat(src)
  record = transform.load_transform(src) or {}
  name = model_name or record.get('model_name') or _npz_preset(flat)
  model, normalization = transform.preset_settings(name, record)
  if 'dpt' in record:  # a depth model: backbone, neck and head
    return _dpt_to_transformers(dst, name, model, flat, record['dpt'],
                                _eval_transform(name, record, normalization))
  if 'attention_type' in model:  # a TimeSformer: renamed on its own
    spec = _eval_transform(name, record, normalization)
    config = convert_timesformer.config_json(model, flat, spec.size)
    _write_folder(dst, config, convert_timesformer.from_npz(flat, config),
                  convert_timesformer.processor_json(
                      transformers_config.preprocessor_json(spec)),
                  'video_preprocessor_config.json')
    return name
  if 'image' in model:  # a two-tower model: its image tower (`_npz_flat`)
    model = dict(model['image'])
    name = model.get('model_name') or name
  if registry.model_class(name, model) is vivit.ViViT:  # clips
    return _video_to_transformers(dst, name, model, flat, record,
                                  _eval_transform(name, record, normalization))
  arch = transformers_config.export_architecture(name, model, flat)
  spec = _eval_transform(name, record, normalization)
  config = transformers_config.config_json(arch, model, flat, spec.size)
  if arch == 'InternVLVisionModel':  # `from_timm` drops them again
    flat = convert_eva.with_zero_biases(flat)
  weights = transformers_layout.from_timm(*_timm_state(flat, model), config)
  if arch == 'Siglip2VisionModel':  # NaFlex: a budget of patches
    patch = model['patches']['size'][0]
    processor = transformers_config.naflex_preprocessor_json(
        spec, patch, record.get('max_num_patches') or (spec.size // patch)**2)
  else:
    processor = transformers_config.preprocessor_json(spec)
  _write_folder(dst, config, weights, processor)
  if arch == 'ViTModel' and 'pre_logits/kernel' not in flat:
    print(f'Note: {dst} is a ViTModel without a pooler: load it with '
          'add_pooling_layer=False.', file=sys.stderr)
  return name


def _dpt_to_transformers(dst, name, model, flat, dpt, spec) -> str:
  """`to_transformers` of a depth model (`convert.dpt`): the backbone as
  its tower, the neck and head by transformers' names."""
  head = {k[len('dpt/'):]: v for k, v in flat.items() if k.startswith('dpt/')}
  flat = {k: v for k, v in flat.items() if not k.startswith('dpt/')}
  tower = transformers_config.config_json(
      convert_dpt.tower_architecture(dpt), model, flat, spec.size)
  weights = transformers_layout.from_timm(*_timm_state(flat, model), tower)
  config, state = convert_dpt.to_transformers(tower, weights, head, dpt)
  _write_folder(dst, config, state, convert_dpt.processor_json(
      spec, config['model_type'] == 'depth_anything'))
  return name


def _video_to_transformers(dst, name, model, flat, record, spec) -> str:
  """`to_transformers` of a ViViT: ViViT's or VideoMAE's classes."""
  arch = transformers_video.export_architecture(model, flat)
  frames = record.get('num_frames')
  if frames is None:
    raise ValueError(f'{name}: its record says no num_frames, which '
                     "transformers' config.json needs.")
  config = transformers_video.config_json(arch, model, flat, spec.size,
                                          frames)
  flat = convert_eva.with_zero_biases(flat)  # `from_timm` drops them again
  state, extra = _timm_state(flat, model)
  state['patch_embed.proj.weight'] = state['patch_embed.proj.weight'
                                          ].transpose(4, 3, 0, 1, 2)
  weights = transformers_layout.from_timm(state, extra, config)
  _write_folder(dst, config, weights,
                transformers_video.preprocessor_json(arch, spec))
  if arch == 'VivitModel' and 'pre_logits/kernel' not in flat:
    print(f'Note: {dst} is a VivitModel without a pooler: load it with '
          'add_pooling_layer=False.', file=sys.stderr)
  return name


def to_timm(src: str, dst: str, model_name: Optional[str]) -> str:
  """Writes the .npz `src` as timm's state dict `dst` (.safetensors);
  returns the preset."""
  flat = _npz_flat(src)
  model_name = (model_name or (transform.load_transform(src) or {}).get(
      'model_name') or _npz_preset(flat))
  if (model_name in registry.MODEL_CONFIGS and
      registry.family(model_name).timm_layout == 'naflex'):
    raise ValueError(
        f"{src} is a NaFlex tower ({model_name}): timm's ViT state dict "
        'would resize its table otherwise, and its NaFlexVit layout is not '
        'written here; write it with --layout=transformers '
        '(Siglip2VisionModel).')
  if _is_aimv2_preset(model_name):  # timm's AIMv2 holds its RMSNorms
    state = _to_aimv2(flat)
  else:
    _check_timm_norms(src, flat)
    state = (convert_swin.npz_to_timm(flat) if convert_swin.is_swin(flat)
             else _to_eva(flat) if _is_eva_preset(model_name) else
             npz_to_timm(flat))
  save_file = optional_import('safetensors.numpy', dst).save_file
  save_file({k: np.ascontiguousarray(v, np.float32)
             for k, v in state.items()}, dst)
  return model_name


def _check_timm_norms(src: str, flat: Flat) -> None:
  """Refuses what timm's ViT state dict does not hold: RMSNorm blocks (no
  norm biases) and query/key norms across the heads (InternViT-6B's)."""
  block = 'Transformer/encoderblock_0/'
  rms = (f'{block}LayerNorm_0/scale' in flat and
         f'{block}LayerNorm_0/bias' not in flat)
  q_norm = flat.get(f'{block}MultiHeadDotProductAttention_1/q_norm/scale')
  width = flat['embedding/kernel'].shape[-1] if 'embedding/kernel' in flat else 0
  heads = flat.get(f'{block}MultiHeadDotProductAttention_1/query/kernel')
  across = q_norm is not None and q_norm.shape[0] == width and (
      heads is None or heads.shape[1] > 1)
  if rms or across:
    raise ValueError(f"{src} has {'RMSNorm blocks' if rms else ''}"
                     f"{' and ' if rms and across else ''}"
                     f"{'query/key norms across the heads' if across else ''}"
                     " (InternViT-6B's), which timm's ViT state dict does not "
                     'hold; write it with --layout=transformers '
                     '(InternVLVisionModel).')
