r"""Writes the golden files of timm's self-supervised and DeiT III ViTs.

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_ssl_golden.py

writes into tests/data:
- timm_ssl/{dinov2,dinov2_reg4,dinov2_swiglu,deit3,mae}: small random timm
  models at the testing presets' shapes (width 32, MLP 64, 2 heads, 2
  blocks), saved by timm's own `save_for_hf`: vit_small_patch14_dinov2 and
  vit_small_patch14_reg4_dinov2 (56 px, a 4x4 grid), a DINOv2 with the
  SwiGLU MLP of vit_giant_patch14_dinov2 (its entrypoint), at 56 px,
  deit3_small_patch16_224 (5 classes) and vit_base_patch16_224.mae, both at
  64 px; every parameter drawn anew, LayerScale's too.
- timm_ssl_golden.npz: 64 px images (the 56 and 28 px ones are their
  top-left crops) and timm's outputs: features
  (`forward_head(forward_features(x), pre_logits=True)`), DeiT III's
  logits, and DINOv2's features at 28 px, its model built at 28 px and
  loaded with timm's checkpoint filter (which resizes the position table).
- timm_posemb_resize.npz: position tables resized by timm's own
  `resample_abs_pos_embed` (torch's antialiased bicubic, in float32), and
  by the same `interpolate` call in float64 (without torch's float32
  rounding): 37x37 -> 16x16 (DINOv2's 518 px table at 224 px),
  16x16 -> 24x24 and 5x7 -> 9x4.

With --full_size DIR it writes instead the real-size random models
(vit_small_patch14_dinov2 at 518 px and its reg4 twin,
deit3_small_patch16_224, vit_base_patch16_224.mae) with their outputs in
DIR/golden.npz (DINOv2-S also at 224 px), for a check outside CI:

  python scripts/make_ssl_golden.py --full_size /tmp/ssl_full
  VIT_JAX_SSL_FULL=/tmp/ssl_full pytest tests/convert/test_ssl.py -k full_size
"""

import argparse
import os
import shutil

import numpy as np
import timm
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
# (old grid, new grid) of each resized table; a class entry leads each.
RESIZES = {'37_16': ((37, 37), (16, 16)), '16_24': ((16, 16), (24, 24)),
           '5x7_9x4': ((5, 7), (9, 4))}

TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
# name: (timm architecture, its create_model arguments, image side).
MODELS = {
    'dinov2': ('vit_small_patch14_dinov2', {}, 56),
    'dinov2_reg4': ('vit_small_patch14_reg4_dinov2', {}, 56),
    # timm's fc1 makes 2 * 64 features for SwiGLUPacked: mlp_ratio 4.
    'dinov2_swiglu': ('vit_giant_patch14_dinov2', dict(mlp_ratio=4.), 56),
    'deit3': ('deit3_small_patch16_224', dict(num_classes=5), 64),
    'mae': ('vit_base_patch16_224.mae', {}, 64),
}
FULL = {
    'dinov2': ('vit_small_patch14_dinov2', 518),
    'dinov2_reg4': ('vit_small_patch14_reg4_dinov2', 518),
    'deit3': ('deit3_small_patch16_224', 224),
    'mae': ('vit_base_patch16_224.mae', 224),
}


def _images(side, seed=0):
  return np.random.default_rng(seed).uniform(-1, 1, (2, side, side, 3)).astype(
      np.float32)


def _outputs(model, images):
  """Logits with a head, else timm's pooled features."""
  with torch.no_grad():
    x = model.forward_features(torch.from_numpy(images).permute(0, 3, 1, 2))
    return model.forward_head(x, pre_logits=not model.num_classes).numpy()


def _shift(model, scale):
  """Every parameter moved off its init by N(0, scale)."""
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def _resized(architecture, state, side, **kwargs):
  """timm's model at `side` px with `state` loaded as timm loads a
  checkpoint made at another size (its filter resamples pos_embed)."""
  model = timm.create_model(architecture, img_size=side, **kwargs).eval()
  filtered = timm.models.vision_transformer.checkpoint_filter_fn(state, model)
  model.load_state_dict(filtered)
  return model


def write_testing():
  torch.manual_seed(0)
  images = _images(64)  # smaller images are its top-left crops
  golden = {'images': images}
  folder = os.path.join(OUT, 'timm_ssl')
  shutil.rmtree(folder, ignore_errors=True)
  for name, (architecture, kwargs, side) in MODELS.items():
    model = timm.create_model(architecture, img_size=side,
                              **dict(TESTING, **kwargs)).eval()
    _shift(model, 0.3)
    golden[name] = _outputs(model, images[:, :side, :side])
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
  small = _resized('vit_small_patch14_dinov2', model_state('dinov2', folder),
                   28, **TESTING)
  golden['dinov2_28'] = _outputs(small, images[:, :28, :28])
  np.savez(os.path.join(OUT, 'timm_ssl_golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


def model_state(name, folder):
  from safetensors.torch import load_file  # pylint: disable=g-import-not-at-top
  return load_file(os.path.join(folder, name, 'model.safetensors'))


def write_full_size(folder):
  """timm's own init, then every parameter shifted by N(0, 0.02)."""
  torch.manual_seed(0)
  shutil.rmtree(folder, ignore_errors=True)
  golden = {'images224': _images(224), 'images518': _images(518)}
  for name, (architecture, side) in FULL.items():
    model = timm.create_model(architecture).eval()
    _shift(model, 0.02)
    golden[name] = _outputs(model, golden[f'images{side}'])
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
  small = _resized('vit_small_patch14_dinov2', model_state('dinov2', folder),
                   224)
  golden['dinov2_224'] = _outputs(small, golden['images224'])
  np.savez(os.path.join(folder, 'golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


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
  parser.add_argument('--full_size', help='folder for the real-size check')
  args = parser.parse_args()
  if args.full_size:
    write_full_size(args.full_size)
  else:
    write_testing()
    write_posemb_resize()
