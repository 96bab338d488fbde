r"""Writes the golden files of timm's SigLIP 2 NaFlex tower.

Needs torch and timm (the golden venv); the tests need neither.

  python scripts/make_naflex_golden.py

writes into tests/data:
- timm_naflex/: a small random `naflexvit_base_patch16_siglip` (width 32, 2
  heads, 2 blocks, MLP 64: the shapes of vit_jax's SigLIP2-testing-naflex),
  every parameter moved off its init by N(0, 0.3), saved by timm's own
  `save_for_hf` (config.json beside model.safetensors).
- timm_naflex_golden.npz: `image`, a uint8 224 x 320 image (the model sees
  pixel / 127.5 - 1); its crops (H, W) in SIZES, each as timm's NaFlex path
  computes it: patches flattened in (p, p, C) order with their (y, x)
  coordinates, the three images padded to one sequence of 288 tokens
  (`patch_valid` false after each image's own), the pooled features
  (`forward_head(pre_logits=True)`: the MAP head's output) as HxW.
"""

import os
import shutil

import numpy as np
import timm
import torch

from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
ARCHITECTURE = 'naflexvit_base_patch16_siglip'
TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
PATCH = 16
SIZES = ((224, 224), (224, 320), (64, 160))
TOKENS = 288  # every image's patches, and padding


def _patch_dict(images):
  """timm's NaFlex input of NHWC float images, padded to TOKENS."""
  n = len(images)
  patches = np.zeros((n, TOKENS, PATCH * PATCH * 3), np.float32)
  coord = np.zeros((n, TOKENS, 2), np.int64)
  valid = np.zeros((n, TOKENS), bool)
  for i, image in enumerate(images):
    gh, gw = image.shape[0] // PATCH, image.shape[1] // PATCH
    flat = image.reshape(gh, PATCH, gw, PATCH, 3).transpose(0, 2, 1, 3, 4)
    patches[i, :gh * gw] = flat.reshape(gh * gw, -1)
    coord[i, :gh * gw] = np.stack(np.meshgrid(
        np.arange(gh), np.arange(gw), indexing='ij'), -1).reshape(-1, 2)
    valid[i, :gh * gw] = True
  return {'patches': torch.from_numpy(patches),
          'patch_coord': torch.from_numpy(coord),
          'patch_valid': torch.from_numpy(valid)}


def main():
  torch.manual_seed(0)
  image = np.random.default_rng(0).integers(0, 256, (224, 320, 3), np.uint8)
  pixels = image.astype(np.float32) / 127.5 - 1
  model = timm.create_model(ARCHITECTURE, num_classes=0, **TESTING).eval()
  _shift(model, 0.3)
  crops = [pixels[:h, :w] for h, w in SIZES]
  with torch.no_grad():
    features = model(_patch_dict(crops)).numpy()
    # The dense path (an NCHW image) agrees: the padding is masked.
    for crop, want in zip(crops, features):
      dense = model(torch.from_numpy(crop).permute(2, 0, 1)[None]).numpy()
      np.testing.assert_allclose(dense[0], want, atol=1e-5)
  golden = {'image': image}
  for (h, w), out in zip(SIZES, features):
    golden[f'{h}x{w}'] = out
  folder = os.path.join(OUT, 'timm_naflex')
  shutil.rmtree(folder, ignore_errors=True)
  timm.models.save_for_hf(model, folder, safe_serialization=True)
  np.savez(os.path.join(OUT, 'timm_naflex_golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


if __name__ == '__main__':
  main()
