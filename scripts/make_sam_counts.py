r"""Writes timm's parameter counts of SAM's image encoders.

Needs torch and timm 1.0.31 (the golden venv); the tests need neither.
The models are built on torch's meta device (no memory):

  /work/venv_golden/bin/python scripts/make_sam_counts.py

writes tests/data/sam_param_counts.json: for each vit_jax SAM preset, the
count of timm's samvit_{base,large,huge}_patch16 (its default
num_classes=0: no head, the neck's output is the features); 'SAM-testing'
is samvit_base_patch16 shrunk as scripts/make_sam_golden.py makes it.
"""

import json
import os

import timm
import torch

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')

# vit_jax preset: (timm architecture, kwargs).
TESTING = dict(img_size=128, embed_dim=16, depth=4, num_heads=2,
               window_size=4, global_attn_indexes=(1, 3), neck_chans=8)
MODELS = {
    'SAM-testing': ('samvit_base_patch16', TESTING),
    'SAM-B': ('samvit_base_patch16', {}),
    'SAM-L': ('samvit_large_patch16', {}),
    'SAM-H': ('samvit_huge_patch16', {}),
}


def main():
  counts = {}
  with torch.device('meta'):
    for name, (architecture, kwargs) in MODELS.items():
      model = timm.create_model(architecture, **kwargs)
      counts[name] = sum(p.numel() for p in model.parameters())
  path = os.path.join(DATA, 'sam_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(timm=timm.__version__, counts=counts,
                   architectures={k: v[0] for k, v in MODELS.items()}),
              f, indent=1, sort_keys=True)
  print(f'Wrote {path}: {counts}')


if __name__ == '__main__':
  main()
