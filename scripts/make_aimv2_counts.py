r"""Writes timm's parameter counts of models of AIMv2's sizes.

Needs torch and timm 1.0.31 (the golden venv); the tests need neither. The
models are built on torch's meta device (no memory):

  python scripts/make_aimv2_counts.py

writes tests/data/aimv2_param_counts.json: for each vit_jax AIMv2 preset,
the count of timm's `aimv2_*_patch14_224` of its shapes (no classifier: the
test adds its 1,000-class head); 'AIMv2-testing' is timm's large entrypoint
at vit_jax's testing shapes.
"""

import json
import os

import timm
import torch

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')

# vit_jax preset: (timm entrypoint, its overrides).
MODELS = {
    'AIMv2-testing': ('aimv2_large_patch14_224',
                      dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2)),
    'AIMv2-L_14': ('aimv2_large_patch14_224', {}),
    'AIMv2-H_14': ('aimv2_huge_patch14_224', {}),
    'AIMv2-1B_14': ('aimv2_1b_patch14_224', {}),
    'AIMv2-3B_14': ('aimv2_3b_patch14_224', {}),
}


def main():
  counts = {}
  with torch.device('meta'):
    for name, (entrypoint, kw) in MODELS.items():
      model = timm.create_model(entrypoint, num_classes=0, **kw)
      counts[name] = sum(p.numel() for p in model.parameters())
  path = os.path.join(DATA, 'aimv2_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(timm=timm.__version__, counts=counts), f, indent=1,
              sort_keys=True)
  print(f'Wrote {len(counts)} counts to {path}.')


if __name__ == '__main__':
  main()
