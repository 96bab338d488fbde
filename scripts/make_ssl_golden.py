r"""Writes the golden files of timm's self-supervised and DeiT III ViTs.

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_ssl_golden.py

writes into tests/data:
- timm_posemb_resize.npz: position tables resized by timm's own
  `resample_abs_pos_embed` (torch's antialiased bicubic, in float32), and
  by the same `interpolate` call in float64 (without torch's float32
  rounding): 37x37 -> 16x16 (DINOv2's 518 px table at 224 px),
  16x16 -> 24x24 and 5x7 -> 9x4.
"""

import argparse
import os

import numpy as np
import timm
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
# (old grid, new grid) of each resized table; a class entry leads each.
RESIZES = {'37_16': ((37, 37), (16, 16)), '16_24': ((16, 16), (24, 24)),
           '5x7_9x4': ((5, 7), (9, 4))}


def write_posemb_resize():
  rng = np.random.default_rng(0)
  golden = {}
  for name, (old, new) in RESIZES.items():
    table = rng.normal(size=(1, 1 + old[0] * old[1], 2))
    resized = timm.layers.resample_abs_pos_embed(
        torch.from_numpy(table).float(), new_size=list(new),
        old_size=list(old), num_prefix_tokens=1)
    grid = torch.from_numpy(table[:, 1:]).reshape(1, *old, 2).permute(
        0, 3, 1, 2)  # as resample_abs_pos_embed calls it, but in float64
    exact = torch.nn.functional.interpolate(
        grid, size=new, mode='bicubic', antialias=True, align_corners=None)
    golden[f'{name}/old'], golden[f'{name}/new'] = table, resized.numpy()
    golden[f'{name}/new64'] = exact.permute(0, 2, 3, 1).reshape(
        1, -1, 2).numpy()
  path = os.path.join(OUT, 'timm_posemb_resize.npz')
  np.savez(path, **golden)
  print('wrote', path)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.parse_args()
  write_posemb_resize()
