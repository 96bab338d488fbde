r"""Writes the golden files of timm's Swin Transformer.

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_swin_golden.py

writes into tests/data:
- timm_swin.safetensors: a small random timm SwinTransformer at the
  'Swin-testing' preset's shapes (patch 2, width 4, depths (2, 2, 2, 2),
  heads (1, 2, 2, 4), window 2, 10 classes), every parameter moved off its
  init by N(0, 0.3); its state_dict (no buffers), as a bare file.
- timm_swin_golden.npz: 64 px images (the 32 px ones are their top-left
  crops); timm's logits at 64 px (every stage shifted) and at 32 px (the
  last stage is one window, unshifted: the same weights in a timm model
  built at 32 px); the four stages' outputs at 64 px (NHWC); bias tables
  resized by timm's `resize_rel_pos_bias_table` (7 -> 12 and 2 -> 3).

With --full_size DIR it writes instead timm's swin_tiny_patch4_window7_224,
random (timm's init, then N(0, 0.02) added), as DIR/swin_t.safetensors
and its logits on 224 px images in DIR/golden.npz, for the check by hand:

  python scripts/make_swin_golden.py --full_size /tmp/swin_full
  python -m vit_jax.convert --model_name=Swin-T \
      /tmp/swin_full/swin_t.safetensors /tmp/swin_full/swin_t.npz
  VIT_JAX_SWIN_FULL=/tmp/swin_full pytest tests/convert/test_swin.py -k full
"""

import argparse
import os

import numpy as np
from safetensors.torch import save_file
import timm
from timm.layers import resize_rel_pos_bias_table
from timm.models.swin_transformer import SwinTransformer
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
TESTING = dict(patch_size=2, embed_dim=4, depths=(2, 2, 2, 2),
               num_heads=(1, 2, 2, 4), window_size=2, num_classes=10)
# name: (old window, new window, heads)
RESIZES = {'7_12': (7, 12, 3), '2_3': (2, 3, 2)}


def _images(side, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (2, side, side, 3)).astype(
      np.float32)


def _nchw(images):
  return torch.from_numpy(images).permute(0, 3, 1, 2)


def _shift(model, scale):
  """Every parameter moved off its init by N(0, scale)."""
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def write_testing():
  torch.manual_seed(0)
  images = _images(64)
  model = SwinTransformer(img_size=64, **TESTING).eval()
  _shift(model, 0.3)
  small = SwinTransformer(img_size=32, **TESTING).eval()
  small.load_state_dict(model.state_dict())
  golden = {'images': images}
  with torch.no_grad():
    golden['logits64'] = model(_nchw(images)).numpy()
    golden['logits32'] = small(_nchw(images[:, :32, :32])).numpy()
    stages = model.forward_intermediates(_nchw(images),
                                         intermediates_only=True)
  for i, x in enumerate(stages):
    golden[f'stage_{i}'] = x.permute(0, 2, 3, 1).numpy()
  rng = np.random.default_rng(1)
  for name, (old, new, heads) in RESIZES.items():
    table = rng.normal(size=((2 * old - 1)**2, heads)).astype(np.float32)
    golden[f'{name}/old'] = table
    golden[f'{name}/new'] = resize_rel_pos_bias_table(
        torch.from_numpy(table), new_window_size=(new, new),
        new_bias_shape=((2 * new - 1)**2, heads)).numpy()
  save_file(model.state_dict(), os.path.join(OUT, 'timm_swin.safetensors'))
  np.savez(os.path.join(OUT, 'timm_swin_golden.npz'), **golden)
  print('wrote', sorted(golden))


def write_full_size(folder):
  torch.manual_seed(0)
  os.makedirs(folder, exist_ok=True)
  model = timm.create_model('swin_tiny_patch4_window7_224').eval()
  _shift(model, 0.02)
  images = _images(224)
  with torch.no_grad():
    logits = model(_nchw(images)).numpy()
  save_file(model.state_dict(), os.path.join(folder, 'swin_t.safetensors'))
  np.savez(os.path.join(folder, 'golden.npz'), images=images, logits=logits)
  print('wrote', folder)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--full_size', help='folder for the real-size check')
  args = parser.parse_args()
  if args.full_size:
    write_full_size(args.full_size)
  else:
    write_testing()
