r"""Writes tests/data/internvl_tiles_golden.npz: InternVL's dynamic tiles,
grid choice, pixel shuffle and projector, as transformers 5.23 computes
them.

Needs torch and transformers 5.23 (in a venv of their own); the tests need
neither.

  python scripts/make_internvl_tiles_golden.py

The arrays:
- `grid_sizes` (n, 2) image (height, width)s and `grid` (n, 2) the
  (columns, rows) that `get_optimal_tiled_canvas` picks for them with
  28 px tiles, 1..6 tiles (`MIN_TILES`, `MAX_TILES`);
- `image_{i}` (uint8 (h, w, 3)) of SIZES and `tiles_{i}` (tiles, 28, 28, 3)
  in [0, 1]: the InternVL processor's tiles of it (transformers'
  `GotOcr2ImageProcessorPil`, which InternVL's hub folders name, with
  `crop_to_patches`, bicubic as theirs, not normalized), the thumbnail last
  when there is more than one tile;
- `features` (2, 16, 8) a 4 x 4 grid of 8-wide patch tokens, `shuffled`
  `InternVLModel.pixel_shuffle` of it (scale 0.5: (2, 4, 32)), and
  `projected` (2, 4, 16) through a random `InternVLMultiModalProjector`
  whose weights are `projector/{layer_norm,linear_1,linear_2}/{weight,bias}`.
"""

import os

import numpy as np
import torch
from transformers.models.got_ocr2 import image_processing_pil_got_ocr2 as got
from transformers.models.internvl import configuration_internvl
from transformers.models.internvl import modeling_internvl

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'internvl_tiles_golden.npz')
TILE, MIN_TILES, MAX_TILES = 28, 1, 6
# Wide, tall, square, small (upsampled), and a tie between grids.
SIZES = ((40, 90), (100, 30), (56, 56), (20, 20), (30, 61))


def smooth_image(rng, height, width):
  """uint8 RGB: a coarse random pattern upsampled, plus a little noise
  (resamplers then agree to a few levels)."""
  coarse = rng.uniform(0, 255, (height // 6 + 2, width // 6 + 2, 3))
  rows = np.linspace(0, coarse.shape[0] - 1, height)
  cols = np.linspace(0, coarse.shape[1] - 1, width)
  r0, c0 = rows.astype(int), cols.astype(int)
  r1 = np.minimum(r0 + 1, coarse.shape[0] - 1)
  c1 = np.minimum(c0 + 1, coarse.shape[1] - 1)
  fr, fc = (rows - r0)[:, None, None], (cols - c0)[None, :, None]
  image = ((1 - fr) * ((1 - fc) * coarse[r0][:, c0] + fc * coarse[r0][:, c1])
           + fr * ((1 - fc) * coarse[r1][:, c0] + fc * coarse[r1][:, c1]))
  image = image + rng.normal(0, 4, image.shape)
  return np.clip(np.round(image), 0, 255).astype(np.uint8)


def main():
  rng = np.random.default_rng(0)
  out = {}
  sizes = [(h, w) for h in range(8, 200, 13) for w in range(8, 200, 11)]
  out['grid_sizes'] = np.array(sizes)
  out['grid'] = np.array([got.get_optimal_tiled_canvas(
      s, (TILE, TILE), MIN_TILES, MAX_TILES) for s in sizes])
  processor = got.GotOcr2ImageProcessorPil(
      crop_to_patches=True, min_patches=MIN_TILES, max_patches=MAX_TILES,
      size={'height': TILE, 'width': TILE}, do_normalize=False)
  for i, (h, w) in enumerate(SIZES):
    image = smooth_image(rng, h, w)
    pixels = processor(images=[image], return_tensors='np')['pixel_values']
    out[f'image_{i}'] = image
    out[f'tiles_{i}'] = np.asarray(pixels).transpose(0, 2, 3, 1)
  config = configuration_internvl.InternVLConfig(
      vision_config=dict(hidden_size=8), text_config=dict(hidden_size=16),
      downsample_ratio=0.5)
  projector = modeling_internvl.InternVLMultiModalProjector(config).eval()
  with torch.no_grad():
    for name, p in projector.named_parameters():
      p.add_(torch.randn(p.shape) * 0.3)
      out[f'projector/{name.replace(".", "/")}'] = p.numpy().copy()
    features = torch.randn(2, 16, 8)
    grid = features.reshape(2, 4, 4, 8)
    shuffled = modeling_internvl.InternVLModel.pixel_shuffle(
        None, grid, scale_factor=0.5).reshape(2, -1, 32)
    out['features'] = features.numpy()
    out['shuffled'] = shuffled.numpy()
    out['projected'] = projector(shuffled).numpy()
  np.savez_compressed(OUT, **out)
  print(f'{OUT}: {os.path.getsize(OUT)} bytes; grids of SIZES:',
        [got.get_optimal_tiled_canvas(s, (TILE, TILE), MIN_TILES, MAX_TILES)
         for s in SIZES])


if __name__ == '__main__':
  main()
