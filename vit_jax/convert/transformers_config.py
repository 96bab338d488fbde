"""Hugging Face transformers' settings <-> vit_jax's, both ways.

Reading, a transformers `config.json` becomes the arguments of timm's
model that computes the same (`vit_settings`, `swin_settings`) and its
`preprocessor_config.json` timm's eval transform keys (`eval_transform`).
Writing (`--layout=transformers`), a preset's model config becomes the
architecture that computes it (`export_architecture`, which refuses what
none does), its `config.json` (`config_json`) and the eval transform a
`preprocessor_config.json` (`preprocessor_json`). The weights' names are
`transformers_layout`'s.
"""

import math
from typing import Any, Dict, Tuple

import numpy as np

from vit_jax.convert import aimv2 as convert_aimv2
from vit_jax.convert import transformers_defaults
from vit_jax.convert.timm_config import mlp_settings
from vit_jax.convert.transformers_layout import ARCHITECTURES
from vit_jax.convert.transformers_layout import architecture
from vit_jax.convert.transformers_layout import vision_config
from vit_jax.models import encoder
from vit_jax.models import registry
from vit_jax.models import swin as models_swin
from vit_jax.models import vit as models_vit

Flat = Dict[str, np.ndarray]


# transformers' hidden_act -> timm's act_layer.
_ACTIVATIONS = {'gelu': None, 'gelu_pytorch_tanh': 'gelu_tanh',
                'gelu_new': 'gelu_tanh', 'gelu_fast': 'gelu_tanh',
                'quick_gelu': 'quick_gelu'}


def _unsupported(arch: str, key: str, value, why: str) -> ValueError:
  return ValueError(f"transformers' {arch} with {key}={value!r} is not "
                    f'supported: {why}.')


def _activation(arch: str, config: Dict[str, Any]):
  act = config['hidden_act']
  if act not in _ACTIVATIONS:
    raise _unsupported(arch, 'hidden_act', act, 'vit_jax computes GELU (exact '
                       f'or tanh) and QuickGELU: {", ".join(_ACTIVATIONS)}')
  return _ACTIVATIONS[act]


def mlp_of(arch: str, config: Dict[str, Any]) -> Dict[str, bool]:
  """vit_jax's MLP settings (`gelu_approximate`, `quick_gelu`) of a
  config's `hidden_act`, as timm's (`timm_config.mlp_settings`)."""
  settings = mlp_settings({'mlp_layer': None,
                           'act_layer': _activation(arch, config)})
  return {k: settings[k] for k in ('gelu_approximate', 'quick_gelu')}


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
      layer_norm_eps=vision['layer_norm_eps'],
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
  elif family in ('siglip', 'siglip2'):
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


# Writing (`--layout=transformers`): vit_jax's families that transformers
# computes, as the kind of image tower.
_EXPORTED = {'ViT': 'vit', 'DeiT': 'vit', 'MAE': 'mae', 'DINOv2': 'dinov2',
             'CLIP': 'clip', 'SigLIP': 'siglip', 'SigLIP 2': 'siglip',
             'SigLIP 2 NaFlex': 'siglip2', 'Swin': 'swin',
             'InternViT': 'internvl', 'AIMv2': 'aimv2'}
_ANY, _SET = object(), object()  # any value; any but None
# The ViT settings (the model config's; `transformer.`: the encoder's) that
# transformers' ViT computes; each architecture's differ as `_WRITTEN` says.
_PLAIN = {'classifier': 'token', 'representation_size': None,
          'resnet': None, 'posemb': 'learn', 'posemb_grid': None,
          'fc_norm': False, 'patch_bias': True, 'num_registers': 0,
          'posemb_prefix': True, 'transformer.pre_norm': False,
          'transformer.layerscale_init': None, 'transformer.swiglu': False,
          'transformer.qkv_bias': 'qkv', 'transformer.rope': None,
          'transformer.mlp_norm': False, 'transformer.relative_bias': None,
          'transformer.final_norm': True, 'transformer.norm': 'layer',
          'transformer.qk_norm': None, 'patch_norm': False,
          'transformer.mlp_bias': True, 'transformer.out_bias': True}
_DINOV2 = {'transformer.layerscale_init': _SET, 'transformer.swiglu': _ANY}
_CLIP_TOWER = {'transformer.pre_norm': True, 'patch_bias': False}
# architecture: (model_type, whether it has a head, its settings).
_WRITTEN = {
    'ViTForImageClassification': ('vit', True, {}),
    'ViTModel': ('vit', False, {'representation_size': _ANY}),
    'ViTMAEModel': ('vit_mae', False, {}),
    'DeiTForImageClassificationWithTeacher': (
        'deit', True, {'classifier': 'distilled'}),
    'Dinov2Model': ('dinov2', False, _DINOV2),
    'Dinov2WithRegistersModel': ('dinov2_with_registers', False, dict(
        _DINOV2, num_registers=_ANY, posemb_prefix=False)),
    'CLIPVisionModel': ('clip_vision_model', False, _CLIP_TOWER),
    'CLIPVisionModelWithProjection': ('clip_vision_model', True,
                                      _CLIP_TOWER),
    'SiglipVisionModel': ('siglip_vision_model', False, {'classifier': 'map'}),
    # NaFlex: its square table resized to each image (`posemb_grid`).
    'Siglip2VisionModel': ('siglip2_vision_model', False,
                           {'classifier': 'map', 'posemb_grid': _SET}),
    'SwinForImageClassification': ('swin', True, None),
    # Every token; a class token's model reads the first.
    'InternVLVisionModel': ('internvl_vision', False, {
        'classifier': ('token', 'token_unpooled'),
        'transformer.layerscale_init': _SET, 'transformer.final_norm': _ANY,
        'transformer.norm': _ANY, 'transformer.qk_norm': (None, 'all'),
        'transformer.qkv_bias': ('qkv', 'none')}),
    # Its last_hidden_state, and with 'kv_pool' its head's pooler_output
    # (`use_head`); 'gap' features are the mean of the former.
    'Aimv2VisionModel': ('aimv2_vision_model', False, {
        'classifier': _ANY, 'patch_norm': True, 'transformer.norm': 'rms',
        'transformer.swiglu': True, 'transformer.qkv_bias': 'none',
        'transformer.out_bias': False, 'transformer.mlp_bias': False}),
}
_AIMV2_CLASSIFIERS = ('gap', 'unpooled', 'kv_pool')


def _setting(model: Dict[str, Any], path: str):
  """A setting of a ViT's model config, else its default (vit_jax's
  VisionTransformer's, or its Encoder's for `transformer.`)."""
  config, cls = model, models_vit.VisionTransformer
  if path.startswith('transformer.'):
    config, cls, path = model['transformer'], encoder.Encoder, path[12:]
  if path in config:
    return config[path]
  return cls.__dataclass_fields__[path].default


def _target(kind: str, model: Dict[str, Any], head: bool) -> str:
  """The architecture that a `kind` of tower is written as."""
  if kind == 'swin':
    return 'SwinForImageClassification'
  if kind == 'dinov2':
    return ('Dinov2WithRegistersModel' if _setting(model, 'num_registers')
            else 'Dinov2Model')
  if kind == 'clip':
    return 'CLIPVisionModelWithProjection' if head else 'CLIPVisionModel'
  if kind == 'siglip':
    return 'SiglipVisionModel'
  if kind == 'siglip2':
    return 'Siglip2VisionModel'
  if kind == 'internvl':
    return 'InternVLVisionModel'
  if kind == 'aimv2':
    return 'Aimv2VisionModel'
  if _setting(model, 'classifier') == 'distilled':
    return 'DeiTForImageClassificationWithTeacher'
  if head:
    return 'ViTForImageClassification'
  return 'ViTMAEModel' if kind == 'mae' else 'ViTModel'


def _misfits(arch: str, model: Dict[str, Any]) -> list:
  """The settings of `model` that `arch` does not compute."""
  wrong = []
  for path, want in dict(_PLAIN, **_WRITTEN[arch][2]).items():
    have = _setting(model, path)
    if want is _ANY or (have is not None if want is _SET else
                        have in want if isinstance(want, tuple) else
                        have == want):
      continue
    wrong.append(f'{path}={have!r} (transformers: '
                 f'{"set" if want is _SET else repr(want)})')
  classifier = _setting(model, 'classifier')
  if arch == 'Aimv2VisionModel' and classifier not in _AIMV2_CLASSIFIERS:
    wrong.append(f'classifier={classifier!r} (transformers: one of '
                 f'{_AIMV2_CLASSIFIERS})')
  height, width = model['patches']['size']
  if height != width:
    wrong.append(f'patches.size={height, width} (transformers: square)')
  if arch == 'InternVLVisionModel':
    wrong += _internvl_misfits(model)
  return wrong


def _internvl_misfits(model: Dict[str, Any]) -> list:
  """What InternVLVisionModel's norms do not compute: its query/key norms
  are RMSNorms of epsilon 1e-6, its final norm a LayerNorm."""
  norm = _setting(model, 'transformer.norm')
  eps = _setting(model, 'transformer.layer_norm_eps')
  wrong = []
  if _setting(model, 'transformer.qk_norm') and (norm, eps) != ('rms', 1e-6):
    wrong.append(f"qk_norm with norm={norm!r}, layer_norm_eps={eps} "
                 "(transformers: 'rms', 1e-6)")
  if _setting(model, 'transformer.final_norm') and norm != 'layer':
    wrong.append(f"a final norm after norm={norm!r} blocks (transformers: "
                 'a LayerNorm)')
  return wrong


def _weight_misfits(arch: str, flat: Flat) -> list:
  """What the published weights hold that `arch` does not compute."""
  head, wrong = 'head/kernel' in flat, []
  if head != _WRITTEN[arch][1]:
    wrong.append('a head' if head else 'no head')
  if 'pre_logits/kernel' in flat and arch != 'ViTModel':
    wrong.append("pre_logits (ViTModel's pooler, without a head)")
  if arch == 'CLIPVisionModelWithProjection' and np.any(flat['head/bias']):
    wrong.append("a head bias (visual_projection has none)")
  return wrong


def export_architecture(name: str, model: Dict[str, Any], flat: Flat) -> str:
  """The transformers architecture that computes preset `name` as its
  config dict `model` says, with the published weights `flat`; else one
  ValueError naming what it does not compute."""
  family = registry.family(name).name
  if family not in _EXPORTED:
    raise ValueError(
        f'{name} is of the {family} family, which no transformers '
        'architecture computes; --layout=transformers writes '
        f'{", ".join(_EXPORTED)}.')
  arch = _target(_EXPORTED[family], model, 'head/kernel' in flat)
  wrong = _weight_misfits(arch, flat)
  if arch != 'SwinForImageClassification':
    wrong += _misfits(arch, model)
  if wrong:
    raise ValueError(f"{name} ({family}) cannot be written as transformers' "
                     f'{arch}: it has {"; ".join(wrong)}.')
  return arch


def _hidden_act(quick: bool, approximate: bool) -> str:
  """transformers' name of vit_jax's GELU: QuickGELU, tanh or exact."""
  return 'quick_gelu' if quick else (
      'gelu_pytorch_tanh' if approximate else 'gelu')


def _image_size(model: Dict[str, Any], flat: Flat) -> int:
  """The side whose patches the position table covers: transformers sizes
  its table by `image_size`."""
  table = flat['Transformer/posembed_input/pos_embedding']
  patches = table.shape[1] - models_vit.posemb_prefix_tokens(model)
  grid = math.isqrt(patches)
  if grid * grid != patches:
    raise ValueError(f'The position table of {patches} patches is no square '
                     "grid, which transformers' image_size is.")
  return grid * model['patches']['size'][0]


def _vit_config(kind: str, model: Dict[str, Any], flat: Flat):
  """config.json's settings of a ViT-like tower."""
  t = model['transformer']
  config = dict(
      hidden_size=model['hidden_size'], num_hidden_layers=t['num_layers'],
      num_attention_heads=t['num_heads'], intermediate_size=t['mlp_dim'],
      patch_size=model['patches']['size'][0],
      image_size=_image_size(model, flat),
      layer_norm_eps=float(_setting(model, 'transformer.layer_norm_eps')),
      hidden_act=_hidden_act(_setting(model, 'transformer.quick_gelu'),
                             _setting(model, 'transformer.gelu_approximate')))
  attention = float(_setting(model, 'transformer.attention_dropout_rate'))
  if kind in ('clip', 'siglip', 'siglip2', 'internvl'):
    return dict(config, attention_dropout=attention)
  if kind == 'aimv2':
    config.pop('layer_norm_eps')
    return dict(config, **convert_aimv2.transformers_config(model),
                attention_dropout=attention)
  return dict(config, qkv_bias=True, attention_probs_dropout_prob=attention,
              hidden_dropout_prob=float(
                  _setting(model, 'transformer.dropout_rate')))


def _dinov2_mlp_ratio(width: int, mlp_dim: int, swiglu: bool) -> int:
  """The integer mlp_ratio that transformers' DINOv2 derives `mlp_dim`
  from (its SwiGLU's rounded)."""
  for ratio in range(1, 65):
    hidden = (_swiglu_hidden({'hidden_size': width, 'mlp_ratio': ratio})
              if swiglu else width * ratio)
    if hidden == mlp_dim:
      return ratio
  raise ValueError(f'An MLP of {mlp_dim} at width {width} is no integer '
                   "mlp_ratio, which transformers' DINOv2 takes.")


def _dinov2_config(arch: str, model: Dict[str, Any]) -> Dict[str, Any]:
  swiglu = bool(_setting(model, 'transformer.swiglu'))
  config = dict(
      mlp_ratio=_dinov2_mlp_ratio(model['hidden_size'],
                                  model['transformer']['mlp_dim'], swiglu),
      layerscale_value=float(_setting(model, 'transformer.layerscale_init')),
      use_swiglu_ffn=swiglu)
  if arch == 'Dinov2Model':  # vit_jax drops the mask token on reading
    return dict(config, use_mask_token=False)
  return dict(config, num_register_tokens=model['num_registers'])


def _internvl_config(model: Dict[str, Any]) -> Dict[str, Any]:
  """InternVLVisionModel's settings beyond a ViT's."""
  return dict(
      attention_bias=_setting(model, 'transformer.qkv_bias') == 'qkv',
      use_qk_norm=bool(_setting(model, 'transformer.qk_norm')),
      norm_type={'layer': 'layer_norm', 'rms': 'rms_norm'}[
          _setting(model, 'transformer.norm')],
      layer_scale_init_value=float(
          _setting(model, 'transformer.layerscale_init')),
      use_mean_pooling=not _setting(model, 'transformer.final_norm'),
      hidden_dropout_prob=float(_setting(model, 'transformer.dropout_rate')),
      projection_dropout=0., use_absolute_position_embeddings=True,
      use_mask_token=False)


def _swin_config(model: Dict[str, Any], side: int) -> Dict[str, Any]:
  """config.json's settings of a Swin (vit_jax's: 4x MLPs, relative bias
  only, its LayerNorm epsilon)."""
  depths = [int(d) for d in model['depths']]
  return dict(
      embed_dim=model['embed_dim'], depths=depths,
      num_heads=[int(h) for h in model['num_heads']],
      num_layers=len(depths),
      hidden_size=model['embed_dim'] * 2 ** (len(depths) - 1),
      window_size=model['window_size'], patch_size=model['patch_size'],
      image_size=side, mlp_ratio=4.0, qkv_bias=True,
      use_absolute_embeddings=False,
      layer_norm_eps=float(models_swin.LAYERNORM_EPSILON),
      hidden_act=_hidden_act(False, model['gelu_approximate']),
      hidden_dropout_prob=float(model['dropout_rate']),
      attention_probs_dropout_prob=float(model['attention_dropout_rate']),
      drop_path_rate=float(model['stochastic_depth']))


def _labels(count: int) -> Dict[str, Any]:
  names = [f'LABEL_{i}' for i in range(count)]
  return dict(id2label=dict(enumerate(names)),
              label2id={n: i for i, n in enumerate(names)})


def config_json(arch: str, model: Dict[str, Any], flat: Flat,
                side: int) -> Dict[str, Any]:
  """transformers' config.json of `arch` computing `model` (vit_jax's
  config dict) with the published weights `flat`; `side`: the image size
  of a Swin (a ViT's is its position table's)."""
  kind = ARCHITECTURES[arch][0]
  config = dict(architectures=[arch], model_type=_WRITTEN[arch][0],
                num_channels=3)
  config.update(_swin_config(model, side) if kind == 'swin' else
                _vit_config(kind, model, flat))
  if kind == 'dinov2':
    config.pop('intermediate_size')  # its mlp_ratio says
    config.update(_dinov2_config(arch, model))
  elif kind == 'internvl':
    config.update(_internvl_config(model))
  elif arch == 'CLIPVisionModelWithProjection':
    config['projection_dim'] = flat['head/kernel'].shape[-1]
  elif 'head/kernel' in flat:
    config.update(_labels(flat['head/kernel'].shape[-1]))
  if 'pre_logits/bias' in flat:
    config.update(pooler_output_size=flat['pre_logits/bias'].shape[0],
                  pooler_act='tanh')
  if kind in ('siglip', 'siglip2'):
    config['vision_use_head'] = True
  if kind == 'siglip2':  # its table's patches, not an image size
    config.pop('image_size')
    config['num_patches'] = flat[
        'Transformer/posembed_input/pos_embedding'].shape[1]
  if arch == 'ViTMAEModel':  # the encoder sees every patch, as vit_jax's
    config['mask_ratio'] = 0.
  return config


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
  """A preprocessor_config.json (of any transformers version: completed by
  `transformers_defaults`) as timm's pretrained_cfg keys: resized to `size`
  (both sides, or the short one: `shortest_edge`), then, with
  `do_center_crop`, cropped to `crop_size`."""
  processor = transformers_defaults.complete_processor(processor)
  if 'max_num_patches' in processor:
    return _naflex_transform(processor)
  if 'size' not in processor:
    raise ValueError('preprocessor_config.json gives no size, and its '
                     f'processor ({transformers_defaults.processor_class(processor) or "none named"}) '
                     'is not one whose default is known here.')
  side, mode = _side(processor['size'], 'size')
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


def _naflex_transform(processor: Dict[str, Any]) -> Dict[str, Any]:
  """SigLIP 2's NaFlex processor (`Siglip2ImageProcessor`): each image
  resized, aspect kept, to at most `max_num_patches` patches
  (`data.packing.naflex_grid`). Recorded as its square image: k x k
  patches, k = floor(sqrt(max_num_patches)), which is its grid of a square
  image; `max_num_patches` beside it."""
  patches, patch = int(processor['max_num_patches']), int(
      processor['patch_size'])
  side = math.isqrt(patches) * patch
  out = eval_transform(dict(
      {k: v for k, v in processor.items()
       if k not in ('max_num_patches', 'patch_size')},
      image_processor_type='SiglipImageProcessor',
      size={'height': side, 'width': side}))
  return dict(out, max_num_patches=patches)


# The hub's processor of each way of resizing (google/vit-*,
# facebook/deit-*, openai/clip-*), by (crop_mode, crop).
_PROCESSORS = {('squash', False): 'ViTImageProcessor',
               ('squash', True): 'DeiTImageProcessor',
               ('center', True): 'CLIPImageProcessor'}


def preprocessor_json(spec) -> Dict[str, Any]:
  """preprocessor_config.json of an eval transform (`transform.Transform`):
  the inverse of `eval_transform`. Resized to `scale_size` (the short side
  for 'center', both for 'squash'), then center-cropped to `size` where
  they differ."""
  if spec.crop_mode not in ('center', 'squash'):
    raise ValueError(f"transformers' processors do not resize as crop_mode "
                     f'{spec.crop_mode!r} (the long side, padded).')
  side = spec.scale_size
  crop = spec.crop_mode == 'center' or side != spec.size
  out = dict(image_processor_type=_PROCESSORS[spec.crop_mode, crop],
             do_resize=True,
             size=({'shortest_edge': side} if spec.crop_mode == 'center'
                   else {'height': side, 'width': side}),
             resample={v: k for k, v in _RESAMPLE.items()}[
                 spec.interpolation],
             do_center_crop=crop)
  if crop:
    out['crop_size'] = {'height': spec.size, 'width': spec.size}
  return dict(out, do_rescale=True, rescale_factor=1 / 255,
              do_normalize=True, image_mean=list(spec.mean),
              image_std=list(spec.std), do_convert_rgb=True)


def naflex_preprocessor_json(spec, patch: int,
                             max_num_patches: int) -> Dict[str, Any]:
  """SigLIP 2's `Siglip2ImageProcessor` of an eval transform that squashes
  (`transform.Transform`), at most `max_num_patches` patches of `patch`
  pixels: the inverse of `eval_transform` of one."""
  if spec.crop_mode != 'squash' or spec.scale_size != spec.size:
    raise ValueError("SigLIP 2's NaFlex processor resizes the whole image, "
                     f'without a crop; the transform has crop_mode '
                     f'{spec.crop_mode!r}, crop_pct {spec.crop_pct}.')
  return dict(image_processor_type='Siglip2ImageProcessor', do_resize=True,
              patch_size=patch, max_num_patches=int(max_num_patches),
              resample={v: k for k, v in _RESAMPLE.items()}[
                  spec.interpolation],
              do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
              image_mean=list(spec.mean), image_std=list(spec.std))
