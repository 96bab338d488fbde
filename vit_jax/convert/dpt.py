"""transformers' `DepthAnythingForDepthEstimation` (Depth Anything v1 and
v2: they differ in config only) and `DPTForDepthEstimation` (a plain ViT,
as Intel/dpt-large, or a DINOv2 backbone) <-> vit_jax's `models.dpt`.

The backbone is read as the tower it is (a `Dinov2Model` or a `ViTModel`:
`split` hands its names and config to the converter's tower path); the
neck and head are renamed to `DPTHead`'s, under `dpt/` in the .npz
(`head_to_npz`), and the record's `dpt` holds what builds the head and which
blocks it reads (`settings`). The eval transform is the DPT image
processor's (`eval_transform`): Depth Anything's folders give ImageNet's
mean and std, DPT's processor defaults to 0.5 and 0.5. `to_transformers`
writes it back (`--layout=transformers`).
"""

import os
import re
import sys
from typing import Any, Dict, Tuple

import numpy as np

from vit_jax.convert import transformers_defaults

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

# (transformers' neck and head module, DPTHead's): {0}, {1}, {2} indices.
_NECK = [
    ('neck.reassemble_stage.layers.{0}.projection', 'reassemble_{0}/projection'),
    ('neck.reassemble_stage.layers.{0}.resize', 'reassemble_{0}/resize'),
    ('neck.reassemble_stage.readout_projects.{0}.0', 'reassemble_{0}/readout'),
    ('neck.convs.{0}', 'neck_conv_{0}'),
    ('neck.fusion_stage.layers.{0}.projection', 'fusion_{0}/projection'),
    ('neck.fusion_stage.layers.{0}.residual_layer{1}.convolution{2}',
     'fusion_{0}/residual{1}/conv{2}'),
]
# The heads: Depth Anything's convs, DPT's Sequential.
_HEADS = {True: [('head.conv{0}', 'head/conv{0}')],
          False: [('head.head.0', 'head/conv1'), ('head.head.2', 'head/conv2'),
                  ('head.head.4', 'head/conv3'),
                  ('head.projection', 'head/projection')]}
# Fusion block 0 has a first residual unit that its forward never uses.
_UNUSED = 'neck.fusion_stage.layers.0.residual_layer1.convolution{0}'


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
    elif not re.fullmatch(_pattern(_UNUSED) + r'\.\w+', key):
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


def _pattern(template: str) -> str:
  return re.sub(r'\\\{(\d)\\\}', r'(?P<g\1>\\d+)', re.escape(template))


def _rename(module: str, rules, source: int) -> str:
  """The other side's name of `module` (source 0: transformers')."""
  for pair in rules:
    match = re.fullmatch(_pattern(pair[source]), module)
    if match:
      found = match.groupdict()
      return pair[1 - source].format(*[found[f'g{k}']
                                        for k in range(len(found))])
  raise ValueError(f"transformers' depth model: {module} has no counterpart "
                   "in vit_jax's DPTHead." if source == 0 else
                   f"DPTHead's {module} has no counterpart in transformers'.")


def head_to_npz(state: Flat, config: Dict[str, Any]) -> Flat:
  """The neck's and head's weights as `dpt/...` of `DPTHead`: a Conv2d
  (out, in, kh, kw) as (kh, kw, in, out), a ConvTranspose2d (in, out, f,
  f) as (f, f, in, out), a Linear transposed."""
  out, rules = {}, _NECK + _HEADS[_depth_anything(config)]
  for key, value in state.items():
    module, leaf = key.rsplit('.', 1)
    name, value = _rename(module, rules, 0), np.asarray(value)
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
  found = transformers_defaults.read_processor(folder)
  if found is not None:
    processor.update(found)
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


def tower_architecture(dpt: Dict[str, Any]) -> str:
  """The backbone's transformers class: DINOv2's where the maps are normed
  (Depth Anything's, a DINOv2 DPT's: `Dinov2Backbone`), else DPT's own
  ViT (written as a `ViTModel`)."""
  return 'Dinov2Model' if dpt['norm'] else 'ViTModel'


def to_transformers(tower: Dict[str, Any], weights: Flat, head: Flat,
                    dpt: Dict[str, Any]) -> Tuple[Dict[str, Any], Flat]:
  """(config.json, state dict) of transformers' depth model: `tower` and
  `weights` the backbone's as a model of its own (`tower_architecture`),
  `head` the `dpt/` weights without the prefix, `dpt` the record's; the
  reverse of `split`. Refuses what transformers computes otherwise."""
  settings, da = dpt['head'], dpt['head']['fusion'] == 'next'
  dinov2 = tower['model_type'] == 'dinov2'
  _check_writable(settings, da, dinov2)
  config = dict(neck_hidden_sizes=list(settings['out_channels']),
                reassemble_factors=list(settings['factors']),
                fusion_hidden_size=settings['features'], head_in_index=-1)
  if dinov2:
    backbone = {k: v for k, v in tower.items() if k != 'architectures'}
    backbone.update(out_indices=[i + 1 for i in dpt['indices']],
                    apply_layernorm=True, reshape_hidden_states=False)
  if da:
    config.update(architectures=[ARCHITECTURES[0]],
                  model_type='depth_anything', backbone_config=backbone,
                  patch_size=tower['patch_size'],
                  reassemble_hidden_size=tower['hidden_size'],
                  head_hidden_size=settings.get('head_hidden', 32),
                  depth_estimation_type=settings.get('depth_type', 'relative'),
                  max_depth=_integral(settings.get('max_depth', 1.)))
  else:
    config.update(architectures=[ARCHITECTURES[1]], model_type='dpt',
                  readout_type=settings['readout'], is_hybrid=False,
                  add_projection=bool(settings.get('head_projection')),
                  neck_ignore_stages=[], backbone_featmap_shape=None)
    if dinov2:
      config.update(backbone_config=backbone, hidden_size=tower['hidden_size'])
    else:
      config.update({k: tower[k] for k in _VIT_KEYS if k in tower},
                    backbone_out_indices=list(dpt['indices']))
  prefix = 'backbone.' if dinov2 else 'dpt.'
  state = {prefix + k: v for k, v in weights.items()}
  state.update(head_from_npz(head, settings, da))
  return config, state


def _integral(value: float):
  """An int where it is one: DepthAnythingConfig's `max_depth` is typed
  int."""
  return int(value) if float(value).is_integer() else value


def _check_writable(settings, da: bool, dinov2: bool) -> None:
  def refuse(what):
    return ValueError(f"This DPT cannot be written as transformers' "
                      f'{ARCHITECTURES[0] if da else ARCHITECTURES[1]}: {what}.')
  if settings['head'] != 'depth':
    raise refuse(f"its head is {settings['head']!r}, not 'depth'")
  if da and (settings['readout'] != 'ignore' or not dinov2):
    raise refuse('Depth Anything reads a DINOv2 and ignores its class token')
  if not da and (settings.get('head_hidden', 32) != 32 or settings.get(
      'depth_type', 'relative') != 'relative' or settings.get(
          'max_depth', 1.) != 1.):
    raise refuse("DPT's head is 32 wide, relative, unscaled")
  if settings.get('head_projection') and settings['features'] != 256:
    raise refuse("DPT's head projection is 256 wide")


def head_from_npz(head: Flat, settings: Dict[str, Any], da: bool) -> Flat:
  """`head_to_npz`'s reverse, and zeros for the residual unit that the
  first fusion block holds and never uses."""
  out = {}
  for key, value in head.items():
    module, leaf = key.rsplit('/', 1)
    name = _rename(module, _NECK + _HEADS[da], 1)
    level = re.fullmatch(r'reassemble_(\d+)/resize', module)
    if leaf == 'bias':
      pass
    elif level and settings['factors'][int(level.group(1))] > 1:
      value = value.transpose(2, 3, 0, 1)
    else:
      value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T
    out[f'{name}.{"bias" if leaf == "bias" else "weight"}'] = value
  width = settings['features']
  for m in (1, 2):
    out[_UNUSED.format(m) + '.weight'] = np.zeros((width, width, 3, 3),
                                                  np.float32)
    out[_UNUSED.format(m) + '.bias'] = np.zeros(width, np.float32)
  return out


def processor_json(spec, da: bool) -> Dict[str, Any]:
  """DPTImageProcessor's file of the eval transform `spec` (a squash to
  the square); Depth Anything's keeps the aspect ratio, as its folders."""
  if spec.crop_mode != 'squash' or spec.crop_pct != 1:
    raise ValueError("DPT's image processor resizes the whole image; this "
                     f'transform crops ({spec.crop_mode}, {spec.crop_pct}).')
  resample = {v: k for k, v in _RESAMPLE.items()}[spec.interpolation]
  return dict(image_processor_type='DPTImageProcessor', do_resize=True,
              size={'height': spec.size, 'width': spec.size},
              resample=resample, do_rescale=True, rescale_factor=1 / 255,
              do_normalize=True, image_mean=list(spec.mean),
              image_std=list(spec.std), keep_aspect_ratio=da,
              ensure_multiple_of=14 if da else 1, do_pad=False)
