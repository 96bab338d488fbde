r"""Writes timm folders (config.json + model.safetensors) that test convert.

Each case is a timm model made by `timm.create_model` and saved by timm's
own `save_for_hf`, so `config.json` holds exactly the keys timm writes.
The cases that vit_jax can express (the 'testing' preset's shapes: width
10, one block, 2 heads, 16x16 patches of 32x32 images) come with timm's
logits in `timm_hf_logits.npz`; the cases that convert must refuse are
smaller still (4x4 patches of 8x8 images). Needs torch and timm (`pip
install -e '.[bench]'`); the tests need neither.

  python scripts/make_timm_config_golden.py
"""

import os
import shutil

import numpy as np
import timm
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'timm_hf')
TINY = dict(embed_dim=10, depth=1, num_heads=2, mlp_ratio=1.0, num_classes=5)
TESTING = dict(TINY, img_size=32)  # the 'testing' preset's shapes
SMALL = dict(TINY, img_size=8, patch_size=4)  # refused: no logits needed
VIT = 'vit_tiny_patch16_224'
CASES = {
    # Expressible: timm's logits are kept.
    'token': (VIT, TESTING),  # timm's defaults: class token, exact GELU
    'token_tanh': (VIT, dict(TESTING, act_layer='gelu_tanh')),
    'token_fc_norm': (VIT, dict(TESTING, fc_norm=True)),
    'gap': (VIT, dict(TESTING, class_token=False, global_pool='avg',
                      fc_norm=False)),
    # The class token is left out of the mean: refused, but timm's logits
    # show what a silent conversion would get wrong.
    'avg_cls': (VIT, dict(TESTING, global_pool='avg', fc_norm=False)),
    # Refused.
    'avg_fc_norm': (VIT, dict(SMALL, class_token=False, global_pool='avg')),
    'layerscale': (VIT, dict(SMALL, init_values=1e-5)),
    'registers': (VIT, dict(SMALL, reg_tokens=1)),
    'qk_norm': (VIT, dict(SMALL, qk_norm=True)),
    'no_embed_class': (VIT, dict(SMALL, no_embed_class=True)),
    'pre_norm': (VIT, dict(SMALL, pre_norm=True)),
    'dynamic_img_size': (VIT, dict(SMALL, dynamic_img_size=True)),
    'map': (VIT, dict(SMALL, class_token=False, global_pool='map')),
    'quick_gelu': (VIT, dict(SMALL, act_layer='quick_gelu')),
    'deit3': ('deit3_small_patch16_224', dict(SMALL)),
}


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  golden = {'images': images}
  shutil.rmtree(OUT, ignore_errors=True)
  for name, (architecture, kwargs) in CASES.items():
    model = timm.create_model(architecture, **kwargs).eval()
    with torch.no_grad():
      for param in model.parameters():
        # Wide enough that the GELUs' inputs reach where tanh and erf differ.
        param.normal_(0, 0.5)
      if kwargs.get('img_size') == 32:
        golden[name] = model(
            torch.from_numpy(images).permute(0, 3, 1, 2)).numpy()
    timm.models.save_for_hf(model, os.path.join(OUT, name),
                            safe_serialization=True)
  np.savez(os.path.join(OUT, '..', 'timm_hf_logits.npz'), **golden)
  print('wrote', sorted(os.listdir(OUT)))


if __name__ == '__main__':
  main()
