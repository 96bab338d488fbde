r"""Writes transformers' parameter counts of models of SigLIP 2's sizes.

Needs torch and transformers 5.23 (the golden venv); the tests need
neither. The models are built on torch's meta device (no memory):

  python scripts/make_siglip2_counts.py

writes tests/data/siglip2_param_counts.json: for each vit_jax SigLIP 2
preset, the count of transformers' model of its shapes at 224 px:
SiglipVisionModel (fixed size), Siglip2VisionModel (NaFlex, 256 patches'
table), SiglipModel and Siglip2Model (two towers, vocabulary 256,000, 64
tokens; g-opt's text tower So400m's, projected to 1536). The image towers
have no classifier: the test adds its 1,000-class head.
"""

import json
import os

import torch
import transformers

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')

# The presets' shapes: (hidden_size, intermediate_size, num_attention_heads,
# num_hidden_layers, patch_size), as vit_jax/models/families/siglip2.py.
SIZES = {
    'SigLIP2-testing': (32, 64, 2, 2, 16),
    'SigLIP2-B_32': (768, 3072, 12, 12, 32),
    'SigLIP2-B_16': (768, 3072, 12, 12, 16),
    'SigLIP2-L_16': (1024, 4096, 16, 24, 16),
    'SigLIP2-So400m_14': (1152, 4304, 16, 27, 14),
    'SigLIP2-So400m_16': (1152, 4304, 16, 27, 16),
    'SigLIP2-g_16': (1536, 6144, 16, 40, 16),
}
NAFLEX = ('SigLIP2-testing', 'SigLIP2-B_16', 'SigLIP2-So400m_16')
TEXT = {'SigLIP2-g_16': 'SigLIP2-So400m_16'}


def _dims(name):
  hidden, mlp, heads, layers, patch = SIZES[name]
  return dict(hidden_size=hidden, intermediate_size=mlp,
              num_attention_heads=heads, num_hidden_layers=layers), patch


def _vision(name, naflex):
  dims, patch = _dims(name)
  if naflex:
    return transformers.Siglip2VisionConfig(**dims, patch_size=patch,
                                            num_patches=256)
  return transformers.SiglipVisionConfig(**dims, patch_size=patch,
                                         image_size=224)


def _text(name, naflex):
  dims, _ = _dims(TEXT.get(name, name))
  cls = (transformers.Siglip2TextConfig if naflex else
         transformers.SiglipTextConfig)
  return cls(**dims, vocab_size=256_000, max_position_embeddings=64,
             projection_size=SIZES[name][0])


def _count(model):
  return sum(p.numel() for p in model.parameters())


def main():
  counts = {}
  with torch.device('meta'):
    for name in SIZES:
      for naflex in (False, True) if name in NAFLEX else (False,):
        preset = f'{name}-naflex' if naflex else name
        vision = _vision(name, naflex)
        model = (transformers.Siglip2VisionModel if naflex else
                 transformers.SiglipVisionModel)(vision)
        counts[preset] = _count(model)
        config = (transformers.Siglip2Config if naflex else
                  transformers.SiglipConfig)(
                      text_config=_text(name, naflex).to_dict(),
                      vision_config=vision.to_dict())
        model = (transformers.Siglip2Model if naflex else
                 transformers.SiglipModel)(config)
        counts[f'{preset}-towers'] = _count(model)
  path = os.path.join(DATA, 'siglip2_param_counts.json')
  with open(path, 'w') as f:
    json.dump(dict(transformers=transformers.__version__, counts=counts), f,
              indent=1, sort_keys=True)
  print(f'Wrote {len(counts)} counts to {path}.')


if __name__ == '__main__':
  main()
