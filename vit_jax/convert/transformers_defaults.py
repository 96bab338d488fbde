"""transformers' defaults, for what a hub folder's files leave out.

Hub repositories hold the files of every transformers version since 2021:
a `config.json` may give only what differs from its class's defaults (a
SigLIP `vision_config` with its sizes alone), and a
`preprocessor_config.json` may be a feature extractor's
(`feature_extractor_type`, `size` and `crop_size` as numbers). The readers
complete both from these tables, as transformers does, before reading a
value. They are transformers 5.23's defaults:
`scripts/make_transformers_golden.py` writes its classes' own to
`tests/data/transformers_defaults.json`, against which the tests hold them.
"""

import copy
import json
import os
from typing import Any, Dict, Optional, Sequence

_TOWER = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
              intermediate_size=3072, image_size=224, patch_size=16,
              num_channels=3)
_VIT = dict(_TOWER, hidden_act='gelu', layer_norm_eps=1e-12, qkv_bias=True)
_DINOV2 = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
               hidden_act='gelu', layer_norm_eps=1e-6, image_size=224,
               patch_size=14, num_channels=3, qkv_bias=True, mlp_ratio=4,
               layerscale_value=1.0, use_swiglu_ffn=False)
_TEXT = dict(num_hidden_layers=12, pad_token_id=1, bos_token_id=49406,
             eos_token_id=49407)

# Each config class's defaults, by `model_type`.
CONFIGS = {
    'vit': dict(_VIT, pooler_act='tanh'),
    'deit': dict(_VIT, pooler_act='tanh'),
    'vit_mae': dict(_VIT),
    'dinov2': _DINOV2,
    'dinov2_with_registers': dict(_DINOV2, patch_size=16,
                                  num_register_tokens=4),
    'clip': dict(projection_dim=512, logit_scale_init_value=2.6592),
    'clip_vision_model': dict(
        _TOWER, hidden_act='quick_gelu', layer_norm_eps=1e-5, patch_size=32,
        projection_dim=512),
    'clip_text_model': dict(
        _TEXT, hidden_size=512, num_attention_heads=8, intermediate_size=2048,
        hidden_act='quick_gelu', layer_norm_eps=1e-5, projection_dim=512,
        max_position_embeddings=77, vocab_size=49408),
    'siglip': {},
    'siglip_vision_model': dict(
        _TOWER, hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6,
        vision_use_head=True),
    'siglip_text_model': dict(
        _TEXT, hidden_size=768, num_attention_heads=12,
        intermediate_size=3072, hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=1e-6, max_position_embeddings=64, vocab_size=32000),
    # SigLIP 2: SigLIP's towers; the NaFlex table's size in patches.
    'siglip2': {},
    'siglip2_vision_model': dict(
        {k: v for k, v in _TOWER.items() if k != 'image_size'},
        hidden_act='gelu_pytorch_tanh', layer_norm_eps=1e-6,
        vision_use_head=True, num_patches=256),
    'siglip2_text_model': dict(
        _TEXT, hidden_size=768, num_attention_heads=12,
        intermediate_size=3072, hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=1e-6, max_position_embeddings=64, vocab_size=32000),
    # InternViT: 300M's sizes, without query/key/value biases.
    'internvl_vision': dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, attention_bias=False, use_qk_norm=False,
        hidden_act='gelu', norm_type='layer_norm', layer_norm_eps=1e-6,
        image_size=[448, 448], patch_size=[14, 14], num_channels=3,
        use_absolute_position_embeddings=True, layer_scale_init_value=0.1,
        use_mean_pooling=True),
    # AIMv2: its L/14 at 224 px; the two-tower model's LiT text tower.
    'aimv2': dict(projection_dim=512, logit_scale_init_value=2.6592,
                  max_logit_scale=100.0),
    'aimv2_vision_model': dict(
        hidden_size=1024, intermediate_size=2816, num_hidden_layers=24,
        num_attention_heads=8, num_channels=3, image_size=224, patch_size=14,
        hidden_act='silu', rms_norm_eps=1e-5, qkv_bias=False, mlp_bias=False,
        use_head=True, is_native=False),
    'aimv2_text_model': dict(
        vocab_size=49408, hidden_size=768, intermediate_size=2048,
        num_hidden_layers=12, num_attention_heads=6,
        max_position_embeddings=77, hidden_act='silu', eos_token_id=49407,
        rms_norm_eps=1e-5, qkv_bias=False, mlp_bias=False),
    # Video: ViViT's 32 frames in tubelets of 2x16x16, VideoMAE's 16 of 2x16.
    'vivit': dict(
        {k: v for k, v in _TOWER.items() if k != 'patch_size'},
        num_frames=32, tubelet_size=[2, 16, 16], hidden_act='gelu_fast',
        layer_norm_eps=1e-6, qkv_bias=True, pooler_act='tanh'),
    'videomae': dict(_TOWER, num_frames=16, tubelet_size=2, hidden_act='gelu',
                     layer_norm_eps=1e-12, qv_bias=True,
                     use_mean_pooling=True),
    'swin': dict(image_size=224, patch_size=4, num_channels=3, embed_dim=96,
                 depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                 window_size=7, mlp_ratio=4.0, qkv_bias=True,
                 hidden_act='gelu', use_absolute_embeddings=False,
                 layer_norm_eps=1e-5),
}
# A two-tower config's towers, each a config of its own `model_type`.
SUB_CONFIGS = {
    'clip': {'vision_config': 'clip_vision_model',
             'text_config': 'clip_text_model'},
    'siglip': {'vision_config': 'siglip_vision_model',
               'text_config': 'siglip_text_model'},
    'siglip2': {'vision_config': 'siglip2_vision_model',
                'text_config': 'siglip2_text_model'},
    'aimv2': {'vision_config': 'aimv2_vision_model',
              'text_config': 'aimv2_text_model'},
}


def complete_config(config: Dict[str, Any]) -> Dict[str, Any]:
  """`config` with the defaults of its `model_type` (and its towers') for
  what it leaves out; a model type not in `CONFIGS` as it is."""
  out = dict(CONFIGS.get(config.get('model_type'), {}), **config)
  for key, model_type in SUB_CONFIGS.get(config.get('model_type'), {}).items():
    tower = {'model_type': model_type, **(out.get(key) or {})}
    out[key] = {**CONFIGS.get(tower['model_type'], {}), **tower}
  return copy.deepcopy(out)


_IMAGENET_HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
_CLIP = dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
             image_std=[0.26862954, 0.26130258, 0.27577711])
_SQUARE = lambda n: {'height': n, 'width': n}
_COMMON = dict(do_resize=True, do_rescale=True, rescale_factor=1 / 255,
               do_normalize=True, do_center_crop=False, crop_size=None)
# Each image processor's defaults, and whether a number as its `size`
# means both sides (True) or the short side (transformers' `get_size_dict`
# with `default_to_square`); a number as `crop_size` is always both sides.
PROCESSORS = {
    'ViTImageProcessor': (True, dict(
        _COMMON, size=_SQUARE(224), resample=2, **_IMAGENET_HALF)),
    'DeiTImageProcessor': (True, dict(
        _COMMON, size=_SQUARE(256), resample=3, do_center_crop=True,
        crop_size=_SQUARE(224), **_IMAGENET_HALF)),
    'CLIPImageProcessor': (False, dict(
        _COMMON, size={'shortest_edge': 224}, resample=3,
        do_center_crop=True, crop_size=_SQUARE(224), **_CLIP)),
    'BitImageProcessor': (False, dict(
        _COMMON, size={'shortest_edge': 224}, resample=3,
        do_center_crop=True, crop_size=_SQUARE(224), **_CLIP)),
    'SiglipImageProcessor': (True, dict(
        _COMMON, size=_SQUARE(224), resample=3, **_IMAGENET_HALF)),
    # Video: each frame as an image. ViViT's rescale has an `offset`: x *
    # rescale_factor - 1, then its mean and std.
    'VivitImageProcessor': (False, dict(
        _COMMON, size={'shortest_edge': 256}, resample=2,
        do_center_crop=True, crop_size=_SQUARE(224), rescale_factor=1 / 127.5,
        offset=True, **_IMAGENET_HALF)),
    'VideoMAEImageProcessor': (False, dict(
        _COMMON, size={'shortest_edge': 224}, resample=2,
        do_center_crop=True, crop_size=_SQUARE(224), **_IMAGENET_HALF)),
    # NaFlex: each image resized to at most `max_num_patches` patches.
    'Siglip2ImageProcessor': (True, dict(
        _COMMON, resample=2, patch_size=16, max_num_patches=256,
        **_IMAGENET_HALF)),
}


def processor_class(processor: Dict[str, Any]) -> str:
  """The image processor a preprocessor_config.json is for, by today's
  name: a feature extractor's is its processor's; the fast and PIL
  variants read the file alike."""
  name = (processor.get('image_processor_type') or
          processor.get('feature_extractor_type') or '')
  name = name.replace('FeatureExtractor', 'ImageProcessor')
  for suffix in ('Fast', 'Pil'):
    name = name[:-len(suffix)] if name.endswith(suffix) else name
  return name


def complete_processor(processor: Dict[str, Any]) -> Dict[str, Any]:
  """`processor` in today's form: its class's defaults for what it leaves
  out, and `size`/`crop_size` given as numbers read as that class reads
  them. Raises ValueError where a number's meaning depends on a class
  that is not known here."""
  name = processor_class(processor)
  square, defaults = PROCESSORS.get(name, (None, {}))
  out = dict(defaults, **processor)
  for key in ('size', 'crop_size'):
    if not isinstance(out.get(key), (int, float)):
      continue
    if square is None:
      raise ValueError(
          f"preprocessor_config.json gives {key}={out[key]} as a number, "
          f"whose meaning depends on the processor ({name or 'none named'}"
          f'); known: {", ".join(PROCESSORS)}.')
    n = int(out[key])
    out[key] = (_SQUARE(n) if square or key == 'crop_size'
                else {'shortest_edge': n})
  return out


def read_processor(folder: str, names: Sequence[str] = (
    'preprocessor_config.json',)) -> Optional[Dict[str, Any]]:
  """The first of the processor files `names` in `folder`, as written (no
  defaults added); None where there is none."""
  for name in names:
    path = os.path.join(folder, name)
    if os.path.exists(path):
      with open(path) as f:
        return json.load(f)
  return None
