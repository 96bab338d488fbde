r"""Writes transformers' parameter counts of VideoMAE's sizes.

Needs torch and transformers 5.23 (the golden venv); the tests need
neither. The models are built on torch's meta device (no memory):

  /work/venv_golden/bin/python scripts/make_videomae_counts.py

writes tests/data/videomae_param_counts.json: for each vit_jax VideoMAE
preset, the count of transformers' VideoMAEForVideoClassification of its
shapes (VideoMAE's published configs: 16 frames of 224 px, tubelets of
2x16x16, query and value biases, mean pooling) with 400 classes
(Kinetics-400). Its sinusoid table is a buffer, not a parameter.
"""

import json
import os

import torch
import transformers

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
CLASSES = 400

# The presets' shapes: (hidden_size, intermediate_size, num_attention_heads,
# num_hidden_layers, patch_size), as vit_jax/models/families/videomae.py.
SIZES = {
    'VideoMAE-testing': (32, 64, 2, 2, 8),
    'VideoMAE-S_16x2': (384, 1536, 6, 12, 16),
    'VideoMAE-B_16x2': (768, 3072, 12, 12, 16),
    'VideoMAE-L_16x2': (1024, 4096, 16, 24, 16),
    'VideoMAE-H_16x2': (1280, 5120, 16, 32, 16),
}


def _count(hidden, mlp, heads, layers, patch):
  config = transformers.VideoMAEConfig(
      hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads,
      num_hidden_layers=layers, patch_size=patch, image_size=224,
      num_frames=16, tubelet_size=2, qv_bias=True, use_mean_pooling=True,
      num_labels=CLASSES)
  model = transformers.VideoMAEForVideoClassification(config)
  return sum(p.numel() for p in model.parameters())


def main():
  with torch.device('meta'):
    counts = {name: _count(*row) for name, row in SIZES.items()}
  path = os.path.join(DATA, 'videomae_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(transformers=transformers.__version__, classes=CLASSES,
                   counts=counts), f, indent=1, sort_keys=True)
  print(f'Wrote {path}: {counts}')


if __name__ == '__main__':
  main()
