r"""Writes the golden folders of transformers' DepthAnythingForDepthEstimation
and DPTForDepthEstimation.

Needs torch and transformers 5.23 (in a venv of their own); the tests need
neither.

  /work/venv_golden/bin/python scripts/make_depth_golden.py

writes into tests/data/depth:
- depth_anything/: a small random Depth Anything (its DINOv2: hidden 24, 4
  blocks, 2 heads, MLP 48, patch 14, a 5 x 5 position table (70 px) that
  transformers resizes to the input's 4 x 4; out_indices 1-4; neck widths
  8, 8, 16, 16, fusion 8, head 4; relative), every parameter moved off
  its init by N(0, 0.1), saved by `save_pretrained`, with a DPT image
  processor as the Depth Anything hub folders hold it (ImageNet's mean and
  std, bicubic, keep_aspect_ratio, multiple of 14) at 56 px.
- dpt/: a small random DPT on a plain ViT (hidden 24, 4 blocks, 2 heads,
  MLP 48, patch 8, 32 px; out_indices 0-3, readout 'project'; neck 8, 8,
  16, 16, fusion 8), moved the same way, with DPT's processor (0.5, 0.5) at 32 px.
- golden.npz: `images_da` (2, 56, 56, 3) and `images_dpt` (2, 32, 32, 3),
  the inputs as each model takes them after its processor (NHWC), and
  their `predicted_depth` (`depth_da`, `depth_dpt`, (2, H', W')); DPT's at
  48 px too (`images_dpt48` (1, 48, 48, 3), `depth_dpt48`), where
  transformers resizes its 4 x 4 table bilinearly to 6 x 6.
"""

import os

import numpy as np
import torch
import transformers

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'depth')
NECK = dict(neck_hidden_sizes=[8, 8, 16, 16], fusion_hidden_size=8,
            reassemble_factors=[4, 2, 1, 0.5])
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406],
                image_std=[0.229, 0.224, 0.225])


def _shift(model, scale=0.1):
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def depth_anything():
  backbone = transformers.Dinov2Config(
      hidden_size=24, num_hidden_layers=4, num_attention_heads=2,
      mlp_ratio=2, patch_size=14, image_size=70, out_indices=[1, 2, 3, 4],
      reshape_hidden_states=False, apply_layernorm=True)
  config = transformers.DepthAnythingConfig(
      backbone_config=backbone, reassemble_hidden_size=24, patch_size=14,
      head_hidden_size=4, **NECK)
  model = transformers.DepthAnythingForDepthEstimation(config).eval()
  _shift(model)
  folder = os.path.join(OUT, 'depth_anything')
  model.save_pretrained(folder)
  transformers.DPTImageProcessor(
      size={'height': 56, 'width': 56}, keep_aspect_ratio=True,
      ensure_multiple_of=14, resample=3, **IMAGENET).save_pretrained(folder)
  return model, 56


def dpt():
  config = transformers.DPTConfig(
      hidden_size=24, num_hidden_layers=4, num_attention_heads=2,
      intermediate_size=48, patch_size=8, image_size=32,
      backbone_out_indices=[0, 1, 2, 3], readout_type='project', **NECK)
  model = transformers.DPTForDepthEstimation(config).eval()
  _shift(model)
  folder = os.path.join(OUT, 'dpt')
  model.save_pretrained(folder)
  transformers.DPTImageProcessor(
      size={'height': 32, 'width': 32}).save_pretrained(folder)
  return model, 32


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  out = {}
  for name, build in (('da', depth_anything), ('dpt', dpt)):
    model, side = build()
    images = rng.normal(size=(2, side, side, 3)).astype(np.float32)
    with torch.no_grad():
      depth = model(pixel_values=torch.from_numpy(images).permute(
          0, 3, 1, 2)).predicted_depth.numpy()
    print(name, depth.shape, 'positive:', (depth > 0).mean(),
          'range:', depth.min(), depth.max())
    out[f'images_{name}'], out[f'depth_{name}'] = images, depth
    if name == 'dpt':  # at 48 px: its table resized (bilinear)
      images = rng.normal(size=(1, 48, 48, 3)).astype(np.float32)
      with torch.no_grad():
        out['depth_dpt48'] = model(pixel_values=torch.from_numpy(
            images).permute(0, 3, 1, 2)).predicted_depth.numpy()
      out['images_dpt48'] = images
  np.savez(os.path.join(OUT, 'golden.npz'), **out)


if __name__ == '__main__':
  main()
