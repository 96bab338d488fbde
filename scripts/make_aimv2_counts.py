r"""Writes timm's and transformers' parameter counts of models of AIMv2's
sizes.

Needs torch, timm 1.0.31 and transformers 5.23 (the golden venv); the tests
need neither. The models are built on torch's meta device (no memory):

  python scripts/make_aimv2_counts.py

writes tests/data/aimv2_param_counts.json: for each vit_jax AIMv2 preset,
the count of timm's `aimv2_*_patch14_224` of its shapes (no classifier: the
test adds its 1,000-class head); 'AIMv2-testing' is timm's large entrypoint
at vit_jax's testing shapes. transformers' Aimv2VisionModel without its
head has as many (the script checks). 'NAME-towers': transformers'
Aimv2Model of the two-tower preset's shapes at 224 px (CLIP's vocabulary,
77 tokens).
"""

import json
import os

import timm
import torch
import transformers

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


# Two-tower presets: (vision (hidden, intermediate, heads, layers), text
# (the same), projection_dim), as vit_jax/models/families/aimv2.py.
TOWERS = {
    'AIMv2-testing-towers': ((32, 64, 2, 2), (32, 64, 2, 2), 24),
    'AIMv2-L_14-towers': ((1024, 2816, 8, 24), (768, 2048, 6, 12), 512),
}


def _count(model):
  return sum(p.numel() for p in model.parameters())


def _dims(row):
  return dict(zip(('hidden_size', 'intermediate_size', 'num_attention_heads',
                   'num_hidden_layers'), row))


def main():
  counts = {}
  with torch.device('meta'):
    for name, (entrypoint, kw) in MODELS.items():
      model = timm.create_model(entrypoint, num_classes=0, **kw)
      counts[name] = _count(model)
      vision = transformers.Aimv2VisionConfig(
          hidden_size=model.embed_dim, num_hidden_layers=len(model.blocks),
          num_attention_heads=model.blocks[0].attn.num_heads,
          intermediate_size=model.blocks[0].mlp.fc2.in_features,
          use_head=False)
      assert _count(transformers.Aimv2VisionModel(vision)) == counts[name]
    for name, (vision, text, projection) in TOWERS.items():
      config = transformers.Aimv2Config(
          vision_config=dict(_dims(vision), use_head=True),
          text_config=_dims(text), projection_dim=projection)
      counts[name] = _count(transformers.Aimv2Model(config))
  path = os.path.join(DATA, 'aimv2_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(timm=timm.__version__,
                   transformers=transformers.__version__, counts=counts), f,
              indent=1, sort_keys=True)
  print(f'Wrote {len(counts)} counts to {path}.')


if __name__ == '__main__':
  main()
