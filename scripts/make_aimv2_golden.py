r"""Writes the golden files of AIMv2: timm's `aimv2_*`, transformers'
Aimv2VisionModel and Aimv2Model.

Needs torch, timm 1.0.31 and transformers 5.23 (the golden venv); the tests
need neither.

  python scripts/make_aimv2_golden.py

writes into tests/data/aimv2:
- timm/: a small random timm `aimv2_large_patch14_224` (width 32, 2 heads,
  2 blocks, each SwiGLU half 64 wide, 56 px: a 4 x 4 grid), every parameter
  moved off its init by N(0, 0.3), saved by timm's `save_for_hf`.
- vision/, vision_nohead/: transformers' Aimv2VisionModel of the same
  shapes (with its attention-pooling head, and without: `use_head`),
  shifted alike, saved by `save_pretrained` with a CLIPImageProcessor's
  preprocessor_config.json (the hub's apple/aimv2-* use CLIP's).
- towers/: transformers' Aimv2Model: that image tower, a text tower of the
  same shapes (16 tokens), projections to 24, with a tiny CLIP tokenizer
  (make_transformers_golden.py's) as the hub's LiT model has CLIP's.
- golden.npz: 56 px images in [-1, 1] (NHWC); timm's pooled features
  (`timm`) and `forward_intermediates` of both blocks (`timm/blocks/i`,
  with norm=True `timm/blocks_norm/i`, NHWC); transformers'
  last_hidden_state and pooler_output (`vision/...`, `vision_nohead/...`);
  Aimv2Model's image_embeds, text_embeds and logits_per_image of PROMPTS
  (`towers/...`, their ids `towers/input_ids`).

  python scripts/make_aimv2_golden.py --check

instead converts each golden folder with vit_jax (VIT_JAX_PYTHON, default
/work/venv/bin/python) to an .npz and back with --layout=transformers
(timm's as an Aimv2VisionModel too), loads each with transformers and
prints the largest difference from the golden outputs; exits 1 above 1e-4.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import timm
import torch
import transformers

# The tiny CLIP tokenizer and prompts of the transformers golden files.
from make_transformers_golden import _clip_tokenizer
from make_transformers_golden import PROMPTS

# The SSL golden files' parameter shift (this folder).
from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'aimv2')
SIDE = 56
TIMM = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, patch_size=14, image_size=SIDE)
_CLIP = dict(image_mean=[0.48145466, 0.4578275, 0.40821073],
             image_std=[0.26862954, 0.26130258, 0.27577711])



def _nchw(images):
  return torch.from_numpy(images).permute(0, 3, 1, 2)


def _timm(images, golden):
  model = timm.create_model('aimv2_large_patch14_224', img_size=SIDE,
                            num_classes=0, **TIMM).eval()
  _shift(model, 0.3)
  with torch.no_grad():
    golden['timm'] = model(_nchw(images)).numpy()
    for norm in (False, True):
      maps = model.forward_intermediates(_nchw(images), indices=2, norm=norm,
                                         intermediates_only=True)
      for i, m in enumerate(maps):
        golden[f'timm/blocks{"_norm" if norm else ""}/{i}'] = (
            m.permute(0, 2, 3, 1).numpy())
  timm.models.save_for_hf(model, os.path.join(OUT, 'timm'),
                          safe_serialization=True)


def _vision(name, use_head, images, golden):
  config = transformers.Aimv2VisionConfig(**VISION, use_head=use_head)
  model = transformers.Aimv2VisionModel(config).eval()
  _shift(model, 0.3)
  folder = os.path.join(OUT, name)
  model.save_pretrained(folder)
  transformers.CLIPImageProcessor(
      size={'shortest_edge': SIDE}, crop_size={'height': SIDE, 'width': SIDE},
      **_CLIP).save_pretrained(folder)
  with torch.no_grad():
    out = model(pixel_values=_nchw(images))
  golden[f'{name}/last_hidden_state'] = out.last_hidden_state.numpy()
  if use_head:
    golden[f'{name}/pooler_output'] = out.pooler_output.numpy()


def _towers(images, golden):
  folder = os.path.join(OUT, 'towers')
  os.makedirs(folder)
  tokenizer, vocab_size = _clip_tokenizer(folder)
  text = dict(VISION, max_position_embeddings=16, vocab_size=vocab_size,
              eos_token_id=tokenizer.eos_token_id)
  for key in ('patch_size', 'image_size'):
    text.pop(key)
  config = transformers.Aimv2Config(
      text_config=text, vision_config=dict(VISION, use_head=True),
      projection_dim=24)
  model = transformers.Aimv2Model(config).eval()
  _shift(model, 0.3)
  model.save_pretrained(folder)
  transformers.CLIPImageProcessor(
      size={'shortest_edge': SIDE}, crop_size={'height': SIDE, 'width': SIDE},
      **_CLIP).save_pretrained(folder)
  # As its processor: padded to 16, with the attention mask (causal then).
  inputs = tokenizer(PROMPTS, padding='max_length', truncation=True,
                     max_length=16, return_tensors='pt')
  golden['towers/input_ids'] = inputs['input_ids'].numpy().astype(np.int32)
  with torch.no_grad():
    out = model(input_ids=inputs['input_ids'],
                attention_mask=inputs['attention_mask'],
                pixel_values=_nchw(images))
  for key in ('image_embeds', 'text_embeds', 'logits_per_image'):
    golden[f'towers/{key}'] = getattr(out, key).numpy()


def _vit_jax(*args):
  python = os.environ.get('VIT_JAX_PYTHON', '/work/venv/bin/python')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run([python, '-m', 'vit_jax.convert', *args], check=True,
                 cwd=root, env=dict(os.environ, PYTHONPATH=root))


def check():
  """vit_jax's --layout=transformers folders, run by transformers."""
  golden = np.load(os.path.join(OUT, 'golden.npz'))
  x = _nchw(golden['images'])
  worst = 0.
  with tempfile.TemporaryDirectory() as tmp:
    for name in ('timm', 'vision', 'vision_nohead'):
      npz, folder = os.path.join(tmp, f'{name}.npz'), os.path.join(tmp, name)
      _vit_jax(os.path.join(OUT, name), npz)
      _vit_jax(npz, folder, '--layout=transformers')
      model, info = transformers.Aimv2VisionModel.from_pretrained(
          folder, output_loading_info=True)
      if any(info.values()):
        sys.exit(f'{name}: {info}')
      with torch.no_grad():
        out = model.eval()(pixel_values=x)
      got = {'last_hidden_state': out.last_hidden_state.numpy()}
      if name == 'timm':  # timm's features: the mean of every patch
        got = {'': got['last_hidden_state'].mean(axis=1)}
      elif out.pooler_output is not None:
        got['pooler_output'] = out.pooler_output.numpy()
      for key, value in got.items():
        want = golden['/'.join(filter(None, (name, key)))]
        error = float(np.abs(value - want).max())
        worst = max(worst, error)
        print(f'{name} {key or "features"}: {error:.2e}')
  sys.exit(worst > 1e-4)


def main():
  torch.manual_seed(0)
  shutil.rmtree(OUT, ignore_errors=True)
  os.makedirs(OUT)
  images = np.random.default_rng(0).uniform(
      -1, 1, (2, SIDE, SIDE, 3)).astype(np.float32)
  golden = {'images': images}
  _timm(images, golden)
  _vision('vision', True, images, golden)
  _vision('vision_nohead', False, images, golden)
  _towers(images, golden)
  np.savez(os.path.join(OUT, 'golden.npz'), **golden)
  print('wrote', OUT, sorted(golden))


if __name__ == '__main__':
  check() if '--check' in sys.argv else main()
