r"""Writes timm DeiT folders and timm's logits that test convert's DeiT path.

Two random timm models, `deit_tiny_patch16_224` and its distilled twin, at
the 'DeiT-testing' presets' shapes (width 32, 2 blocks, 2 heads, MLP 64,
8x8 patches of 32x32 images, 5 classes), saved by timm's own `save_for_hf`
into tests/data/timm_deit/{deit,deit_distilled}, and timm's evaluation
logits (the distilled one: the mean of its two heads) with the images in
tests/data/timm_deit_logits.npz. Needs torch and timm (`pip install -e
'.[bench]'`); the tests need neither.

  python scripts/make_deit_golden.py

With --full_size DIR it writes instead the real-size random
deit_tiny_distilled_patch16_224 (1000 classes, 224 px) to DIR, with its
logits in DIR/logits.npz, for a check outside CI:

  python scripts/make_deit_golden.py --full_size /tmp/deit_full
  VIT_JAX_DEIT_FULL=/tmp/deit_full pytest tests/convert/test_converter.py -k full_size
"""

import argparse
import os
import shutil

import numpy as np
import timm
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.,
               patch_size=8, img_size=32, num_classes=5)
CASES = {'deit': 'deit_tiny_patch16_224',
         'deit_distilled': 'deit_tiny_distilled_patch16_224'}


def _randomize(model, scale):
  """Every parameter drawn anew, so that nothing sits at a trivial init."""
  with torch.no_grad():
    for param in model.parameters():
      param.normal_(0, scale)


def _logits(model, images):
  with torch.no_grad():
    return model(torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()


def write_testing():
  torch.manual_seed(0)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype(
      np.float32)
  golden = {'images': images}
  folder = os.path.join(OUT, 'timm_deit')
  shutil.rmtree(folder, ignore_errors=True)
  for name, architecture in CASES.items():
    model = timm.create_model(architecture, **TESTING).eval()
    _randomize(model, 0.5)
    golden[name] = _logits(model, images)
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
  np.savez(os.path.join(OUT, 'timm_deit_logits.npz'), **golden)
  print('wrote', folder, sorted(golden))


def write_full_size(folder):
  """timm's own init, then every parameter shifted by N(0, 0.02): layer
  norms near 1, logits of order 1."""
  torch.manual_seed(0)
  images = np.random.default_rng(0).uniform(-2, 2, (2, 224, 224, 3)).astype(
      np.float32)
  model = timm.create_model('deit_tiny_distilled_patch16_224').eval()
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * 0.02)
  shutil.rmtree(folder, ignore_errors=True)
  timm.models.save_for_hf(model, folder, safe_serialization=True)
  np.savez(os.path.join(folder, 'logits.npz'), images=images,
           logits=_logits(model, images))
  print('wrote', folder)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--full_size', help='folder for the real-size check')
  args = parser.parse_args()
  if args.full_size:
    write_full_size(args.full_size)
  else:
    write_testing()
