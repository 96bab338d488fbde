"""Every preset's parameter count, and a model package without the data
stack."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tests import helpers
from vit_jax import models
from vit_jax.models import registry

ROOT = helpers.ROOT

# Parameters at 224 px with 1000 classes (LiT: as the preset is). The ViTs,
# hybrids and Mixers but 'Mixer-testing' are the original release's
# (vit_jax/models_test.py). DeiT and BiT: timm's counts of
# deit_{tiny,small,base}[_distilled]_patch16_224 and
# resnetv2_{50x1,50x3,101x1,152x2}_bit (timm 1.0); BiT-R26x1 and BiT-testing
# timm's ResNetV2(layers=(2, 2, 2, 2)) and (layers=(1, 1),
# channels=(256, 512), width_factor=0.5), stem_type='fixed'; DeiT-testing
# timm's DeiT of its shapes at 32 px plus 768 patches' position entries.
# DINOv2, DeiT III and MAE: timm's counts (timm 1.0.31, img_size=224,
# num_classes=1000) of vit_{small,base,large,giant}_patch14[_reg4]_dinov2,
# deit3_{small,medium,base,large}_patch16_224, deit3_huge_patch14_224 and
# vit_{base,large}_patch16_224.mae, vit_huge_patch14_224.mae; the 'testing'
# ones timm's VisionTransformer(embed_dim=32, depth=2, num_heads=2,
# mlp_ratio=2) with the preset's patch, init_values, reg_tokens and
# no_embed_class.
MODEL_SIZES = {
    'BiT-R101x1': 44_541_480,
    'BiT-R152x2': 236_335_208,
    'BiT-R26x1': 15_987_496,
    'BiT-R50x1': 25_549_352,
    'BiT-R50x3': 217_319_080,
    'BiT-testing': 375_560,
    'DeiT-B_16': 86_567_656,
    'DeiT-B_16-distilled': 87_338_192,
    'DeiT-S_16': 22_050_664,
    'DeiT-S_16-distilled': 22_436_432,
    'DeiT-Ti_16': 5_717_416,
    'DeiT-Ti_16-distilled': 5_910_800,
    'DeiT-testing': 81_480,
    'DeiT-testing-distilled': 114_544,
    'DeiT3-B_16': 86_585_320,
    'DeiT3-H_14': 632_126_440,
    'DeiT3-L_16': 304_374_760,
    'DeiT3-M_16': 38_849_512,
    'DeiT3-S_16': 22_059_496,
    'DeiT3-testing': 81_192,
    'DINOv2-B_14': 86_493_928,
    'DINOv2-B_14-reg4': 86_496_232,
    'DINOv2-L_14': 304_252_904,
    'DINOv2-L_14-reg4': 304_255_976,
    'DINOv2-S_14': 22_013_800,
    'DINOv2-S_14-reg4': 22_014_952,
    'DINOv2-g_14': 1_136_306_664,
    'DINOv2-g_14-reg4': 1_136_311_272,
    'DINOv2-testing': 77_384,
    'DINOv2-testing-reg4': 77_480,
    'LiT-B16B': 195_871_489,
    'LiT-B16B_2': 195_280_897,
    'LiT-L16L': 638_443_521,
    'LiT-L16S': 331_140_353,
    'LiT-L16Ti': 311_913_089,
    'MAE-B_16': 86_567_656,
    'MAE-H_14': 632_045_800,
    'MAE-L_16': 304_326_632,
    'MAE-testing': 81_096,
    'Mixer-B_16': 59_880_472,
    'Mixer-B_32': 60_293_428,
    'Mixer-L_16': 208_196_168,
    'Mixer-testing': 38_288,
    'R+ViT-Ti_16': 6_337_704,
    'R26+ViT-B_32': 101_383_976,
    'R26+ViT-S_32': 36_431_912,
    'R50+ViT-B_16': 98_659_112,
    'R50+ViT-L_32': 328_994_856,
    'ViT-B_8': 86_576_872,
    'ViT-B_16': 86_567_656,
    'ViT-B_16-gap-norep': 86_566_120,
    'ViT-B_32': 88_224_232,
    'ViT-B_32-gap-norep': 88_222_696,
    'ViT-H_14': 632_045_800,
    'ViT-L_16': 304_326_632,
    'ViT-L_32': 306_535_400,
    'ViT-S_16': 22_050_664,
    'ViT-S_16-gap-norep': 22_049_896,
    'ViT-S_32': 22_878_952,
    'ViT-S_32-gap-norep': 22_878_184,
    'ViT-Ti_16': 5_717_416,
    'testing': 21_390,
    'testing-unpooled': 21_370,
    # timm's counts (timm 1.0.31, img_size=224, num_classes=1000) of
    # vit_{base_patch32,base_patch16,large_patch14}_clip[_quickgelu]_224,
    # vit_{base_patch16,large_patch16,so400m_patch14}_siglip[_gap]_{224,
    # 256,224}, eva02_{tiny,small,base,large}_patch14_224 and
    # vit_{small,base,large}_patch16_dinov3[_qkvb]; the 'testing' ones of
    # the same entrypoints at embed_dim=32, depth=2, num_heads=2,
    # mlp_ratio=2 (count/NAME in tests/data/timm_families_golden.npz).
    'CLIP-B_32': 88_225_000,
    'CLIP-B_32-quickgelu': 88_225_000,
    'CLIP-B_16': 86_568_424,
    'CLIP-B_16-quickgelu': 86_568_424,
    'CLIP-L_14': 304_204_776,
    'CLIP-L_14-quickgelu': 304_204_776,
    'CLIP-testing': 81_128,
    'CLIP-testing-quickgelu': 81_128,
    'SigLIP-B_16': 93_653_224,
    'SigLIP-B_16-gap': 86_566_120,
    'SigLIP-L_16': 316_919_784,
    'SigLIP-L_16-gap': 304_324_584,
    'SigLIP-So400m_14': 428_833_704,
    'SigLIP-So400m_14-gap': 413_595_352,
    'SigLIP-testing': 89_544,
    'SigLIP-testing-gap': 81_032,
    'EVA02-Ti_14': 5_695_144,
    'EVA02-S_14': 22_006_120,
    'EVA02-B_14': 86_527_720,
    'EVA02-L_14': 304_293_800,
    'EVA02-testing': 81_416,
    'DINOv3-S_16': 21_971_944,
    'DINOv3-S_16-qkvb': 21_981_160,
    'DINOv3-B_16': 86_410_216,
    'DINOv3-B_16-qkvb': 86_428_648,
    'DINOv3-L_16': 304_104_424,
    'DINOv3-L_16-qkvb': 304_153_576,
    'DINOv3-testing': 74_856,
    'DINOv3-testing-qkvb': 74_984,
    # timm's counts (timm 1.0.31, img_size=224, num_classes=1000) of
    # beit_{base,large}_patch16_224 and beitv2_base_patch16_224; the
    # 'testing' ones of beit[v2]_base_patch16_224 at embed_dim=32, depth=2,
    # num_heads=2, mlp_ratio=2 (count/NAME in tests/data/
    # timm_beit_golden.npz).
    'BEiT-B_16': 86_530_984,
    'BEiT-L_16': 304_430_568,
    'BEiT-testing': 77_784,
    'BEiTv2-B_16': 86_530_984,
    'BEiTv2-testing': 77_784,
    # timm's swin_*_patch4_window{7_224,12_384}.
    'Swin-T': 28_288_354,
    'Swin-S': 49_606_258,
    'Swin-B': 87_768_224,
    'Swin-B_384': 87_903_584,
    'Swin-testing': 70_398,
    # Two towers: transformers 5.23's CLIPModel and SiglipModel of these
    # sizes at 224 px (151_277_313: openai/clip-vit-base-patch32's count);
    # vit_jax's CLIP heads carry a bias (zero) that its projections lack.
    'CLIP-testing-quickgelu-towers': 1_659_169 + 2 * 32,
    'CLIP-B_32-quickgelu-towers': 151_277_313 + 2 * 512,
    'CLIP-B_16-quickgelu-towers': 149_620_737 + 2 * 512,
    'CLIP-L_14-quickgelu-towers': 427_616_513 + 2 * 768,
    'SigLIP-testing-towers': 1_100_802,
    'SigLIP-B_16-towers': 203_155_970,
    'SigLIP-L_16-towers': 652_089_346,
    'SigLIP-So400m_14-towers': 877_415_602,
    # Videos of 32 frames of 224 px (the testing ones' 4 px patches make a
    # long joint table); Kinetics-400's counts in test_vivit.
    'ViViT-testing': 1_658_952,
    'ViViT-testing-FE': 162_856,
    'ViViT-B_16x2': 89_415_400,
    'ViViT-B_16x2-FE': 115_524_328,
}


def _siglip2_sizes():
  """SigLIP 2's: transformers 5.23's Siglip[2]VisionModel, Siglip[2]Model
  of each preset's shapes at 224 px (scripts/make_siglip2_counts.py); the
  image towers plus their 1000-class head."""
  with open(f'{ROOT}/tests/data/siglip2_param_counts.json') as f:
    counts = json.load(f)['counts']
  head = lambda name: 0 if name.endswith('-towers') else 1000 * (
      models.MODEL_CONFIGS[name].hidden_size + 1)
  return {name: n + head(name) for name, n in counts.items()}


MODEL_SIZES.update(_siglip2_sizes())


def _internvit_sizes():
  """InternViT's: transformers 5.23's InternVLVisionModel of each preset's
  shapes and settings at 224 px, which timm 1.0.31's
  vit_intern300m_patch14_448 of the 300M-like ones has too
  (scripts/make_internvit_counts.py); plus the 1000-class head."""
  with open(f'{ROOT}/tests/data/internvit_param_counts.json') as f:
    counts = json.load(f)['counts']
  for name, n in counts['timm'].items():
    assert counts['transformers'][name] == n, name
  return {name: n + 1000 * (models.MODEL_CONFIGS[name].hidden_size + 1)
          for name, n in counts['transformers'].items()}


MODEL_SIZES.update(_internvit_sizes())


def _aimv2_sizes():
  """AIMv2's: timm 1.0.31's aimv2_*_patch14_224 of each preset's shapes
  plus the 1000-class head; the towers, transformers 5.23's Aimv2Model
  plus the zero biases of its two bias-free projections, which vit_jax's
  heads have (scripts/make_aimv2_counts.py)."""
  with open(f'{ROOT}/tests/data/aimv2_param_counts.json') as f:
    counts = json.load(f)['counts']
  def extra(name):
    config = models.MODEL_CONFIGS[name]
    if name.endswith('-towers'):
      return sum(config.out_dim)
    return 1000 * (config.hidden_size + 1)
  return {name: n + extra(name) for name, n in counts.items()}


MODEL_SIZES.update(_aimv2_sizes())


def _pe_sizes():
  """Perception Encoder's: timm 1.0.31's counts of each preset's
  vit_pe_* entrypoint at 224 px with a 1000-class head; the testing ones
  at embed_dim=32, depth=2, num_heads=2, mlp_ratio=2
  (scripts/make_pe_golden.py)."""
  with open(f'{ROOT}/tests/data/pe_param_counts.json') as f:
    return json.load(f)['counts']


MODEL_SIZES.update(_pe_sizes())


def _videomae_sizes():
  """VideoMAE's: transformers 5.23's VideoMAEForVideoClassification of
  each preset's shapes with 400 classes (scripts/make_videomae_counts.py),
  its head made 1000-class."""
  with open(f'{ROOT}/tests/data/videomae_param_counts.json') as f:
    data = json.load(f)
  head = lambda name, n: n * (models.MODEL_CONFIGS[name].hidden_size + 1)
  return {name: n - head(name, data['classes']) + head(name, 1000)
          for name, n in data['counts'].items()}


MODEL_SIZES.update(_videomae_sizes())


def _timesformer_sizes():
  """TimeSformer's: transformers 5.23's TimesformerForVideoClassification
  of each preset's config, 400 classes (scripts/make_timesformer_golden.py),
  with the 1000-class head instead."""
  with open(f'{ROOT}/tests/data/timesformer_param_counts.json') as f:
    record = json.load(f)
  extra = 1000 - record['num_labels']
  return {name: n + extra * (models.MODEL_CONFIGS[name].hidden_size + 1)
          for name, n in record['counts'].items()}


MODEL_SIZES.update(_timesformer_sizes())


def _sam_sizes():
  """SAM's encoders: timm 1.0.31's samvit_{base,large,huge}_patch16 (no
  head) and the golden files' small one (scripts/make_sam_counts.py)."""
  with open(f'{ROOT}/tests/data/sam_param_counts.json') as f:
    return json.load(f)['counts']


MODEL_SIZES.update(_sam_sizes())

DATA_STACK = ('tensorflow', 'tensorflow_datasets', 'clu', 'tensorboard')


def test_all_tested():
  assert set(models.MODEL_CONFIGS) == set(MODEL_SIZES)


@pytest.mark.parametrize('name', sorted(MODEL_SIZES))
def test_param_count(name):
  two_towers = models.model_class(name) is models.LitModel
  headless = two_towers or registry.family(name).name == 'SAM'
  kw = {} if headless else dict(num_classes=1000)
  if models.model_class(name) is models.VisionTransformer or (
      registry.family(name).name == 'VideoMAE'):
    # Scanned blocks: the same parameters, stacked, traced once (cheaper).
    kw['transformer'] = dict(models.MODEL_CONFIGS[name].transformer,
                             scan=True)
  if two_towers and 'transformer' in models.MODEL_CONFIGS[name].image:
    image = models.MODEL_CONFIGS[name].image.to_dict()
    kw['image'] = dict(image, transformer=dict(image['transformer'],
                                               scan=True))
  model = models.get_model(name, **kw)
  assert isinstance(model, models.model_class(name))
  # A Swin's side is a multiple of its window's (384 px for Swin-B_384).
  side = registry.native_resolution(name) if name.startswith(
      'Swin-') else 224
  shape = (1, side, side, 3)
  if registry.family(name).name in ('ViViT', 'VideoMAE'):
    shape = (1, 32 if registry.family(name).name == 'ViViT' else 16,
             *shape[1:])
  if registry.family(name).name == 'TimeSformer':  # its frames and side
    side = registry.native_resolution(name)
    shape = (1, models.MODEL_CONFIGS[name].num_frames, side, side, 3)
  assert models.count_params(model, shape) == MODEL_SIZES[name]


@pytest.mark.parametrize('name', ['testing', 'testing-unpooled',
                                  'Mixer-testing', 'DeiT-testing-distilled',
                                  'BiT-testing'])
def test_output_shape(name):
  model = models.get_model(name, num_classes=1000)
  images = jnp.ones((2, 224, 224, 3))
  out = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), images, train=False)[0])
  assert out.shape == ((2, 196, 1000) if 'unpooled' in name else (2, 1000))


@pytest.mark.parametrize('name', ['DeiT-Ti_16', 'DeiT-S_16-distilled'])
def test_deit_presets_compute_timms_gelu(name):
  config = models.MODEL_CONFIGS[name]
  assert config.transformer.gelu_approximate is False
  assert config.representation_size is None
  assert config.classifier == ('distilled' if 'distilled' in name else 'token')


def test_lit_pp_reads_as_the_original():
  model = models.get_model('LiT-B16B')
  assert model.pp.max_len == model.pp['max_len'] == 16
  assert model.pp.tokenizer_name == 'bert'
  tokens = jnp.ones((2, model.pp.max_len), jnp.int32)
  zimg, ztxt, _ = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), images=jnp.ones((2, 224, 224, 3)),
      tokens=tokens)[0])
  assert zimg.shape == ztxt.shape == (2, 768)


def test_models_import_no_data_stack():
  code = ('import sys, vit_jax.models; print(sorted({m.split(".")[0] for m '
          f'in sys.modules}} & set({DATA_STACK!r})))')
  result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, check=True, timeout=300, cwd=ROOT)
  assert result.stdout.strip() == '[]', result.stdout
