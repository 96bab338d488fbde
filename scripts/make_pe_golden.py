r"""Writes the golden files of timm's Perception Encoder (`vit_pe_*`).

Needs torch and timm 1.0.31 (the golden venv); the tests need neither.

  python scripts/make_pe_golden.py

writes into tests/data:
- timm_pe/NAME: small random timm models (width 32, 2 heads, 2 blocks, MLP
  64; each entrypoint's own RoPE, attention pool of 8 heads, LayerScale,
  class token and norms), every parameter moved off its init by N(0, 0.3),
  saved by timm's `save_for_hf` (config.json beside model.safetensors), of
  the entrypoints in MODELS.
- timm_pe_golden.npz: the 64 px images of the SSL golden files (56 px:
  their top-left crops) and timm's outputs of each model: NAME, the pooled
  output (`forward_head(forward_features(x))`: through the attention pool
  and projection `head` of PE Core); NAME/tokens, every token
  (`forward_features`); NAME/blocks[_norm]/i, the NHWC maps of
  `forward_intermediates(x, 2, norm=, intermediates_only=True)`;
  core_48: PE Core's pooled output at 48 px, timm's model built at 48 px
  and loaded with its checkpoint filter (which resizes the table);
  rope/sin, rope/cos: timm's 'cat' RoPE (`create_rope_embed`) of a 3x5
  grid at PE's settings (offset 1, 'xy', a 4x6 reference grid), head
  width 16.
- pe_param_counts.json: timm's parameter count of each vit_jax PE preset's
  entrypoint at 224 px with a 1000-class head (the testing presets': at
  the sizes above), built on torch's meta device; and the published
  presets' pretrained_cfg: input side, mean and std.
"""

import json
import os
import shutil

import numpy as np
from safetensors.torch import load_file
import timm
import torch

# The SSL golden files' images, outputs and parameter shifts (this folder).
from make_ssl_golden import _images
from make_ssl_golden import _outputs
from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
TESTING = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.)
# name: (timm entrypoint, create_model arguments, image side). PE Core's
# head is its projection (16 wide here); Spatial and Lang have none.
MODELS = {
    'core': ('vit_pe_core_small_patch16_384', dict(num_classes=16), 64),
    # G: no class token, RoPE positions from 0, a 32x32 reference grid (as
    # the Spatial and Lang G's, whose blocks Lang L's LayerScale covers);
    # the testing preset's patch.
    'core_g': ('vit_pe_core_gigantic_patch14_448',
               dict(num_classes=16, patch_size=16), 64),
    'spatial': ('vit_pe_spatial_small_patch16_512', dict(num_classes=0), 64),
    'lang': ('vit_pe_lang_large_patch14_448', dict(num_classes=0), 56),
}
# vit_jax preset: its timm entrypoint (the testing ones at TESTING).
PRESETS = {
    'PE-Core-testing': 'vit_pe_core_small_patch16_384',
    'PE-Core-T_16': 'vit_pe_core_tiny_patch16_384',
    'PE-Core-S_16': 'vit_pe_core_small_patch16_384',
    'PE-Core-B_16': 'vit_pe_core_base_patch16_224',
    'PE-Core-L_14': 'vit_pe_core_large_patch14_336',
    'PE-Core-G_14': 'vit_pe_core_gigantic_patch14_448',
    'PE-Spatial-testing': 'vit_pe_spatial_small_patch16_512',
    'PE-Spatial-T_16': 'vit_pe_spatial_tiny_patch16_512',
    'PE-Spatial-S_16': 'vit_pe_spatial_small_patch16_512',
    'PE-Spatial-B_16': 'vit_pe_spatial_base_patch16_512',
    'PE-Spatial-L_14': 'vit_pe_spatial_large_patch14_448',
    'PE-Spatial-G_14': 'vit_pe_spatial_gigantic_patch14_448',
    'PE-Lang-testing': 'vit_pe_lang_large_patch14_448',
    'PE-Lang-L_14': 'vit_pe_lang_large_patch14_448',
    'PE-Lang-G_14': 'vit_pe_lang_gigantic_patch14_448',
}


def _blocks(model, images, norm):
  """timm's `forward_intermediates` maps of the last 2 blocks, NHWC."""
  with torch.no_grad():
    maps = model.forward_intermediates(
        torch.from_numpy(images).permute(0, 3, 1, 2), indices=2, norm=norm,
        output_fmt='NCHW', intermediates_only=True)
  return [m.permute(0, 2, 3, 1).numpy() for m in maps]


def _resized(architecture, model, side, kwargs):
  """timm's model at `side` px with `model`'s state loaded as timm loads
  a checkpoint made at another size (its filter resamples pos_embed)."""
  small = timm.create_model(architecture, img_size=side,
                            **dict(TESTING, **kwargs)).eval()
  small.load_state_dict(timm.models.eva.checkpoint_filter_fn(
      model.state_dict(), small))
  return small


def _rope():
  """timm's PE RoPE (sin, cos), interleaved, of a 3x5 grid."""
  rope = timm.layers.create_rope_embed(
      rope_type='cat', dim=32, num_heads=2, feat_shape=(3, 5),
      temperature=10000., grid_indexing='xy', in_pixels=False,
      grid_offset=1., ref_feat_shape=(4, 6))
  sin, cos = rope.get_embed().chunk(2, -1)
  return sin.numpy(), cos.numpy()


def write_models():
  torch.manual_seed(0)
  images = _images(64)
  golden = {'images': images}
  golden['rope/sin'], golden['rope/cos'] = _rope()
  folder = os.path.join(OUT, 'timm_pe')
  shutil.rmtree(folder, ignore_errors=True)
  for name, (architecture, kwargs, side) in MODELS.items():
    model = timm.create_model(architecture, img_size=side,
                              **dict(TESTING, **kwargs)).eval()
    _shift(model, 0.3)
    x = images[:, :side, :side]
    golden[name] = _outputs(model, x)
    with torch.no_grad():
      golden[f'{name}/tokens'] = model.forward_features(
          torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    for norm in (False, True):
      for i, m in enumerate(_blocks(model, x, norm)):
        golden[f'{name}/blocks{"_norm" if norm else ""}/{i}'] = m
    timm.models.save_for_hf(model, os.path.join(folder, name),
                            safe_serialization=True)
  architecture, kwargs, _ = MODELS['core']
  core = timm.create_model(architecture, img_size=64,
                           **dict(TESTING, **kwargs))
  core.load_state_dict(load_file(os.path.join(folder, 'core',
                                              'model.safetensors')))
  golden['core_48'] = _outputs(_resized(architecture, core, 48, kwargs),
                               images[:, :48, :48])
  np.savez(os.path.join(OUT, 'timm_pe_golden.npz'), **golden)
  print('wrote', folder, sorted(golden))


def write_counts():
  counts, published = {}, {}
  with torch.device('meta'):
    for preset, architecture in PRESETS.items():
      sizes = TESTING if preset.endswith('-testing') else {}
      model = timm.create_model(architecture, img_size=224, num_classes=1000,
                                **sizes)
      counts[preset] = sum(p.numel() for p in model.parameters())
      if not sizes:
        cfg = timm.models.get_pretrained_cfg(f'{architecture}.fb')
        published[preset] = dict(side=cfg.input_size[-1], mean=cfg.mean,
                                 std=cfg.std)
  path = os.path.join(OUT, 'pe_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(timm=timm.__version__, counts=counts,
                   pretrained_cfg=published), f, indent=1, sort_keys=True)
  print(f'Wrote {len(counts)} counts to {path}.')


if __name__ == '__main__':
  write_models()
  write_counts()
