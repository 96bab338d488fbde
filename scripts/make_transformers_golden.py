r"""Writes the golden folders of Hugging Face transformers' vision models.

Needs torch and transformers 5.23 (in a venv of their own); the tests need
neither.

  python scripts/make_transformers_golden.py           # everything
  python scripts/make_transformers_golden.py --older   # the last three only
  python scripts/make_transformers_golden.py --defaults  # the defaults only

writes into tests/data:
- transformers/NAME: a small random model of each class in MODELS (every
  parameter moved off its init by N(0, 0.3)), saved by its own
  `save_pretrained` (config.json, model.safetensors), with the
  `preprocessor_config.json` of the hub checkpoint it stands for and, for
  the two-tower models, a tiny tokenizer of the hub's kind (CLIP's
  byte-level BPE, SigLIP's SentencePiece).
- transformers_golden.npz: images (NHWC, as the models take them after
  their processor) and transformers' outputs, as NAME/OUTPUT; for DINOv2 at
  a second and third size too (its table resized at run time); the
  tokenizers' ids of PROMPTS as NAME/input_ids; the processors' pixels of
  tests/data/predict_image.jpg (every 8th row and column) as
  PROCESSOR/pixels.
- transformers_older/NAME: folders of the models above as hub repos still
  hold them, from older transformers versions (`OLDER`): feature
  extractors' preprocessor_config.json (numbers as sizes), config.json
  files that give only what differs from the defaults, pytorch_model.bin
  with its position_ids buffers, sharded safetensors; the same weights, so
  transformers_golden.npz has their outputs (the script checks that
  transformers computes them from these folders too).
  transformers_older_pixels.npz: transformers' processors' pixels of
  tests/data/predict_image.jpg read from each older folder, as NAME.
- transformers_defaults.json: transformers' config and image processor
  classes' defaults, which vit_jax/convert/transformers_defaults.py holds.
- torch_files/: torch.save's files (a state dict with a transposed view, an
  int64 buffer and bfloat16; one holding a Python object) and the arrays
  of the first (state.npz), for vit_jax/convert/torch_files.py.
"""

import io
import json
import os
import shutil
import sys

import numpy as np
from PIL import Image
import sentencepiece as spm
import torch
import transformers

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
OUT = os.path.join(DATA, 'transformers')
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64)
# The ViT `testing` preset's shapes (vit_jax has no 32-wide Google ViT).
VIT_TESTING = dict(hidden_size=10, num_hidden_layers=1, num_attention_heads=2,
                   intermediate_size=10, patch_size=16, image_size=32)
PROMPTS = ['a photo of a Dog.', 'A PICTURE of a cat, sitting!', 'a bird']
TEXT = dict(SMALL, max_position_embeddings=16)

# The hub checkpoints' preprocessor_config.json, as published.
_IMAGENET = dict(image_mean=[0.485, 0.456, 0.406],
                 image_std=[0.229, 0.224, 0.225])
_HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
_CLIP = dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
             image_std=[0.26862954, 0.26130258, 0.27577711])
PROCESSORS = {
    # google/vit-base-patch16-224: resize 224 x 224, bilinear, no crop.
    'vit': ('ViTImageProcessor', dict(
        do_resize=True, size={'height': 224, 'width': 224}, resample=2,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, **_HALF)),
    # facebook/deit-base-distilled-patch16-224: 256 bicubic, crop 224.
    'deit': ('DeiTImageProcessor', dict(
        do_resize=True, size={'height': 256, 'width': 256}, resample=3,
        do_center_crop=True, crop_size={'height': 224, 'width': 224},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        **_IMAGENET)),
    # facebook/dinov2-small: short side 256 bicubic, crop 224.
    'dinov2': ('BitImageProcessor', dict(
        do_resize=True, size={'shortest_edge': 256}, resample=3,
        do_center_crop=True, crop_size={'height': 224, 'width': 224},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        do_convert_rgb=True, **_IMAGENET)),
    # openai/clip-vit-base-patch32: short side 224 bicubic, crop 224.
    'clip': ('CLIPImageProcessor', dict(
        do_resize=True, size={'shortest_edge': 224}, resample=3,
        do_center_crop=True, crop_size={'height': 224, 'width': 224},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        do_convert_rgb=True, **_CLIP)),
    # google/siglip-base-patch16-224: 224 x 224 bicubic, [-1, 1].
    'siglip': ('SiglipImageProcessor', dict(
        do_resize=True, size={'height': 224, 'width': 224}, resample=3,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True, **_HALF)),
    # facebook/vit-mae-base: 224 x 224 bilinear, ImageNet.
    'mae': ('ViTImageProcessor', dict(
        do_resize=True, size={'height': 224, 'width': 224}, resample=2,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        **_IMAGENET)),
    # microsoft/swin-tiny-patch4-window7-224: 224 x 224 bicubic, ImageNet.
    'swin': ('ViTImageProcessor', dict(
        do_resize=True, size={'height': 224, 'width': 224}, resample=3,
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        **_IMAGENET)),
}

T = transformers
# name: (class, its config, image side, processor, hub name).
MODELS = {
    'vit': (T.ViTForImageClassification, T.ViTConfig(
        **VIT_TESTING, num_labels=5), 32, 'vit',
            'google/vit-base-patch16-224'),
    'vit_model': (T.ViTModel, T.ViTConfig(**VIT_TESTING), 32, 'vit',
                  'google/vit-base-patch16-224-in21k'),
    'deit': (T.DeiTForImageClassificationWithTeacher, T.DeiTConfig(
        **SMALL, patch_size=8, image_size=32, num_labels=5), 32, 'deit',
             'facebook/deit-base-distilled-patch16-224'),
    'dinov2': (T.Dinov2Model, T.Dinov2Config(
        **SMALL, patch_size=14, image_size=70, mlp_ratio=2), 70, 'dinov2',
               'facebook/dinov2-small'),
    'dinov2_registers': (T.Dinov2WithRegistersModel,
                         T.Dinov2WithRegistersConfig(
                             **SMALL, patch_size=14, image_size=70,
                             mlp_ratio=2, num_register_tokens=4), 70, 'dinov2',
                         'facebook/dinov2-with-registers-small'),
    'clip_vision': (T.CLIPVisionModel, T.CLIPVisionConfig(
        **SMALL, patch_size=16, image_size=32), 32, 'clip',
                    'openai/clip-vit-base-patch32'),
    'clip_vision_projection': (T.CLIPVisionModelWithProjection,
                               T.CLIPVisionConfig(
                                   **SMALL, patch_size=16, image_size=32,
                                   projection_dim=24), 32, 'clip',
                               'openai/clip-vit-base-patch32'),
    'clip': (T.CLIPModel, None, 32, 'clip', 'openai/clip-vit-base-patch32'),
    'siglip_vision': (T.SiglipVisionModel, T.SiglipVisionConfig(
        **SMALL, patch_size=16, image_size=32), 32, 'siglip',
                      'google/siglip-base-patch16-224'),
    'siglip': (T.SiglipModel, None, 32, 'siglip',
               'google/siglip-base-patch16-224'),
    'mae': (T.ViTMAEModel, T.ViTMAEConfig(
        **SMALL, patch_size=16, image_size=32), 32, 'mae',
            'facebook/vit-mae-base'),
    'mae_pretraining': (T.ViTMAEForPreTraining, T.ViTMAEConfig(
        **SMALL, patch_size=16, image_size=32, decoder_hidden_size=16,
        decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
        decoder_intermediate_size=32), 32, 'mae', 'facebook/vit-mae-base'),
    'swin': (T.SwinForImageClassification, T.SwinConfig(
        image_size=32, patch_size=2, embed_dim=4, depths=[2, 2, 2, 2],
        num_heads=[1, 2, 2, 4], window_size=2, num_labels=5), 32, 'swin',
             'microsoft/swin-tiny-patch4-window7-224'),
}
# DINOv2's table (5 x 5 patches) resized at run time to these sides.
DINOV2_SIDES = (42, 98)


def _clip_tokenizer(folder):
  """A CLIP tokenizer with a byte-level alphabet and a few merges."""
  bytes_to_unicode = transformers.models.clip.tokenization_clip.__dict__.get(
      'bytes_to_unicode')
  if bytes_to_unicode is None:
    from transformers.convert_slow_tokenizer import bytes_to_unicode
  alphabet = list(bytes_to_unicode().values())
  vocab = alphabet + [c + '</w>' for c in alphabet]
  merges = [('p', 'h'), ('o', 't'), ('ph', 'ot'), ('c', 'a'),
            ('ca', 't</w>'), ('d', 'o'), ('do', 'g</w>')]
  vocab += [a + b for a, b in merges]
  vocab += ['<|startoftext|>', '<|endoftext|>']
  tokenizer = transformers.CLIPTokenizer(
      vocab={v: i for i, v in enumerate(vocab)},
      merges=list(merges), model_max_length=16)
  tokenizer.save_pretrained(folder)
  return tokenizer, len(vocab)


def _siglip_tokenizer(folder):
  """A SigLIP tokenizer: SentencePiece as the hub's (pad 0, </s> 1, unk 2)."""
  model = io.BytesIO()
  texts = [f'a photo of a {w}' for w in ('dog', 'cat', 'bird', 'ship',
                                         'truck', 'horse', 'frog', 'deer')]
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts * 20), model_writer=model, vocab_size=40,
      model_type='unigram', pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      hard_vocab_limit=False, minloglevel=2, num_threads=1)
  path = os.path.join(folder, 'spiece.model')
  with open(path, 'wb') as f:
    f.write(model.getvalue())
  tokenizer = transformers.SiglipTokenizer(path, model_max_length=16)
  tokenizer.save_pretrained(folder)
  return tokenizer, tokenizer.vocab_size


def _two_tower_config(name, vocab_size):
  text = dict(TEXT, vocab_size=vocab_size)
  vision = dict(SMALL, patch_size=16, image_size=32)
  if name == 'clip':
    return T.CLIPConfig(text_config=dict(text, eos_token_id=2),
                        vision_config=vision, projection_dim=24)
  return T.SiglipConfig(text_config=text, vision_config=vision)


def _shift(model, scale=0.3):
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def _images(side, seed=0):
  return np.random.default_rng(seed).normal(size=(2, side, side, 3)).astype(
      np.float32)


def _run(name, model, images, tokens=None):
  """transformers' outputs of `images` (NHWC), by name."""
  x = torch.from_numpy(images).permute(0, 3, 1, 2)
  out = {}
  with torch.no_grad():
    if name in ('clip', 'siglip'):
      result = model(input_ids=torch.from_numpy(tokens), pixel_values=x)
      for key in ('image_embeds', 'text_embeds', 'logits_per_image'):
        out[key] = getattr(result, key)
    elif name.startswith('mae'):
      # No masking, and the patches in order: the encoder as it is used.
      model.config.mask_ratio = 0.
      noise = torch.arange(x.shape[2] * x.shape[3] // 256)[None].float()
      vit = model.vit if name == 'mae_pretraining' else model
      out['last_hidden_state'] = vit(
          x, noise=noise.repeat(len(x), 1)).last_hidden_state
    else:
      result = model(pixel_values=x)
      for key in ('logits', 'pooler_output', 'image_embeds',
                  'last_hidden_state'):
        if getattr(result, key, None) is not None:
          out[key] = result[key]
  return {f'{name}/{k}': v.numpy() for k, v in out.items()}


def _processor(name, folder, golden):
  """The hub's preprocessor_config.json, and its pixels of the test image."""
  cls_name, kwargs = PROCESSORS[name]
  cls = getattr(transformers, cls_name.replace('Processor', 'ProcessorPil'),
                None) or getattr(transformers, cls_name)
  processor = cls(**kwargs)
  processor.save_pretrained(folder)
  image = Image.open(os.path.join(DATA, 'predict_image.jpg')).convert('RGB')
  pixels = processor(images=image, return_tensors='np')['pixel_values']
  # Every 8th row and column: the whole image, in a small file.
  golden[f'{name}/pixels'] = np.asarray(pixels).transpose(0, 2, 3, 1)[
      :, ::8, ::8]


def main():
  torch.manual_seed(0)
  shutil.rmtree(OUT, ignore_errors=True)
  golden = {}
  for name, (cls, config, side, processor, hub) in MODELS.items():
    folder = os.path.join(OUT, name)
    os.makedirs(folder)
    tokens = None
    if config is None:  # a two-tower model: its tokenizer first
      make = _clip_tokenizer if name == 'clip' else _siglip_tokenizer
      tokenizer, vocab_size = make(folder)
      config = _two_tower_config(name, vocab_size)
      tokens = tokenizer(PROMPTS, padding='max_length', truncation=True,
                         max_length=16, return_tensors='np')['input_ids']
      golden[f'{name}/input_ids'] = tokens.astype(np.int32)
    model = cls(config).eval()
    _shift(model)
    model.save_pretrained(folder)
    with open(os.path.join(folder, 'HUB'), 'w') as f:
      f.write(hub + '\n')
    images = golden.setdefault(f'images/{side}', _images(side))
    golden.update(_run(name, model, images, tokens))
    if name.startswith('dinov2'):
      for other in DINOV2_SIDES:
        images = golden.setdefault(f'images/{other}', _images(other))
        golden.update({f'{k}@{other}': v for k, v in _run(
            name, model, images).items()})
    if f'{processor}/pixels' not in golden:
      _processor(processor, folder, golden)
    else:
      _processor(processor, folder, {})
    print(name, sorted(model.state_dict())[:3], '...')
  np.savez(os.path.join(DATA, 'transformers_golden.npz'), **golden)


OLDER_OUT = os.path.join(DATA, 'transformers_older')
# preprocessor_config.json as feature extractors wrote them (the hub's
# google/vit-base-patch16-224, facebook/deit-base-distilled-patch16-224,
# openai/clip-vit-base-patch32 before their processors were re-saved).
_OLD_PROCESSORS = {
    'vit': dict(do_normalize=True, do_resize=True, resample=2, size=224,
                feature_extractor_type='ViTFeatureExtractor', **_HALF),
    'deit': dict(crop_size=224, do_center_crop=True, do_normalize=True,
                 do_resize=True, resample=3, size=256,
                 feature_extractor_type='DeiTFeatureExtractor', **_IMAGENET),
    'clip': dict(crop_size=224, do_center_crop=True, do_normalize=True,
                 do_resize=True, resample=3, size=224,
                 feature_extractor_type='CLIPFeatureExtractor', **_CLIP),
}
# Older folder: (the golden folder whose weights it holds, its changes).
OLDER = {
    'vit_feature_extractor': ('vit', 'processor'),
    'deit_feature_extractor': ('deit', 'processor'),
    'clip_bin': ('clip', 'processor', 'bin'),
    'siglip_vision_sparse': ('siglip_vision', 'sparse'),
    'siglip_sparse': ('siglip', 'sparse'),
    'vit_sharded': ('vit', 'sharded'),
}
_KEPT = ('architectures', 'model_type')  # what a sparse config.json keeps


def _sparse(config: dict, defaults: dict) -> dict:
  """`config` without what equals `defaults` (and transformers' noise)."""
  out = {}
  for key, value in config.items():
    if isinstance(value, dict) and key.endswith('_config'):
      out[key] = _sparse(
          value, T.AutoConfig.for_model(value['model_type']).to_dict())
    elif key in _KEPT or (key in defaults and defaults[key] != value and
                          key not in ('dtype', 'transformers_version',
                                      'id2label', 'label2id')):
      out[key] = value
  return out


def _older_folder(name, base, changes, pixels):
  src, dst = os.path.join(OUT, base), os.path.join(OLDER_OUT, name)
  shutil.copytree(src, dst)
  os.remove(os.path.join(dst, 'HUB'))
  cls = getattr(transformers, json.load(open(os.path.join(
      src, 'config.json')))['architectures'][0])
  model = cls.from_pretrained(src).eval()
  if 'processor' in changes:
    with open(os.path.join(dst, 'preprocessor_config.json'), 'w') as f:
      json.dump(_OLD_PROCESSORS[base.split('_')[0]], f, indent=2)
    kind = type(transformers.AutoImageProcessor.from_pretrained(dst)).__name__
    processor = getattr(transformers, kind.replace('Fast', '') + 'Pil',
                        None) or getattr(transformers, kind)
    image = Image.open(os.path.join(DATA, 'predict_image.jpg')).convert('RGB')
    got = processor.from_pretrained(dst)(images=image, return_tensors='np')
    pixels[name] = np.asarray(got['pixel_values']).transpose(0, 2, 3, 1)[
        :, ::8, ::8]
  if 'bin' in changes:
    os.remove(os.path.join(dst, 'model.safetensors'))
    state = dict(model.state_dict())
    for tower, n in (('vision_model', model.config.vision_config),
                     ('text_model', model.config.text_config)):
      count = (n.image_size // n.patch_size) ** 2 + 1 if tower.startswith(
          'vision') else n.max_position_embeddings
      state[f'{tower}.embeddings.position_ids'] = torch.arange(count)[None]
    torch.save(state, os.path.join(dst, 'pytorch_model.bin'))
  if 'sparse' in changes:
    path = os.path.join(dst, 'config.json')
    config = json.load(open(path))
    defaults = T.AutoConfig.for_model(config['model_type']).to_dict()
    with open(path, 'w') as f:
      json.dump(_sparse(config, defaults), f, indent=2)
  if 'sharded' in changes:
    os.remove(os.path.join(dst, 'model.safetensors'))
    os.remove(os.path.join(dst, 'config.json'))
    model.save_pretrained(dst, max_shard_size='20KB')
  # transformers reads the older folder to the same weights and outputs.
  again = cls.from_pretrained(dst).eval()
  for key, value in model.state_dict().items():
    assert torch.equal(again.state_dict()[key], value), (name, key)
  golden = np.load(os.path.join(DATA, 'transformers_golden.npz'))
  side = transformers_layout_side(model.config)
  tokens = golden.get(f'{base}/input_ids')
  for key, value in _run(base, again, golden[f'images/{side}'],
                         tokens).items():
    np.testing.assert_allclose(value, golden[key], rtol=1e-5, atol=1e-6,
                               err_msg=name)


def transformers_layout_side(config):
  vision = getattr(config, 'vision_config', None) or config
  return vision.image_size


def _defaults():
  """transformers' defaults of the config and processor classes read."""
  configs = {c.model_type: c().to_dict() for c in (
      T.ViTConfig, T.DeiTConfig, T.ViTMAEConfig, T.Dinov2Config,
      T.Dinov2WithRegistersConfig, T.CLIPConfig, T.CLIPVisionConfig,
      T.CLIPTextConfig, T.SiglipConfig, T.SiglipVisionConfig,
      T.SiglipTextConfig, T.Siglip2Config, T.Siglip2VisionConfig,
      T.Siglip2TextConfig, T.SwinConfig, T.InternVLVisionConfig, T.Aimv2Config,
      T.Aimv2VisionConfig, T.Aimv2TextConfig, T.VivitConfig,
      T.VideoMAEConfig)}
  processors = {}
  for name in ('ViTImageProcessor', 'DeiTImageProcessor', 'CLIPImageProcessor',
               'BitImageProcessor', 'SiglipImageProcessor',
               'Siglip2ImageProcessor', 'VivitImageProcessor',
               'VideoMAEImageProcessor'):
    cls = getattr(T, name + 'Pil', None) or getattr(T, name)
    processors[name] = json.loads(cls().to_json_string())
  return {'configs': configs, 'processors': processors}


class Unsafe:  # what a file may hold besides tensors
  pass


def _torch_files():
  """torch.save's files for vit_jax's reader, and what they hold."""
  folder = os.path.join(DATA, 'torch_files')
  os.makedirs(folder)
  state = {'weight': torch.randn(4, 3).t(), 'bias': torch.randn(4),
           'position_ids': torch.arange(5)[None],
           'half': torch.randn(2, 2).to(torch.bfloat16)}
  torch.save(state, os.path.join(folder, 'state.bin'))
  np.savez(os.path.join(folder, 'state.npz'), **{
      k: v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
      for k, v in state.items()})
  torch.save({'model': state, 'extra': Unsafe()},
             os.path.join(folder, 'unsafe.bin'))


def write_defaults():
  with open(os.path.join(DATA, 'transformers_defaults.json'), 'w') as f:
    json.dump(_defaults(), f, indent=1, sort_keys=True, default=int)


def older():
  shutil.rmtree(OLDER_OUT, ignore_errors=True)
  shutil.rmtree(os.path.join(DATA, 'torch_files'), ignore_errors=True)
  pixels = {}
  for name, (base, *changes) in OLDER.items():
    _older_folder(name, base, changes, pixels)
    print(name, sorted(os.listdir(os.path.join(OLDER_OUT, name))))
  np.savez(os.path.join(DATA, 'transformers_older_pixels.npz'), **pixels)
  write_defaults()
  _torch_files()


if __name__ == '__main__':
  if '--defaults' in sys.argv:
    write_defaults()
  else:
    if '--older' not in sys.argv:
      main()
    older()
