"""Model presets, by the original release's names (e.g. 'ViT-B_16'), and
their families (`FAMILIES`: by name prefix, the model class that builds
them and whose weights they load).
"""

import dataclasses
from typing import Optional

import ml_collections

from vit_jax import cli

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, dropout_rate,
#        classifier)
_VITS = {
    'testing': (10, 10, 2, 1, 16, 0.1, 'token'),
    'testing-unpooled': (10, 10, 2, 1, 16, 0.1, 'unpooled'),
    'ViT-Ti_16': (192, 768, 3, 12, 16, 0.0, 'token'),
    'ViT-S_16': (384, 1536, 6, 12, 16, 0.0, 'token'),
    'ViT-S_32': (384, 1536, 6, 12, 32, 0.0, 'token'),
    'ViT-B_16': (768, 3072, 12, 12, 16, 0.0, 'token'),
    'ViT-B_8': (768, 3072, 12, 12, 8, 0.0, 'token'),
    'ViT-B_32': (768, 3072, 12, 12, 32, 0.0, 'token'),
    'ViT-L_16': (1024, 4096, 16, 24, 16, 0.1, 'token'),
    'ViT-L_32': (1024, 4096, 16, 24, 32, 0.0, 'token'),
    'ViT-H_14': (1280, 5120, 16, 32, 14, 0.1, 'token'),
    'ViT-B_16-gap-norep': (768, 3072, 12, 12, 16, 0.0, 'gap'),
    'ViT-B_32-gap-norep': (768, 3072, 12, 12, 32, 0.0, 'gap'),
    'ViT-S_16-gap-norep': (384, 1536, 6, 12, 16, 0.0, 'gap'),
    'ViT-S_32-gap-norep': (384, 1536, 6, 12, 32, 0.0, 'gap'),
}

# Hybrids: the ViT `base` on a ResNet with `num_layers` units per stage. The
# ResNet root (stride-2 conv, stride-2 max-pool) downsamples 4x and each
# stage after the first another 2x (`posemb.resnet_stride`).
# name: (base, patch, num_layers, dropout_rate)
_HYBRIDS = {
    # Root alone with 8x8 patches: an effective patch of 32 (a 7x7 grid at
    # 224 px), as the original's preset, despite the name.
    'R+ViT-Ti_16': ('ViT-Ti_16', 8, (), 0.0),
    # Four stages of 2 units: 4 * 2**3 = 32.
    'R26+ViT-S_32': ('ViT-S_16', 1, (2, 2, 2, 2), 0.0),
    'R26+ViT-B_32': ('ViT-B_32', 1, (2, 2, 2, 2), 0.0),
    # (3, 4, 9) instead of ResNet-50's (3, 4, 6, 3) keeps the same depth at a
    # downsampling of 4 * 2**2 = 16.
    'R50+ViT-B_16': ('ViT-B_16', 1, (3, 4, 9), 0.1),
    # The stages of ResNet-50: 4 * 2**3 = 32.
    'R50+ViT-L_32': ('ViT-L_16', 1, (3, 4, 6, 3), 0.1),
}

# DeiT (Touvron et al., 2021): ViTs with timm's exact GELU, each also with
# the distillation token and its head ('-distilled', classifier='distilled').
# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_DEITS = {
    'DeiT-testing': (32, 64, 2, 2, 8),
    'DeiT-Ti_16': (192, 768, 3, 12, 16),
    'DeiT-S_16': (384, 1536, 6, 12, 16),
    'DeiT-B_16': (768, 3072, 12, 12, 16),
}

# timm's self-supervised and DeiT III ViTs: exact GELU, class token, no
# dropout. DINOv2 (Oquab et al., 2023) has LayerScale 1e-5 and each a
# '-reg4' twin with 4 registers (Darcet et al., 2024) and a table without
# the prefix tokens; DINOv2-g's MLP is a SwiGLU. DeiT III (Touvron et al.,
# 2022) has LayerScale 1e-6 and a table without the class token. MAE (He et
# al., 2022) encoders are plain ViTs. The 'testing' presets match small
# timm models made for the golden files.
# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_DINOV2S = {
    'DINOv2-testing': (32, 64, 2, 2, 14),
    'DINOv2-S_14': (384, 1536, 6, 12, 14),
    'DINOv2-B_14': (768, 3072, 12, 12, 14),
    'DINOv2-L_14': (1024, 4096, 16, 24, 14),
    # timm's fc1 of 8192 features: both halves of the SwiGLU.
    'DINOv2-g_14': (1536, 4096, 24, 40, 14),
}
_DEIT3S = {
    'DeiT3-testing': (32, 64, 2, 2, 16),
    'DeiT3-S_16': (384, 1536, 6, 12, 16),
    'DeiT3-M_16': (512, 2048, 8, 12, 16),
    'DeiT3-B_16': (768, 3072, 12, 12, 16),
    'DeiT3-L_16': (1024, 4096, 16, 24, 16),
    'DeiT3-H_14': (1280, 5120, 16, 32, 14),
}
_MAES = {
    'MAE-testing': (32, 64, 2, 2, 16),
    'MAE-B_16': (768, 3072, 12, 12, 16),
    'MAE-L_16': (1024, 4096, 16, 24, 16),
    'MAE-H_14': (1280, 5120, 16, 32, 14),
}

# The encoders of docs/families.md, as timm builds them. CLIP (Radford et
# al., 2021): a LayerNorm before the blocks, no patch bias, LayerNorm eps
# 1e-5; '-quickgelu': OpenAI's QuickGELU. SigLIP (Zhai et al., 2023): no
# class token, MAP head, tanh GELU; '-gap': mean pooling. EVA-02 (Fang et
# al., 2024): q and v biases only, SwiGLU (B and L: with its inner norm),
# 2-D RoPE on a 16x16 reference grid beside a learned table, patch mean
# with fc_norm. DINOv3 (Simeoni et al., 2025): no table, DINOv3's RoPE, 4
# registers, LayerScale 1e-5, eps 1e-5, no q/k/v biases ('-qkvb': q and v),
# patch mean as timm (classifier='token' for the original's class token).
# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_CLIPS = {
    'CLIP-testing': (32, 64, 2, 2, 16),
    'CLIP-B_32': (768, 3072, 12, 12, 32),
    'CLIP-B_16': (768, 3072, 12, 12, 16),
    'CLIP-L_14': (1024, 4096, 16, 24, 14),
}
_SIGLIPS = {
    'SigLIP-testing': (32, 64, 2, 2, 16),
    'SigLIP-B_16': (768, 3072, 12, 12, 16),
    'SigLIP-L_16': (1024, 4096, 16, 24, 16),
    'SigLIP-So400m_14': (1152, 4304, 16, 27, 14),
}
# EVA-02's mlp_dim is each SwiGLU half: int(D * 8 / 3).
_EVA02S = {
    'EVA02-testing': (32, 64, 2, 2, 14, False),
    'EVA02-Ti_14': (192, 512, 3, 12, 14, False),
    'EVA02-S_14': (384, 1024, 6, 12, 14, False),
    'EVA02-B_14': (768, 2048, 12, 12, 14, True),
    'EVA02-L_14': (1024, 2730, 16, 24, 14, True),
}
_DINOV3S = {
    'DINOv3-testing': (32, 64, 2, 2, 16),
    'DINOv3-S_16': (384, 1536, 6, 12, 16),
    'DINOv3-B_16': (768, 3072, 12, 12, 16),
    'DINOv3-L_16': (1024, 4096, 16, 24, 16),
}

# BiT's ResNet-v2 classifiers (Kolesnikov et al., 2020), named as BiT's
# R50x1...: ResNet-depth x width factor (models_resnet.ResNetV2).
# name: (units per stage, width_factor)
_BITS = {
    'BiT-testing': ((1, 1), 0.5),
    'BiT-R26x1': ((2, 2, 2, 2), 1),
    'BiT-R50x1': ((3, 4, 6, 3), 1),
    'BiT-R50x3': ((3, 4, 6, 3), 3),
    'BiT-R101x1': ((3, 4, 23, 3), 1),
    'BiT-R152x2': ((3, 8, 36, 3), 2),
}

# MLP-Mixer (Tolstikhin et al., 2021).
# name: (hidden_dim, num_blocks, tokens_mlp_dim, channels_mlp_dim, patch)
_MIXERS = {
    'Mixer-testing': (16, 2, 8, 32, 16),
    'Mixer-B_16': (768, 12, 384, 3072, 16),
    'Mixer-B_32': (768, 12, 384, 3072, 32),
    'Mixer-L_16': (1024, 24, 512, 4096, 16),
}

# Swin Transformer (Liu et al., 2021), timm's swin_*_patch4_window7_224
# (models_swin). 'Swin-testing' matches the small timm model of the golden
# files (scripts/make_swin_golden.py).
# name: (embed_dim, depths, num_heads, patch, window)
_SWINS = {
    'Swin-testing': (4, (2, 2, 2, 2), (1, 2, 2, 4), 2, 2),
    'Swin-T': (96, (2, 2, 6, 2), (3, 6, 12, 24), 4, 7),
    'Swin-S': (96, (2, 2, 18, 2), (3, 6, 12, 24), 4, 7),
    'Swin-B': (128, (2, 2, 18, 2), (4, 8, 16, 32), 4, 7),
    # timm's swin_base_patch4_window12_384: windows of 12 at 384 px.
    'Swin-B_384': (128, (2, 2, 18, 2), (4, 8, 16, 32), 4, 12),
}

# LiT (Zhai et al., 2022): a locked ViT and a text tower (models_lit); BERT
# towers read the BERT tokenizer's ids, text transformers SentencePiece's.
# name: (image preset, out_dim (image, text), text_model, text)
_TEXT_S = dict(width=384, num_layers=12, mlp_dim=1536, num_heads=6,
               vocab_size=16_000)
_TEXT_TI = dict(width=192, num_layers=12, mlp_dim=768, num_heads=3,
                vocab_size=16_000)
_LITS = {
    'LiT-B16B': ('ViT-B_16', (768, 768), 'bert', {'config': 'base'}),
    # Trained twice as long, without the image projection.
    'LiT-B16B_2': ('ViT-B_16', (None, 768), 'bert', {'config': 'base'}),
    'LiT-L16L': ('ViT-L_16', (None, 1024), 'bert', {'config': 'large'}),
    'LiT-L16S': ('ViT-L_16', (None, 1024), 'text_transformer', _TEXT_S),
    'LiT-L16Ti': ('ViT-L_16', (None, 1024), 'text_transformer', _TEXT_TI),
}


def _vit(name, hidden, mlp, heads, layers, patch, dropout, classifier):
  """A ViT ConfigDict with the original's fields."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patches': {'size': (patch, patch)},
      'hidden_size': hidden,
      'transformer': {
          'mlp_dim': mlp,
          'num_heads': heads,
          'num_layers': layers,
          'attention_dropout_rate': 0.0,
          'dropout_rate': dropout,
          # Position embedding (Appendix D.4) and stochastic depth options,
          # at the paper's values; listed so that they can be set on a
          # locked preset (as is `posemb` below).
          'relative_max_distance': 8,
          'stochastic_depth': 0.0,
          # Memory savers (docs/performance.md).
          'remat_policy': 'none',
          'scan': False,
          # timm's models' options (`_timm_vit`), off for Google's.
          'gelu_approximate': True,
          # A typed None, which a command line can set.
          'layerscale_init': ml_collections.config_dict.placeholder(float),
          'swiglu': False,
      },
      'classifier': classifier,
      'representation_size': None,
      'posemb': 'learn',
      'num_registers': 0,
      'posemb_prefix': True,
      'fc_norm': False,
      'dtype': 'float32',  # of the computation; parameters stay float32
  })


def _hybrid(name, base, patch, num_layers, dropout):
  """The ViT preset `base` on a ResNet, with its own patch and dropout."""
  config = _vit(name, *_VITS[base])
  config.patches.size = (patch, patch)
  config.transformer.dropout_rate = dropout
  config.resnet = ml_collections.ConfigDict(
      {'num_layers': num_layers, 'width_factor': 1})
  return config


def _deits(name, hidden, mlp, heads, layers, patch):
  """The DeiT preset `name` and its '-distilled' twin."""
  for suffix, classifier in (('', 'token'), ('-distilled', 'distilled')):
    config = _vit(name + suffix, hidden, mlp, heads, layers, patch, 0.0,
                  classifier)
    config.transformer.gelu_approximate = False
    yield config


def _timm_vit(name, hidden, mlp, heads, layers, patch, layerscale_init=None,
              posemb_prefix=True, num_registers=0):
  """A ViT preset of timm's weights: exact GELU, class token, no dropout."""
  config = _vit(name, hidden, mlp, heads, layers, patch, 0.0, 'token')
  config.transformer.gelu_approximate = False
  config.transformer.layerscale_init = layerscale_init
  config.transformer.swiglu = name.startswith('DINOv2-g')
  config.posemb_prefix = posemb_prefix
  config.num_registers = num_registers
  return config


def _dinov2s(name, *row):
  """The DINOv2 preset `name` and its '-reg4' twin (4 registers)."""
  yield _timm_vit(name, *row, layerscale_init=1e-5)
  yield _timm_vit(name + '-reg4', *row, layerscale_init=1e-5,
                  posemb_prefix=False, num_registers=4)


def _clips(name, *row):
  """The CLIP image tower `name` and its '-quickgelu' twin (OpenAI's)."""
  for suffix in ('', '-quickgelu'):
    config = _timm_vit(name + suffix, *row)
    config.patch_bias = False
    config.transformer.update(pre_norm=True, layer_norm_eps=1e-5,
                              quick_gelu=bool(suffix))
    yield config


def _siglips(name, *row):
  """The SigLIP image tower `name` (MAP head) and its '-gap' twin."""
  for suffix, classifier in (('', 'map'), ('-gap', 'gap')):
    yield _vit(name + suffix, *row, 0.0, classifier)


def _eva02(name, *row_and_mlp_norm):
  """An EVA-02 encoder: timm's Eva at its eva02_*_patch14_224 settings."""
  *row, mlp_norm = row_and_mlp_norm
  config = _timm_vit(name, *row)
  config.classifier, config.fc_norm = 'token_gap', True
  config.transformer.update(swiglu=True, mlp_norm=mlp_norm, qkv_bias='qv',
                            rope='eva02', rope_theta=10_000.,
                            rope_ref_grid=(16, 16))
  return config


def _dinov3s(name, *row):
  """The DINOv3 encoder `name` and its '-qkvb' twin."""
  for suffix, qkv_bias in (('', 'none'), ('-qkvb', 'qv')):
    config = _timm_vit(name + suffix, *row, layerscale_init=1e-5,
                       num_registers=4)
    config.classifier, config.posemb = 'token_gap', 'none'
    config.transformer.update(qkv_bias=qkv_bias, layer_norm_eps=1e-5,
                              rope='dinov3', rope_theta=100.)
    yield config


def _bit(name, num_layers, width_factor):
  """A BiT ResNet-v2 ConfigDict."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'num_layers': num_layers,
      'width_factor': width_factor,
      'dtype': 'float32',
  })


def _mixer(name, hidden, blocks, tokens_mlp, channels_mlp, patch):
  """An MLP-Mixer ConfigDict with the original's fields."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patches': {'size': (patch, patch)},
      'hidden_dim': hidden,
      'num_blocks': blocks,
      'tokens_mlp_dim': tokens_mlp,
      'channels_mlp_dim': channels_mlp,
      'dtype': 'float32',
  })


def _swin(name, embed_dim, depths, num_heads, patch, window):
  """A Swin ConfigDict: timm's exact GELU, no dropout."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patch_size': patch,
      'embed_dim': embed_dim,
      'depths': depths,
      'num_heads': num_heads,
      'window_size': window,
      'dropout_rate': 0.0,
      'attention_dropout_rate': 0.0,
      'stochastic_depth': 0.0,
      'gelu_approximate': False,
      'dtype': 'float32',
  })


def _lit(name, image, out_dim, text_model, text):
  """A LiT ConfigDict with the original's fields, plus the loss's inits."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'image': _vit(image, *_VITS[image]),
      'out_dim': out_dim,
      'text_model': text_model,
      'text': dict(text),
      'pp': {'tokenizer_name': 'bert' if text_model == 'bert' else
                               'sentencepiece', 'size': 224, 'max_len': 16},
      # The published models store log(t); these only set a fresh model's.
      'temperature_init': 1.0,
      'bias_init': None,  # a float adds SigLIP's learned bias `b`
  })


@dataclasses.dataclass(frozen=True)
class Family:
  """The presets whose names start with `prefix`.

  Attributes:
    prefix: '' for every name no other family claims (ViTs, hybrids).
    model: the class in `vit_jax.models` that builds them.
    weights: whose published weights they load: 'google' (inputs in
      [-1, 1], position tables resized bicubic) or 'timm' (ImageNet's mean
      and std, timm's antialiased bicubic).
    normalization: the key of the inputs' mean and std in NORMALIZATIONS,
      where it is not the weights' source's (CLIP's for CLIP and EVA-02).
    native: the image side of the published weights; None for a model
      that takes any (or a fixed token count).
  """
  prefix: str
  model: str
  weights: str = 'google'
  native: Optional[int] = 224
  normalization: Optional[str] = None


# The families, registered once; the first whose prefix matches wins.
FAMILIES = (
    Family('LiT-', 'LitModel', native=None),
    Family('BiT-', 'ResNetV2', native=None),
    Family('Mixer-', 'MlpMixer', native=None),
    Family('Swin-', 'SwinTransformer', 'timm'),
    Family('DeiT-', 'VisionTransformer', 'timm'),
    Family('DeiT3-', 'VisionTransformer', 'timm'),
    Family('DINOv2-', 'VisionTransformer', 'timm', native=518),
    Family('MAE-', 'VisionTransformer', 'timm'),
    Family('CLIP-', 'VisionTransformer', 'timm', normalization='clip'),
    Family('SigLIP-', 'VisionTransformer'),
    Family('EVA02-', 'VisionTransformer', 'timm', normalization='clip'),
    Family('DINOv3-', 'VisionTransformer', 'timm'),
    Family('', 'VisionTransformer'),
)


def family(name: str) -> Family:
  """The family of a preset or custom model name."""
  return next(f for f in FAMILIES if name.startswith(f.prefix))


# Pixel mean and std (of pixels in [0, 1]) that a preset's weights expect:
# Google's checkpoints take [-1, 1]; timm's ImageNet's statistics. The
# models never normalize; the data pipelines, predict and analysis do.
NORMALIZATIONS = {'google': ((0.5,) * 3, (0.5,) * 3),
                  'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                  'clip': ((0.48145466, 0.4578275, 0.40821073),
                           (0.26862954, 0.26130258, 0.27577711))}


def weights_source(name: str) -> str:
  """'timm' for the presets of timm's weights (DeiT, DeiT III, DINOv2,
  MAE, Swin), else 'google'."""
  return family(name).weights


def input_normalization(name: str):
  """(mean, std) of the inputs that the preset `name` expects."""
  key = family(name).normalization or (
      'imagenet' if weights_source(name) == 'timm' else 'google')
  return NORMALIZATIONS[key]


def posemb_resize_method(name: str) -> str:
  """How a preset's position table is resized to a new grid: as its
  weights' source does (timm's antialiased bicubic, or Google's bicubic)."""
  return 'bicubic_antialias' if weights_source(name) == 'timm' else 'bicubic'


def native_resolution(name: str) -> Optional[int]:
  """The image side of the preset's published weights (DINOv2: 518 px,
  '..._384': 384 px, other ViTs and Swins 224 px); None for other models
  and custom names."""
  if name not in MODEL_CONFIGS or family(name).native is None:
    return None
  return 384 if name.endswith('_384') else family(name).native


class UnknownPreset(KeyError, ValueError):
  """A preset name that does not exist; says the closest ones."""

  def __str__(self):
    return self.args[0]


class Presets(dict):
  """The presets by name; an unknown name raises `UnknownPreset` (a
  KeyError that the command lines print as one line)."""

  def __missing__(self, name):
    raise UnknownPreset(cli.closest(name, self, 'model preset'))


# Locked: a typo in an override fails at once instead of adding a field.
MODEL_CONFIGS = Presets({
    config.model_name: config.lock() for config in [
        *(_vit(name, *row) for name, row in _VITS.items()),
        *(_hybrid(name, *row) for name, row in _HYBRIDS.items()),
        *(config for name, row in _DEITS.items()
          for config in _deits(name, *row)),
        *(config for name, row in _DINOV2S.items()
          for config in _dinov2s(name, *row)),
        *(_timm_vit(name, *row, layerscale_init=1e-6, posemb_prefix=False)
          for name, row in _DEIT3S.items()),
        *(_timm_vit(name, *row) for name, row in _MAES.items()),
        *(config for name, row in _CLIPS.items()
          for config in _clips(name, *row)),
        *(config for name, row in _SIGLIPS.items()
          for config in _siglips(name, *row)),
        *(_eva02(name, *row) for name, row in _EVA02S.items()),
        *(config for name, row in _DINOV3S.items()
          for config in _dinov3s(name, *row)),
        *(_bit(name, *row) for name, row in _BITS.items()),
        *(_mixer(name, *row) for name, row in _MIXERS.items()),
        *(_swin(name, *row) for name, row in _SWINS.items()),
        *(_lit(name, *row) for name, row in _LITS.items()),
    ]
})
