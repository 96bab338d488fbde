"""transformers' `DepthAnythingForDepthEstimation` (Depth Anything v1 and
v2: they differ in config only) and `DPTForDepthEstimation` (a plain ViT,
as Intel/dpt-large, or a DINOv2 backbone) <-> vit_jax's `models.dpt`.

The backbone is read as the tower it is (a `Dinov2Model` or a `ViTModel`:
`split` hands its names and config to the converter's tower path); the
neck and head are renamed to `DPTHead`'s, under `dpt/` in the .npz
(`head_to_npz`), and the record's `dpt` holds what builds the head and which
blocks it reads (`settings`). The eval transform is the DPT image
processor's (`eval_transform`): Depth Anything's folders give ImageNet's
mean and std, DPT's processor defaults to 0.5 and 0.5.
"""

import json
import os
import re
import sys
from typing import Any, Dict, Tuple

import numpy as np

Flat = Dict[str, np.ndarray]

ARCHITECTURES = ('DepthAnythingForDepthEstimation', 'DPTForDepthEstimation')
# The configs' defaults (transformers 5.23), for a config.json that leaves
# some out.
DEPTH_ANYTHING = dict(patch_size=14, reassemble_hidden_size=384,
                      reassemble_factors=[4, 2, 1, 0.5],
                      neck_hidden_sizes=[48, 96, 192, 384],
                      fusion_hidden_size=64, head_in_index=-1,
                      head_hidden_size=32, depth_estimation_type='relative',
                      max_depth=1)
DPT = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
           intermediate_size=3072, hidden_act='gelu', layer_norm_eps=1e-12,
           image_size=384, patch_size=16, num_channels=3, is_hybrid=False,
           qkv_bias=True, backbone_out_indices=[2, 5, 8, 11],
           readout_type='project', reassemble_factors=[4, 2, 1, 0.5],
           neck_hidden_sizes=[96, 192, 384, 768], fusion_hidden_size=256,
           head_in_index=-1, use_batch_norm_in_fusion_residual=False,
           use_bias_in_fusion_residual=None, add_projection=False,
           neck_ignore_stages=[], backbone_config=None)
# DPTImageProcessor's defaults: 384 x 384, bicubic, 0.5 and 0.5.
PROCESSOR = dict(size={'height': 384, 'width': 384}, resample=3,
                 image_mean=[0.5] * 3, image_std=[0.5] * 3,
                 keep_aspect_ratio=False, ensure_multiple_of=1,
                 do_normalize=True)
_RESAMPLE = {0: 'nearest', 2: 'bilinear', 3: 'bicubic'}
# The ViT settings of DPT's own encoder (DPTViTEmbeddings and layers).
_VIT_KEYS = ('hidden_size', 'num_hidden_layers', 'num_attention_heads',
             'intermediate_size', 'hidden_act', 'layer_norm_eps',
             'image_size', 'patch_size', 'num_channels', 'qkv_bias')

# (transformers' neck and head names, DPTHead's); {i} a level, {j} a fusion
# block, {k} its residual unit, {m} a conv.
_RULES = [
    (r'neck\.reassemble_stage\.layers\.(\d+)\.projection', 'reassemble_{0}/projection'),
    (r'neck\.reassemble_stage\.layers\.(\d+)\.resize', 'reassemble_{0}/resize'),
    (r'neck\.reassemble_stage\.readout_projects\.(\d+)\.0', 'reassemble_{0}/readout'),
    (r'neck\.convs\.(\d+)', 'neck_conv_{0}'),
    (r'neck\.fusion_stage\.layers\.(\d+)\.projection', 'fusion_{0}/projection'),
    (r'neck\.fusion_stage\.layers\.(\d+)\.residual_layer(\d)\.convolution(\d)',
     'fusion_{0}/residual{1}/conv{2}'),
    (r'head\.conv(\d)', 'head/conv{0}'),  # Depth Anything's
    (r'head\.head\.0', 'head/conv1'),  # DPT's Sequential
    (r'head\.head\.2', 'head/conv2'),
    (r'head\.head\.4', 'head/conv3'),
    (r'head\.projection', 'head/projection'),
]
# Fusion block 0 has a first residual unit that its forward never uses.
_UNUSED = r'neck\.fusion_stage\.layers\.0\.residual_layer1\..*'


def is_dpt(config: Dict[str, Any]) -> bool:
  return (config.get('architectures') or [None])[0] in ARCHITECTURES


def _depth_anything(config) -> bool:
  return config['architectures'][0] == ARCHITECTURES[0]


def complete(config: Dict[str, Any]) -> Dict[str, Any]:
  defaults = DEPTH_ANYTHING if _depth_anything(config) else DPT
  return dict(defaults, **config)


def _refuse(config, what: str):
  return ValueError(f"transformers' {config['architectures'][0]} with "
                    f'{what} is not supported.')


def split(state: Flat, config: Dict[str, Any]
          ) -> Tuple[Flat, Dict[str, Any], Flat, Dict[str, Any]]:
  """(the backbone's weights and a transformers config.json of it as a
  model of its own, the neck's and head's weights by `DPTHead`'s names,
  the record's `dpt`: `settings`)."""
  config = complete(config)
  _check(config)
  backbone = config.get('backbone_config')
  if backbone:  # a Dinov2Backbone: its feature maps are Dinov2Model's
    if backbone.get('model_type') != 'dinov2':
      raise _refuse(config, f"a {backbone.get('model_type')!r} backbone "
                    '(vit_jax reads a DINOv2 one)')
    prefix = 'backbone.'
    tower = {k: v for k, v in backbone.items()
             if k not in ('out_features', 'out_indices', 'stage_names')}
    tower.update(model_type='dinov2', architectures=['Dinov2Model'])
    indices = [i - 1 for i in backbone.get('out_indices') or [1, 2, 3, 4]]
    norm = backbone.get('apply_layernorm', True)
  else:  # DPT's own ViT (DPTModel): its blocks' outputs, not normed
    prefix = 'dpt.'
    tower = {k: config[k] for k in _VIT_KEYS}
    tower.update(model_type='vit', architectures=['ViTModel'])
    indices, norm = list(config['backbone_out_indices']), False
  weights, head = {}, {}
  for key, value in state.items():
    if key.startswith(prefix):
      weights[key[len(prefix):]] = value
    elif not re.fullmatch(_UNUSED, key):
      head[key] = value
  return weights, tower, head_to_npz(head, config), settings(
      config, indices, norm)


def _check(config) -> None:
  if config.get('is_hybrid'):
    raise _refuse(config, 'is_hybrid (DPT-Hybrid: a ResNet stem whose '
                  'stages are the first two maps)')
  if config['head_in_index'] != -1:
    raise _refuse(config, f"head_in_index={config['head_in_index']}")
  if not _depth_anything(config):
    if config['use_batch_norm_in_fusion_residual']:
      raise _refuse(config, 'use_batch_norm_in_fusion_residual')
    if config['use_bias_in_fusion_residual'] is False:
      raise _refuse(config, 'use_bias_in_fusion_residual=False')
    if config['neck_ignore_stages']:
      raise _refuse(config, f"neck_ignore_stages={config['neck_ignore_stages']}")
    if config['readout_type'] == 'project' and config['hidden_act'] != 'gelu':
      raise _refuse(config, f"readout_type='project' and hidden_act="
                    f"{config['hidden_act']!r} (vit_jax reads out with the "
                    'exact GELU)')
  else:
    backbone = config.get('backbone_config') or {}
    if backbone.get('patch_size', 14) != config['patch_size']:
      raise _refuse(config, 'a head patch_size other than the backbone\'s')


def settings(config, indices, norm) -> Dict[str, Any]:
  """The record's `dpt`: the blocks (`indices`, `norm`) and `head`, the
  `DPTHead` attributes."""
  da = _depth_anything(config)
  head = dict(features=config['fusion_hidden_size'],
              out_channels=list(config['neck_hidden_sizes']),
              factors=list(config['reassemble_factors']),
              readout='ignore' if da else config['readout_type'],
              head='depth', fusion='next' if da else 'x2')
  if da:
    head.update(head_hidden=config['head_hidden_size'],
                depth_type=config['depth_estimation_type'],
                max_depth=float(config['max_depth'] or 1))
  else:
    head.update(head_projection=bool(config['add_projection']))
  return dict(indices=indices, norm=bool(norm), head=head)


def _name(key: str) -> Tuple[str, str]:
  """(DPTHead's module, the leaf) of a neck or head weight."""
  module, leaf = key.rsplit('.', 1)
  for pattern, target in _RULES:
    match = re.fullmatch(pattern, module)
    if match:
      return target.format(*match.groups()), leaf
  raise ValueError(f"transformers' depth model: {key} has no counterpart in "
                   "vit_jax's DPTHead.")


def head_to_npz(state: Flat, config: Dict[str, Any]) -> Flat:
  """The neck's and head's weights as `dpt/...` of `DPTHead`: a Conv2d
  (out, in, kh, kw) as (kh, kw, in, out), a ConvTranspose2d (in, out, f,
  f) as (f, f, in, out), a Linear transposed."""
  out = {}
  for key, value in state.items():
    name, leaf = _name(key)
    value = np.asarray(value)
    if leaf == 'bias':
      out[f'dpt/{name}/bias'] = value
      continue
    level = re.match(r'reassemble_(\d+)/resize', name)
    if level and config['reassemble_factors'][int(level.group(1))] > 1:
      value = value.transpose(2, 3, 0, 1)
    elif value.ndim == 4:
      value = value.transpose(2, 3, 1, 0)
    else:
      value = value.T
    out[f'dpt/{name}/kernel'] = value
  return out


def eval_transform(folder: str, config: Dict[str, Any]) -> Dict[str, Any]:
  """The DPT image processor's eval transform (timm's keys): its
  preprocessor_config.json beside the weights, else DPTImageProcessor's
  defaults (Depth Anything's folders: ImageNet's mean and std). Depth
  Anything's processor keeps the aspect ratio (`keep_aspect_ratio`, sides
  a multiple of 14 near its size); vit_jax's transform squashes to it."""
  path = os.path.join(folder, 'preprocessor_config.json')
  processor = dict(PROCESSOR)
  if _depth_anything(config):
    processor.update(image_mean=[0.485, 0.456, 0.406],
                     image_std=[0.229, 0.224, 0.225], keep_aspect_ratio=True,
                     ensure_multiple_of=14, size={'height': 518, 'width': 518})
  if os.path.exists(path):
    with open(path) as f:
      processor.update(json.load(f))
  else:
    print(f'Note: no preprocessor_config.json in {folder}: assuming the '
          f"processor of {config['architectures'][0]}'s hub folders "
          f"({processor['size']}, mean {processor['image_mean']}).",
          file=sys.stderr)
  size = processor['size']
  if 'height' not in size:
    raise ValueError(f'{path}: a size of {size}; vit_jax reads a DPT '
                     "processor's height and width.")
  normalize = processor['do_normalize']
  return dict(input_size=[3, size['height'], size['width']], crop_pct=1.0,
              crop_mode='squash',
              interpolation=_RESAMPLE.get(processor['resample'], 'bicubic'),
              mean=list(processor['image_mean']) if normalize else [0.] * 3,
              std=list(processor['image_std']) if normalize else [1.] * 3)
