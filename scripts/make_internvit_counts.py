r"""Writes timm's and transformers' parameter counts of InternViT's sizes.

Needs torch, timm 1.0.31 and transformers 5.23 (the golden venv); the tests
need neither. The models are built on torch's meta device (no memory):

  /work/venv_golden/bin/python scripts/make_internvit_counts.py

writes tests/data/internvit_param_counts.json: for each vit_jax InternViT
preset, the count of transformers' InternVLVisionModel of its shapes and
settings at 224 px (a 16 x 16 table), and, for the 300M-like ones, of
timm's vit_intern300m_patch14_448 (num_classes=0). They have no
classifier: the test adds its 1,000-class head.
"""

import json
import os

import timm
import torch
import transformers

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')

# The presets' shapes: (hidden_size, intermediate_size, num_attention_heads,
# num_hidden_layers, 6B's blocks), as vit_jax/models/families/internvit.py.
SIZES = {
    'InternViT-testing': (16, 64, 2, 2, False),
    'InternViT-6B-testing': (24, 48, 3, 2, True),
    'InternViT-300M_14': (1024, 4096, 16, 24, False),
    'InternViT-6B_14': (3200, 12800, 25, 45, True),
}


def _count(model):
  return sum(p.numel() for p in model.parameters())


def _transformers(hidden, mlp, heads, layers, six_b):
  six_b_settings = dict(use_qk_norm=True, norm_type='rms_norm',
                        attention_bias=False)
  config = transformers.InternVLVisionConfig(
      hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads,
      num_hidden_layers=layers, image_size=224, patch_size=14,
      **(six_b_settings if six_b else dict(attention_bias=True)))
  return transformers.InternVLVisionModel(config)


def _timm(hidden, mlp, heads, layers):
  return timm.create_model('vit_intern300m_patch14_448', img_size=224,
                           num_classes=0, embed_dim=hidden, depth=layers,
                           num_heads=heads, mlp_ratio=mlp / hidden)


def main():
  counts = {'transformers': {}, 'timm': {}}
  with torch.device('meta'):
    for name, row in SIZES.items():
      counts['transformers'][name] = _count(_transformers(*row))
      if not row[-1]:
        counts['timm'][name] = _count(_timm(*row[:-1]))
  path = os.path.join(DATA, 'internvit_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(transformers=transformers.__version__,
                   timm=timm.__version__, counts=counts), f, indent=1,
              sort_keys=True)
  print(f'Wrote {path}: {counts}')


if __name__ == '__main__':
  main()
