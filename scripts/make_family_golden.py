r"""Writes the golden files of timm's CLIP, SigLIP, EVA-02 and DINOv3 towers.

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_family_golden.py

writes into tests/data:
- timm_families/NAME: small random timm models (width 32, 2 heads, 2
  blocks, each MLP half 64 wide), every parameter moved off its init by
  N(0, 0.3), saved by timm's own `save_for_hf` (config.json beside
  model.safetensors), of the entrypoints in MODELS with the settings given
  there; one of 5 classes where a head is asked for, else the pooled
  features.
- timm_families_golden.npz: 64 px images in [-1, 1] (the 56 px ones are
  their top-left crops), timm's outputs (`forward_head(forward_features(x),
  pre_logits=not num_classes)`) as NAME, and timm's parameter count of each
  model at 224 px with a 1000-class head as count/NAME.
"""

import os
import shutil

import numpy as np
import timm
import torch

# The SSL golden files' images, outputs and parameter shifts (this folder).
from make_ssl_golden import _images
from make_ssl_golden import _outputs
from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
# name: (timm architecture, its create_model arguments, image side).
MODELS = {
    'clip': ('vit_base_patch16_clip_224', dict(num_classes=5), 64),
    'clip_quickgelu': ('vit_base_patch16_clip_quickgelu_224',
                       dict(num_classes=5), 64),
    'siglip': ('vit_base_patch16_siglip_224', dict(num_classes=0), 64),
    'siglip_gap': ('vit_base_patch16_siglip_gap_224', dict(num_classes=0), 64),
    # The tiny EVA-02's fused qkv and packed SwiGLU; the base's separate
    # projections, SwiGLU and its inner norm (scale_mlp).
    'eva02': ('eva02_tiny_patch14_224', dict(num_classes=5), 56),
    'eva02_mlpnorm': ('eva02_base_patch14_224', dict(num_classes=0), 56),
    'dinov3': ('vit_small_patch16_dinov3', dict(num_classes=0), 64),
    'dinov3_qkvb': ('vit_small_patch16_dinov3_qkvb', dict(num_classes=0), 64),
    'dinov3_token': ('vit_small_patch16_dinov3',
                     dict(num_classes=0, global_pool='token'), 64),
}


def main():
  torch.manual_seed(0)
  images = _images(64)
  golden = {'images': images}
  folder = os.path.join(OUT, 'timm_families')
  shutil.rmtree(folder, ignore_errors=True)
  for name, (architecture, kwargs, side) in MODELS.items():
    model = timm.create_model(architecture, img_size=side,
                              **dict(TESTING, **kwargs)).eval()
    _shift(model, 0.3)
    golden[name] = _outputs(model, images[:, :side, :side])
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
    full = timm.create_model(architecture, img_size=224, num_classes=1000,
                             **TESTING)
    golden[f'count/{name}'] = np.array(
        sum(p.numel() for p in full.parameters()))
  np.savez(os.path.join(OUT, 'timm_families_golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


if __name__ == '__main__':
  main()
