"""Hugging Face transformers' vision checkpoints <-> timm's names.

A transformers folder holds `config.json` (`model_type`, `architectures`),
`model.safetensors` (or `pytorch_model.bin`) and `preprocessor_config.json`.
Its image tower is read as the timm model that computes the same thing:
the weights renamed to timm's (`to_timm`), the settings as the arguments of
timm's VisionTransformer (`vit_settings`), the eval transform as timm's
`pretrained_cfg` (`eval_transform`); `converter` takes it from there, as
for a timm folder. `from_timm` and `config_json` go back, for
`--layout=transformers`.

What each architecture becomes (docs/checkpoints.md lists the names):
- `ViTForImageClassification`, `ViTModel` (its pooler is the original's
  `pre_logits`), `DeiTForImageClassificationWithTeacher`, `ViTMAEModel`
  and `ViTMAEForPreTraining` (the encoder; the decoder is dropped):
  separate query/key/value, fused as timm's `qkv`.
- `Dinov2Model`, `Dinov2WithRegistersModel`: LayerScale, registers; the
  registers' table has the class token's entry, which is folded into the
  class token (a constant either way), so vit_jax's table has no prefix.
- `CLIPVisionModel[WithProjection]`, `SiglipVisionModel` and the image
  towers of `CLIPModel` and `SiglipModel`: CLIP's `class_embedding` (D,),
  `pre_layrnorm`, `post_layernorm` (on the pooled token: the same as on
  every token) and bias-free `visual_projection` (the head, bias zero);
  SigLIP's MAP head, whose `in_proj` fuses query, key and value.
- `SwinForImageClassification`: its patch merging ends each stage (the
  original release's layout, which `convert.swin` reads).
"""

import re
from typing import Any, Dict, Optional, Tuple

import numpy as np

Flat = Dict[str, np.ndarray]

# architecture: (kind, the prefix of the image tower's names).
ARCHITECTURES = {
    'ViTForImageClassification': ('vit', 'vit.'),
    'ViTModel': ('vit', ''),
    'DeiTForImageClassificationWithTeacher': ('deit', 'deit.'),
    'Dinov2Model': ('dinov2', ''),
    'Dinov2WithRegistersModel': ('dinov2', ''),
    'ViTMAEModel': ('mae', ''),
    'ViTMAEForPreTraining': ('mae', 'vit.'),
    'CLIPVisionModel': ('clip', ''),
    'CLIPVisionModelWithProjection': ('clip', 'vision_model.'),
    'CLIPModel': ('clip', 'vision_model.'),
    'SiglipVisionModel': ('siglip', ''),
    'SiglipModel': ('siglip', 'vision_model.'),
    'SwinForImageClassification': ('swin', 'swin.'),
}
TWO_TOWERS = ('CLIPModel', 'SiglipModel')

# (transformers module, timm module) of the modules that map one to one,
# their leaves (weight, bias, ...) alike; {i} is a block's index.
_VIT = [
    ('embeddings.cls_token', 'cls_token'),
    ('embeddings.distillation_token', 'dist_token'),
    ('embeddings.register_tokens', 'reg_token'),
    ('embeddings.position_embeddings', 'pos_embed'),
    ('embeddings.patch_embeddings.projection', 'patch_embed.proj'),
    ('encoder.layer.{i}.layernorm_before', 'blocks.{i}.norm1'),
    ('encoder.layer.{i}.layernorm_after', 'blocks.{i}.norm2'),
    ('encoder.layer.{i}.norm1', 'blocks.{i}.norm1'),
    ('encoder.layer.{i}.norm2', 'blocks.{i}.norm2'),
    ('encoder.layer.{i}.attention.output.dense', 'blocks.{i}.attn.proj'),
    ('encoder.layer.{i}.intermediate.dense', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.output.dense', 'blocks.{i}.mlp.fc2'),
    ('encoder.layer.{i}.mlp.fc1', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.mlp.fc2', 'blocks.{i}.mlp.fc2'),
    ('encoder.layer.{i}.mlp.weights_in', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.mlp.weights_out', 'blocks.{i}.mlp.fc2'),
    ('encoder.layer.{i}.layer_scale1.lambda1', 'blocks.{i}.ls1.gamma'),
    ('encoder.layer.{i}.layer_scale2.lambda1', 'blocks.{i}.ls2.gamma'),
    ('layernorm', 'norm'),
    ('classifier', 'head'),
    ('cls_classifier', 'head'),
    ('distillation_classifier', 'head_dist'),
]
_CLIP = [
    ('embeddings.patch_embedding', 'patch_embed.proj'),
    ('pre_layrnorm', 'norm_pre'),
    ('encoder.layers.{i}.layer_norm1', 'blocks.{i}.norm1'),
    ('encoder.layers.{i}.layer_norm2', 'blocks.{i}.norm2'),
    ('encoder.layers.{i}.self_attn.out_proj', 'blocks.{i}.attn.proj'),
    ('encoder.layers.{i}.mlp.fc1', 'blocks.{i}.mlp.fc1'),
    ('encoder.layers.{i}.mlp.fc2', 'blocks.{i}.mlp.fc2'),
    ('post_layernorm', 'norm'),
    ('head.probe', 'attn_pool.latent'),
    ('head.attention.out_proj', 'attn_pool.proj'),
    ('head.layernorm', 'attn_pool.norm'),
    ('head.mlp.fc1', 'attn_pool.mlp.fc1'),
    ('head.mlp.fc2', 'attn_pool.mlp.fc2'),
]
_SWIN = [
    ('embeddings.patch_embeddings.projection', 'patch_embed.proj'),
    ('embeddings.norm', 'patch_embed.norm'),
    ('encoder.layers.{i}.blocks.{j}.layernorm_before',
     'layers.{i}.blocks.{j}.norm1'),
    ('encoder.layers.{i}.blocks.{j}.layernorm_after',
     'layers.{i}.blocks.{j}.norm2'),
    ('encoder.layers.{i}.blocks.{j}.attention.self',
     'layers.{i}.blocks.{j}.attn'),
    ('encoder.layers.{i}.blocks.{j}.attention.output.dense',
     'layers.{i}.blocks.{j}.attn.proj'),
    ('encoder.layers.{i}.blocks.{j}.intermediate.dense',
     'layers.{i}.blocks.{j}.mlp.fc1'),
    ('encoder.layers.{i}.blocks.{j}.output.dense',
     'layers.{i}.blocks.{j}.mlp.fc2'),
    # At the end of stage i, as the original release's (`convert.swin`).
    ('encoder.layers.{i}.downsample.reduction',
     'layers.{i}.downsample.reduction'),
    ('encoder.layers.{i}.downsample.norm', 'layers.{i}.downsample.norm'),
    ('layernorm', 'norm'),
    ('classifier', 'head'),
]
_RULES = {'vit': _VIT, 'deit': _VIT, 'dinov2': _VIT, 'mae': _VIT,
          'clip': _CLIP, 'siglip': _CLIP, 'swin': _SWIN}
# Separate projections, fused in timm's order (query, key, value).
_QKV = {'vit': r'encoder\.layer\.(\d+)\.attention\.attention\.'
               r'(query|key|value)\.(weight|bias)',
        'clip': r'encoder\.layers\.(\d+)\.self_attn\.(q|k|v)_proj\.'
                r'(weight|bias)',
        'swin': r'encoder\.layers\.(\d+)\.blocks\.(\d+)\.attention\.self\.'
                r'(query|key|value)\.(weight|bias)'}
_PARTS = {'query': 0, 'key': 1, 'value': 2, 'q': 0, 'k': 1, 'v': 2}
# Parameters that only pre-training uses, or the text side of two towers,
# dropped with a note.
_DROPPED = (r'(\w+\.)?embeddings\.mask_token', r'decoder\..*',
            r'text_model\..*', 'text_projection.weight', 'logit_scale',
            'logit_bias')


def is_transformers(config: Dict[str, Any]) -> bool:
  """Whether a config.json is transformers' (timm's names `architecture`)."""
  return 'architecture' not in config and (
      'model_type' in config or 'architectures' in config)


def looks_like_transformers(names) -> bool:
  """Whether state dict keys are transformers' (for a bare weights file)."""
  return any(re.match(r'(\w+\.)?(embeddings\.|encoder\.layers?\.\d)', k) or
             k.startswith('vision_model.') for k in names)


def architecture(config: Dict[str, Any]) -> str:
  """The supported architecture a transformers config.json names."""
  names = config.get('architectures') or []
  if not names:
    raise ValueError(
        f"transformers' config.json (model_type "
        f"{config.get('model_type')!r}) names no architectures: vit_jax "
        f'reads {", ".join(ARCHITECTURES)}.')
  if names[0] not in ARCHITECTURES:
    raise ValueError(f"transformers' {names[0]} is not supported (supported: "
                     f'{", ".join(ARCHITECTURES)}).')
  return names[0]


def kind(config: Dict[str, Any]) -> str:
  """'vit', 'deit', 'dinov2', 'mae', 'clip', 'siglip' or 'swin'."""
  return ARCHITECTURES[architecture(config)][0]


def vision_config(config: Dict[str, Any]) -> Dict[str, Any]:
  """The image tower's settings (a two-tower model's `vision_config`)."""
  return config.get('vision_config') or config


def _pattern(template: str) -> re.Pattern:
  parts = re.split(r'\{(\w)\}', template)
  return re.compile(''.join(re.escape(p) if k % 2 == 0 else rf'(?P<{p}>\d+)'
                            for k, p in enumerate(parts)) +
                    r'(?:\.(?P<leaf>\w+))?')


def _rename(key: str, rules, source: int) -> Optional[str]:
  """The other side's name of `key` (source 0: transformers, 1: timm)."""
  for pair in rules:
    match = _pattern(pair[source]).fullmatch(key)
    if match:
      fields = {k: v for k, v in match.groupdict().items() if k != 'leaf'}
      leaf = match['leaf']
      return pair[1 - source].format(**fields) + (f'.{leaf}' if leaf else '')
  return None


def _image_tower(state: Flat, prefix: str) -> Tuple[Flat, list]:
  """The image tower's names without `prefix` (its heads have none); what
  is dropped: pre-training's parts, a two-tower model's text side."""
  tower, dropped = {}, []
  for key, value in state.items():
    if any(re.fullmatch(p, key) for p in _DROPPED):
      dropped.append(key)
    else:
      tower[key[len(prefix):] if prefix and key.startswith(prefix) else
            key] = value
  return tower, dropped


def _fuse(state: Flat, pattern: str) -> Tuple[Flat, Flat]:
  """(timm's fused qkv by name, the rest) of separate projections."""
  parts, rest = {}, {}
  for key, value in state.items():
    match = re.fullmatch(pattern, key)
    if match is None:
      rest[key] = value
      continue
    *block, part, leaf = match.groups()
    parts.setdefault((tuple(block), leaf), [None] * 3)[_PARTS[part]] = value
  fused = {}
  for (block, leaf), values in parts.items():
    where = ('layers.{}.blocks.{}'.format(*block) if len(block) == 2 else
             f'blocks.{block[0]}')
    if any(v is None for v in values):
      raise ValueError(f'{where}: query, key and value are not all there.')
    fused[f'{where}.attn.qkv.{leaf}'] = np.concatenate(values)
  return fused, rest


def to_timm(state: Flat, config: Dict[str, Any]) -> Tuple[Flat, Flat, list]:
  """(timm's state dict of the image tower, published names that timm has
  no name for (ViTModel's pooler: `pre_logits`), dropped names)."""
  arch = architecture(config)
  family, prefix = ARCHITECTURES[arch]
  tower, dropped = _image_tower(state, prefix)
  fused, tower = _fuse(tower, _QKV.get(family, _QKV['vit']) if family not in (
      'clip', 'siglip') else _QKV['clip'])
  out, extra, unknown = dict(fused), {}, []
  for key, value in tower.items():
    name = _rename(key, _RULES[family], 0)
    if name is not None:
      out[name] = value
    elif key == 'embeddings.class_embedding':  # CLIP's (D,)
      out['cls_token'] = value.reshape(1, 1, -1)
    elif key == 'embeddings.position_embedding.weight':  # an nn.Embedding
      out['pos_embed'] = value[None]
    elif key.startswith('head.attention.in_proj_'):  # torch's fused MHA
      leaf = 'weight' if key.endswith('weight') else 'bias'
      q, kv = np.split(value, [value.shape[0] // 3])
      out[f'attn_pool.q.{leaf}'], out[f'attn_pool.kv.{leaf}'] = q, kv
    elif key == 'visual_projection.weight':  # CLIP's, bias-free
      out['head.weight'] = value
      out['head.bias'] = np.zeros(value.shape[0], value.dtype)
    elif key.startswith('pooler.dense.'):  # ViTModel's tanh pooler
      leaf = 'kernel' if key.endswith('weight') else 'bias'
      extra[f'pre_logits/{leaf}'] = value.T if leaf == 'kernel' else value
    else:
      unknown.append(prefix + key)
  if unknown:
    raise ValueError(f"transformers' {arch}: {len(unknown)} name(s) have no "
                     f'counterpart in vit_jax: {", ".join(unknown[:6])}.')
  if arch == 'Dinov2WithRegistersModel':
    out = _fold_class_entry(out)
  return out, extra, dropped


def _fold_class_entry(state: Flat) -> Flat:
  """The class token's table entry added to it: the table then covers the
  patches only (timm's no_embed_class), as the registers have none."""
  table = state['pos_embed']
  return dict(state, cls_token=state['cls_token'] + table[:, :1],
              pos_embed=table[:, 1:])


# transformers' hidden_act -> timm's act_layer.
_ACTIVATIONS = {'gelu': None, 'gelu_pytorch_tanh': 'gelu_tanh',
                'gelu_new': 'gelu_tanh', 'quick_gelu': 'quick_gelu'}


def _unsupported(arch: str, key: str, value, why: str) -> ValueError:
  return ValueError(f"transformers' {arch} with {key}={value!r} is not "
                    f'supported: {why}.')


def _activation(arch: str, config: Dict[str, Any]):
  act = config.get('hidden_act', 'gelu')
  if act not in _ACTIVATIONS:
    raise _unsupported(arch, 'hidden_act', act, 'vit_jax computes GELU (exact '
                       f'or tanh) and QuickGELU: {", ".join(_ACTIVATIONS)}')
  return _ACTIVATIONS[act]


def _check(arch: str, config: Dict[str, Any], **fixed) -> None:
  """Settings vit_jax computes only at these values."""
  for key, (value, why) in fixed.items():
    if config.get(key, value) != value:
      raise _unsupported(arch, key, config[key], why)


def _swiglu_hidden(config: Dict[str, Any]) -> int:
  """DINOv2's SwiGLU width: 2/3 of the MLP's, rounded up to 8."""
  hidden = int(config['hidden_size'] * config.get('mlp_ratio', 4))
  return (int(hidden * 2 / 3) + 7) // 8 * 8


def vit_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """The arguments of timm's VisionTransformer that computes the image
  tower of a transformers config.json (not Swin's: `swin_settings`)."""
  arch, vision = architecture(config), vision_config(config)
  family = ARCHITECTURES[arch][0]
  _check(arch, vision, num_channels=(3, "vit_jax's pipelines feed RGB "
                                     'images'),
         qkv_bias=(True, 'its attention has no query/key/value biases'),
         pooler_act=('tanh', "the original's pre_logits use tanh"))
  width = vision['hidden_size']
  settings = dict(
      embed_dim=width, depth=vision['num_hidden_layers'],
      num_heads=vision['num_attention_heads'],
      patch_size=vision['patch_size'],
      mlp_ratio=vision.get('intermediate_size', 4 * width) / width,
      act_layer=_activation(arch, vision),
      layer_norm_eps=vision.get('layer_norm_eps', 1e-12),
      global_pool='token', class_token=True, fc_norm=None, distilled=False,
      init_values=None, no_embed_class=False, reg_tokens=0, mlp_layer=None,
      pre_norm=False)
  if family == 'deit':
    settings['distilled'] = True
  elif family == 'dinov2':
    settings.update(init_values=vision.get('layerscale_value', 1.),
                    mlp_ratio=vision.get('mlp_ratio', 4))
    if arch == 'Dinov2WithRegistersModel':
      settings.update(reg_tokens=vision.get('num_register_tokens', 4),
                      no_embed_class=True)
    if vision.get('use_swiglu_ffn'):
      settings.update(mlp_layer='swiglu_packed', act_layer='silu',
                      mlp_ratio=2 * _swiglu_hidden(vision) / width)
  elif family == 'clip':
    settings['pre_norm'] = True
  elif family == 'siglip':
    if not vision.get('vision_use_head', True):
      raise _unsupported(arch, 'vision_use_head', False, 'its pooled output '
                         'is the MAP head')
    settings.update(class_token=False, global_pool='map')
  return settings


def swin_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's Swin config fields of a SwinForImageClassification."""
  arch = architecture(config)
  _check(arch, config,
         num_channels=(3, "vit_jax's pipelines feed RGB images"),
         hidden_act=('gelu', "vit_jax's Swin computes the exact GELU"),
         mlp_ratio=(4.0, "vit_jax's Swin MLPs are 4x wide"),
         qkv_bias=(True, 'its attention has no query/key/value biases'),
         use_absolute_embeddings=(False, "vit_jax's Swin has no absolute "
                                  'position table'),
         layer_norm_eps=(1e-5, "vit_jax's Swin LayerNorms have eps 1e-5"))
  return dict(patch_size=config['patch_size'], embed_dim=config['embed_dim'],
              depths=tuple(config['depths']),
              num_heads=tuple(config['num_heads']),
              window_size=config['window_size'])


# PIL's filters by the integer transformers' `resample` stores.
_RESAMPLE = {0: 'nearest', 1: 'lanczos', 2: 'bilinear', 3: 'bicubic',
             4: 'box', 5: 'hamming'}


def _side(size: Dict[str, int], what: str) -> Tuple[int, str]:
  """(side, crop_mode) of a processor's `size` dict."""
  if 'shortest_edge' in size:
    return int(size['shortest_edge']), 'center'
  if size.get('height') != size.get('width'):
    raise ValueError(f"preprocessor_config.json's {what} {size} is not "
                     'square; vit_jax evaluates square images.')
  return int(size['height']), 'squash'


def eval_transform(processor: Dict[str, Any]) -> Dict[str, Any]:
  """A preprocessor_config.json as timm's pretrained_cfg keys: resized to
  `size` (both sides, or the short one: `shortest_edge`), then, with
  `do_center_crop`, cropped to `crop_size`."""
  side, mode = _side(processor.get('size') or {'height': 224, 'width': 224},
                     'size')
  crop = side
  if processor.get('do_center_crop'):
    crop, _ = _side(processor['crop_size'], 'crop_size')
  elif mode == 'center':
    raise ValueError("preprocessor_config.json resizes the short side to "
                     f'{side} without a crop: the image is not square.')
  if not processor.get('do_resize', True):
    raise ValueError('preprocessor_config.json does not resize: vit_jax '
                     'evaluates images of one size.')
  if not processor.get('do_rescale', True) or abs(
      processor.get('rescale_factor', 1 / 255) * 255 - 1) > 1e-6:
    raise ValueError('preprocessor_config.json does not scale pixels by '
                     '1/255, which vit_jax does.')
  normalize = processor.get('do_normalize', True)
  resample = processor.get('resample', 3)
  if resample not in _RESAMPLE:
    raise ValueError(f'preprocessor_config.json: unknown resample '
                     f'{resample!r} (PIL filters 0-5).')
  return dict(
      input_size=[3, crop, crop], crop_pct=crop / side, crop_mode=mode,
      interpolation=_RESAMPLE[resample],
      mean=list(processor.get('image_mean', (0.5,) * 3)) if normalize
      else [0., 0., 0.],
      std=list(processor.get('image_std', (0.5,) * 3)) if normalize
      else [1., 1., 1.])
