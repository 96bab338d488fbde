r"""Writes the tiny timm checkpoints and timm's logits that test the converter.

Needs torch and timm (`pip install -e '.[bench]'`); the tests that read the
files need neither. The models are the 'testing' ViT (class token, and mean
pooling) and 'Mixer-testing', with random weights and GELU's tanh form, the
one flax's `nn.gelu` computes, so that the logits can agree tightly.

  python scripts/make_timm_golden.py
"""

import functools
import os

import numpy as np
from safetensors.torch import save_file
from timm.models import mlp_mixer
from timm.models import vision_transformer
from timm.models import vision_transformer_hybrid
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
COMMON = dict(img_size=32, patch_size=16, num_classes=5,
              act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
              norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6))
MODELS = {
    'timm_vit': lambda: vision_transformer.VisionTransformer(
        embed_dim=10, depth=1, num_heads=2, mlp_ratio=1.0, **COMMON),
    'timm_vit_gap': lambda: vision_transformer.VisionTransformer(
        embed_dim=10, depth=1, num_heads=2, mlp_ratio=1.0, class_token=False,
        global_pool='avg', fc_norm=False, **COMMON),
    'timm_mixer': lambda: mlp_mixer.MlpMixer(
        embed_dim=16, num_blocks=2, mlp_ratio=(0.5, 2.0), **COMMON),
    # A ResNet root and one stage of one unit, then 1x1 patches, at 64 px.
    'timm_hybrid': lambda: vision_transformer.VisionTransformer(
        embed_dim=32, depth=1, num_heads=2, mlp_ratio=1.0, **dict(
            COMMON, img_size=64, patch_size=1,
            embed_layer=functools.partial(
                vision_transformer_hybrid.HybridEmbed,
                backbone=vision_transformer_hybrid._resnetv2(layers=(1,))))),
}


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  golden = {'images': rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32),
            'images64': rng.uniform(-1, 1, (2, 64, 64, 3)).astype(np.float32)}
  for name, make in MODELS.items():
    images = golden['images64' if name == 'timm_hybrid' else 'images']
    model = make().eval()
    with torch.no_grad():
      for param in model.parameters():
        param.normal_(0, 0.3)
      golden[name] = model(torch.from_numpy(images).permute(0, 3, 1, 2)
                           ).numpy()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(OUT, f'{name}.safetensors'))
  np.savez(os.path.join(OUT, 'timm_logits.npz'), **golden)
  print('wrote', sorted(os.listdir(OUT)))


if __name__ == '__main__':
  main()
