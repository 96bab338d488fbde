r"""Writes timm's prepared pixels and probabilities that test `vit_jax.predict`.

Needs torch and timm (`pip install -e '.[bench]'`); the tests that read the
files need neither. A non-square JPEG (300 x 200, drawn from a fixed seed)
goes through timm's own eval transforms (`timm.data.create_transform` of
`resolve_data_config`) and a random ViT of the 'testing' preset's shapes at
64 px with 10 classes, with timm's exact GELU. The files, in tests/data/:

  predict_image.jpg              the image
  timm_predict_vit.safetensors   the ViT's weights, in timm's layout
  timm_predict.transform.json    the eval transform of 'center', as `convert`
                                 records it (with the exact-GELU override)
  timm_predict.npz               per transform NAME: NAME (timm's prepared
                                 image, HWC) and NAME_probs (its softmax);
                                 'bare' is `create_transform(crop_pct=0.9,
                                 interpolation='bicubic')` alone, as for a
                                 weights file without config.json

  python scripts/make_predict_golden.py
"""

import json
import os

import numpy as np
from PIL import Image
from safetensors.torch import save_file
import timm
import timm.data
import torch

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
SIZE = 64
# Each transform's `resolve_data_config` arguments. 'center' at crop_pct
# 0.875 crops at (22.5, 4.5) before rounding: torchvision's half-to-even.
TRANSFORMS = {
    'center': dict(crop_pct=0.875, interpolation='bicubic', crop_mode='center',
                   mean=timm.data.IMAGENET_DEFAULT_MEAN,
                   std=timm.data.IMAGENET_DEFAULT_STD),
    # The original release's preprocessing, as timm spells it.
    'squash': dict(crop_pct=1.0, interpolation='bilinear', crop_mode='squash',
                   mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
    'border': dict(crop_pct=0.95, interpolation='lanczos', crop_mode='border',
                   mean=timm.data.IMAGENET_DEFAULT_MEAN,
                   std=timm.data.IMAGENET_DEFAULT_STD),
}


def make_image(path):
  """Smooth colour ramps and a disc, with mild noise: a small JPEG."""
  rng = np.random.default_rng(0)
  y, x = np.mgrid[0:200, 0:300].astype(np.float32)
  disc = ((x - 200) ** 2 + (y - 80) ** 2 < 50 ** 2) * 120.
  rgb = np.stack([x * 0.8, y * 1.2, 255 - (x + y) * 0.5], -1) + disc[..., None]
  rgb += rng.normal(0, 6, rgb.shape)
  Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(path,
                                                               quality=90)


def make_model():
  """The 'testing' preset's shapes (width 10, MLP 10, 2 heads, 1 block)."""
  torch.manual_seed(0)
  model = timm.create_model(
      'vit_tiny_patch16_224', pretrained=False, img_size=SIZE, embed_dim=10,
      depth=1, num_heads=2, mlp_ratio=1.0, num_classes=10).eval()
  with torch.no_grad():
    for param in model.parameters():
      param.normal_(0, 0.6)  # init's tiny weights: near-uniform classes
  return model


def main():
  image_path = os.path.join(OUT, 'predict_image.jpg')
  make_image(image_path)
  model = make_model()
  assert isinstance(model.blocks[0].mlp.act, torch.nn.GELU)
  assert model.blocks[0].mlp.act.approximate == 'none'
  golden = {}
  for name, args in TRANSFORMS.items():
    config = timm.data.resolve_data_config(
        dict(args, input_size=(3, SIZE, SIZE)), model=model)
    pixels = timm.data.create_transform(**config)(
        Image.open(image_path).convert('RGB'))
    with torch.no_grad():
      logits = model(pixels[None])
    golden[name] = pixels.permute(1, 2, 0).numpy()
    golden[f'{name}_probs'] = torch.softmax(logits, -1)[0].numpy()
    if name == 'center':
      record = {k: list(v) if isinstance(v, tuple) else v
                for k, v in config.items()}
      record['model'] = {'transformer': {'gelu_approximate': False}}
      with open(os.path.join(OUT, 'timm_predict.transform.json'), 'w') as f:
        f.write(json.dumps(record, indent=1) + '\n')
  # timm's transform with only these two given: its defaults for the rest.
  pixels = timm.data.create_transform(
      input_size=(3, SIZE, SIZE), crop_pct=0.9, interpolation='bicubic')(
          Image.open(image_path).convert('RGB'))
  with torch.no_grad():
    golden['bare_probs'] = torch.softmax(model(pixels[None]), -1)[0].numpy()
  golden['bare'] = pixels.permute(1, 2, 0).numpy()
  np.savez(os.path.join(OUT, 'timm_predict.npz'), **golden)
  save_file({k: v.contiguous() for k, v in model.state_dict().items()},
            os.path.join(OUT, 'timm_predict_vit.safetensors'))
  for name in (*TRANSFORMS, 'bare'):
    print(name, np.round(np.sort(golden[f'{name}_probs'])[::-1][:5], 4))


if __name__ == '__main__':
  main()
