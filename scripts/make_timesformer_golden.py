r"""Writes the golden folder of transformers' TimesformerForVideoClassification.

Needs torch and transformers 5.23 (in a venv of their own); the tests need
neither.

  /work/venv_golden/bin/python scripts/make_timesformer_golden.py

writes into tests/data:
- transformers_video/timesformer: a small random model (hidden 32, 2
  blocks, 2 heads, patch 8, 4 frames of 32 px, divided space-time
  attention, 5 classes), every parameter moved off its init by N(0, 0.3)
  (so the zero temporal_dense and time table are not zero), saved by
  `save_pretrained`, with the video processor's config that transformers'
  TimesformerVideoProcessor writes (its defaults: ImageNet's mean and std,
  short side 224, center crop 224, bilinear).
- transformers_video/timesformer_golden.npz: `clip` (2, 4, 32, 32, 3), the
  frames as the model takes them after the processor (NTHWC), `logits`,
  and `last_hidden_state` (the class token's, after the final norm).
- timesformer_param_counts.json: the parameter count of transformers'
  TimesformerForVideoClassification (400 classes) of each preset's config
  (no weights), which tests/models/test_timesformer.py checks.
"""

import json
import os

import numpy as np
import torch
import transformers

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
OUT = os.path.join(DATA, 'transformers_video', 'timesformer')
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, patch_size=8, image_size=32, num_frames=4,
             num_labels=5)
# The published configs (facebook/timesformer-base-finetuned-k400, -hr-,
# -large-): TimesformerConfig's defaults (ViT-B/16, 8 frames of 224 px)
# but for these.
PRESETS = {'TimeSformer-testing': {k: v for k, v in SMALL.items()
                                  if k != 'num_labels'},
           'TimeSformer-B_16x8': {},
           'TimeSformer-HR': dict(num_frames=16, image_size=448),
           'TimeSformer-L': dict(num_frames=96)}


def _shift(model, scale=0.3):
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def golden():
  torch.manual_seed(0)
  model = transformers.TimesformerForVideoClassification(
      transformers.TimesformerConfig(**SMALL)).eval()
  _shift(model)
  os.makedirs(OUT, exist_ok=True)
  model.save_pretrained(OUT)
  transformers.TimesformerVideoProcessor().save_pretrained(OUT)
  clip = np.random.default_rng(0).normal(size=(2, 4, 32, 32, 3)).astype(
      np.float32)
  with torch.no_grad():
    out = model(pixel_values=torch.from_numpy(clip).permute(0, 1, 4, 2, 3),
                output_hidden_states=True)
    features = model.timesformer(
        torch.from_numpy(clip).permute(0, 1, 4, 2, 3)).last_hidden_state
  np.savez(os.path.join(DATA, 'transformers_video', 'timesformer_golden.npz'),
           clip=clip, logits=out.logits.numpy(),
           last_hidden_state=features[:, 0].numpy())


def counts():
  out = {}
  for name, changes in PRESETS.items():
    config = transformers.TimesformerConfig(num_labels=400, **changes)
    with torch.device('meta'):
      model = transformers.TimesformerForVideoClassification(config)
    out[name] = sum(p.numel() for p in model.parameters())
  with open(os.path.join(DATA, 'timesformer_param_counts.json'), 'w') as f:
    json.dump({'counts': out, 'num_labels': 400}, f, indent=1)
    f.write('\n')
  print(out)


if __name__ == '__main__':
  golden()
  counts()
