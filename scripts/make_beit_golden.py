r"""Writes the golden files of timm's BEiT and BEiT v2 (`timm/models/beit.py`).

Needs torch and timm (`pip install -e '.[bench]'`); the tests need neither.

  python scripts/make_beit_golden.py

writes into tests/data:
- timm_beit/NAME: small random timm Beits (width 32, 2 heads, 2 blocks, MLP
  64, 16 px patches) at 48 px (a 3x3 grid), every parameter moved off its
  init by N(0, 0.3), saved by timm's own `save_for_hf` (config.json beside
  model.safetensors), of the entrypoints in MODELS with the settings given
  there: a table per block (BEiT, BEiT v2), and one table shared by the
  blocks beside a learned position table, with class-token pooling.
- timm_beit_golden.npz: 64 px images in [-1, 1] (the 48 px ones are their
  top-left crops), timm's outputs (`forward_head(forward_features(x),
  pre_logits=not num_classes)`) as NAME, and as NAME_64 those of the model
  built at 64 px (a 4x4 grid) that loaded NAME's state through timm's
  `checkpoint_filter_fn`, which resizes the tables (and the position
  table); tables of 2 heads after the 3 class rows resized by timm's own
  `resize_rel_pos_bias_table` as resize/OLD_NEW/{old,new} (grids); and
  timm's parameter count of each testing preset's model at 224 px with a
  1000-class head as count/PRESET.

With --full_size DIR it writes instead the real-size models of FULL (timm's
own init, every parameter then shifted by N(0, 0.02)) with their logits on
224 px images in DIR/golden.npz, and BEiT-B/16's at 384 px through timm's
checkpoint filter, for a check outside CI (--architectures: some of FULL,
where the disk holds less: each is 4 bytes a parameter, and its conversion
as much again):

  python scripts/make_beit_golden.py --full_size /tmp/beit_full
  VIT_JAX_BEIT_FULL=/tmp/beit_full pytest tests/convert/test_beit.py -k full
"""

import argparse

import os
import shutil

import numpy as np
import timm
import torch

# The SSL golden files' images, outputs and parameter shifts (this folder).
from make_ssl_golden import _images
from make_ssl_golden import _outputs
from make_ssl_golden import _shift
from make_ssl_golden import model_state

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
# name: (timm architecture, its create_model arguments).
MODELS = {
    'beit': ('beit_base_patch16_224', dict(num_classes=5)),
    'beit_shared': ('beit_base_patch16_224', dict(
        num_classes=0, use_rel_pos_bias=False, use_shared_rel_pos_bias=True,
        use_abs_pos_emb=True, global_pool='token')),
    'beitv2': ('beitv2_base_patch16_224', dict(num_classes=5)),
}
# The testing presets: the entrypoint that timm counts them by.
COUNTS = {'BEiT-testing': 'beit_base_patch16_224',
          'BEiTv2-testing': 'beitv2_base_patch16_224'}
# (old grid, new grid) of each table resized alone.
RESIZES = {'4_6': ((4, 4), (6, 6)), '4_3': ((4, 4), (3, 3)),
           '4_4x6': ((4, 4), (4, 6))}
SIDE, RESIZED = 48, 64
FULL = ('beit_base_patch16_224', 'beit_large_patch16_224',
        'beitv2_base_patch16_224')


def _resized(architecture, state, kwargs, side=RESIZED):
  """timm's model at `side` px with `state` loaded as timm loads a
  checkpoint made at another size."""
  model = timm.create_model(architecture, img_size=side, **kwargs).eval()
  model.load_state_dict(timm.models.beit.checkpoint_filter_fn(state, model))
  return model


def _table_resizes(golden):
  rng = np.random.default_rng(0)
  for name, (old, new) in RESIZES.items():
    rows = lambda grid: (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
    table = rng.normal(size=(rows(old), 2)).astype(np.float32)
    resized = timm.layers.resize_rel_pos_bias_table(
        torch.from_numpy(table), new_window_size=new,
        new_bias_shape=(rows(new), 2))
    golden[f'resize/{name}/old'] = table
    golden[f'resize/{name}/new'] = resized.numpy()


def main():
  torch.manual_seed(0)
  images = _images(RESIZED)
  golden = {'images': images}
  folder = os.path.join(OUT, 'timm_beit')
  shutil.rmtree(folder, ignore_errors=True)
  for name, (architecture, kwargs) in MODELS.items():
    model = timm.create_model(architecture, img_size=SIDE,
                              **dict(TESTING, **kwargs)).eval()
    _shift(model, 0.3)
    golden[name] = _outputs(model, images[:, :SIDE, :SIDE])
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
    golden[f'{name}_{RESIZED}'] = _outputs(
        _resized(architecture, model_state(name, folder),
                 dict(TESTING, **kwargs)), images)
  for preset, architecture in COUNTS.items():
    full = timm.create_model(architecture, img_size=224, num_classes=1000,
                             **TESTING)
    golden[f'count/{preset}'] = np.array(
        sum(p.numel() for p in full.parameters()))
  _table_resizes(golden)
  np.savez(os.path.join(OUT, 'timm_beit_golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


def write_full_size(folder, architectures=FULL):
  torch.manual_seed(0)
  shutil.rmtree(folder, ignore_errors=True)
  golden = {'images224': _images(224), 'images384': _images(384)}
  for architecture in architectures:
    model = timm.create_model(architecture).eval()
    _shift(model, 0.02)
    golden[architecture] = _outputs(model, golden['images224'])
    timm.models.save_for_hf(model, os.path.join(folder, architecture),
                            safe_serialization=True)
  base = FULL[0]
  if base in architectures:
    golden[f'{base}_384'] = _outputs(
        _resized(base, model_state(base, folder), {}, 384),
        golden['images384'])
  np.savez(os.path.join(folder, 'golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--full_size', help='folder for the real-size check')
  parser.add_argument('--architectures', nargs='+', default=FULL,
                      choices=FULL, help='of the real-size models')
  args = parser.parse_args()
  if args.full_size:
    write_full_size(args.full_size, args.architectures)
  else:
    main()
