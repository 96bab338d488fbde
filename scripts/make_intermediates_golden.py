r"""Writes timm's `forward_intermediates` outputs of four golden models.

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_intermediates_golden.py

reads the small random timm models that the other golden scripts saved in
tests/data (a plain ViT: timm_ssl/mae; DINOv2 with registers:
timm_ssl/dinov2_reg4; EVA-02: timm_families/eva02; Swin:
timm_swin.safetensors; MLP-Mixer: timm_mixer.safetensors), runs timm's own `forward_intermediates(x, indices,
norm=, output_fmt='NCHW', intermediates_only=True)` on the SSL golden
images and writes tests/data/timm_intermediates_golden.npz: NAME/SETTING/i,
the i-th map, transposed to NHWC, for the two index settings of INDICES
with and without `norm`; DINOv2's prefix tokens (`return_prefix_tokens`)
as dinov2_reg4/prefix/i.
"""

import os

import numpy as np
from safetensors.torch import load_file
import timm
import torch

from make_ssl_golden import TESTING
from make_timm_golden import MODELS as TIMM_MODELS

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
SWIN = dict(patch_size=2, embed_dim=4, depths=(2, 2, 2, 2),
            num_heads=(1, 2, 2, 4), window_size=2, num_classes=10)
# name: (timm architecture, create_model arguments, weights, image side).
MODELS = {
    'vit': ('vit_base_patch16_224.mae', TESTING, 'timm_ssl/mae', 64),
    'dinov2_reg4': ('vit_small_patch14_reg4_dinov2', TESTING,
                    'timm_ssl/dinov2_reg4', 56),
    'eva02': ('eva02_tiny_patch14_224', dict(TESTING, num_classes=5),
              'timm_families/eva02', 56),
    'swin': ('swin_tiny_patch4_window7_224', SWIN, 'timm_swin.safetensors',
             64),
    'mixer': (None, None, 'timm_mixer.safetensors', 32),
}
# setting: indices, for the 2-block ViTs and the 4-stage Swin. An int is
# the last n; the lists stop early.
INDICES = {'last': (2, 2), 'first': ([-2], [0, -3])}


def _model(name):
  architecture, kwargs, weights, side = MODELS[name]
  if architecture is None:  # made by make_timm_golden.py
    model = TIMM_MODELS[f'timm_{name}']().eval()
  else:
    model = timm.create_model(architecture, pretrained=False, img_size=side,
                              **kwargs).eval()
  path = os.path.join(DATA, weights)
  if os.path.isdir(path):
    path = os.path.join(path, 'model.safetensors')
  model.load_state_dict(load_file(path))
  return model, side


def main():
  images = np.load(os.path.join(DATA, 'timm_ssl_golden.npz'))['images']
  golden = {}
  for name in MODELS:
    model, side = _model(name)
    x = torch.from_numpy(images[:, :side, :side]).permute(0, 3, 1, 2)
    for setting, choices in INDICES.items():
      indices = choices[name == 'swin']
      for norm in (False, True):
        with torch.no_grad():
          maps = model.forward_intermediates(
              x, indices=indices, norm=norm, output_fmt='NCHW',
              intermediates_only=True)
        for i, y in enumerate(maps):
          key = f'{name}/{setting}{"_norm" if norm else ""}/{i}'
          golden[key] = y.permute(0, 2, 3, 1).numpy()
    if name == 'dinov2_reg4':
      with torch.no_grad():
        pairs = model.forward_intermediates(
            x, indices=2, return_prefix_tokens=True, intermediates_only=True)
      for i, (_, prefix) in enumerate(pairs):
        golden[f'{name}/prefix/{i}'] = prefix.numpy()
  np.savez(os.path.join(DATA, 'timm_intermediates_golden.npz'), **golden)
  print('wrote', sorted(golden))


if __name__ == '__main__':
  main()
