r"""Writes the golden files of SAM's image encoder.

Needs torch, timm 1.0.31 and transformers 5.23 (the golden venv); the
tests need none of them:

  /work/venv_golden/bin/python scripts/make_sam_golden.py

writes into tests/data/sam:
- timm_samvit/: timm's samvit_base_patch16 shrunk to the 'SAM-testing'
  preset's shapes (128 px, width 16, 2 heads, 4 blocks, windows of 4,
  global blocks 1 and 3, neck of 8), every parameter moved off its init
  by N(0, 0.3), saved by timm's own `save_for_hf`.
- transformers_vision/: transformers' SamVisionModel of the same shapes but
  MLPs 48 wide (`mlp_dim`), moved off its init likewise, `save_pretrained`.
- transformers_sam/: a SamModel whose vision encoder holds the same weights
  as transformers_vision's, with a small prompt encoder and mask decoder.
- golden.npz: one 128 px image in [-1, 1] (NHWC; the 96 px and 96 x 128
  ones are its top-left crops); timm's neck output (forward_features) at
  128, 96 and 96 x 128 px (timm resamples its tables); timm's
  forward_intermediates at 128 px for indices [0, 2], without and with
  norm (the neck); transformers' last_hidden_state at 128 px; all NHWC.
"""

import os

import numpy as np
import timm
import torch
import transformers

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'sam')
TESTING = dict(img_size=128, embed_dim=16, depth=4, num_heads=2,
               window_size=4, global_attn_indexes=(1, 3), neck_chans=8)
VISION = dict(hidden_size=16, output_channels=8, num_hidden_layers=4,
              num_attention_heads=2, image_size=128, patch_size=16,
              window_size=4, global_attn_indexes=[1, 3], mlp_dim=48)


def _shift(model, scale=0.3):
  """Every parameter moved off its init by N(0, scale)."""
  with torch.no_grad():
    for param in model.parameters():
      param.add_(torch.randn_like(param) * scale)


def _nchw(images):
  return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2)


def _nhwc(x):
  return x.permute(0, 2, 3, 1).numpy()


def timm_outputs(images):
  model = timm.create_model('samvit_base_patch16', **TESTING).eval()
  _shift(model)
  golden = {}
  with torch.no_grad():
    for name, (h, w) in {'128': (128, 128), '96': (96, 96),
                         '96x128': (96, 128)}.items():
      golden[f'timm/{name}'] = _nhwc(model.forward_features(
          _nchw(images[:, :h, :w])))
    for norm in (False, True):
      maps = model.forward_intermediates(_nchw(images), indices=[0, 2],
                                         norm=norm, intermediates_only=True)
      for i, x in zip((0, 2), maps):
        golden[f'timm/block_{i}{"_norm" if norm else ""}'] = _nhwc(x)
  timm.models.save_for_hf(model, os.path.join(OUT, 'timm_samvit'),
                          safe_serialization=True)
  return golden


def transformers_outputs(images):
  config = transformers.SamVisionConfig(**VISION)
  model = transformers.SamVisionModel(config).eval()
  _shift(model)
  with torch.no_grad():
    out = model(pixel_values=_nchw(images)).last_hidden_state
  model.save_pretrained(os.path.join(OUT, 'transformers_vision'))
  sam = transformers.SamModel(transformers.SamConfig(
      vision_config=VISION,
      prompt_encoder_config=dict(hidden_size=8, image_size=128,
                                 patch_size=16, mask_input_channels=4),
      mask_decoder_config=dict(hidden_size=8, mlp_dim=16,
                               num_attention_heads=2, iou_head_hidden_dim=8)))
  sam.vision_encoder.load_state_dict(model.vision_encoder.state_dict())
  sam.eval()
  with torch.no_grad():
    embedding = sam.get_image_embeddings(_nchw(images))
  np.testing.assert_allclose(embedding.numpy(), out.numpy(), atol=1e-6)
  sam.save_pretrained(os.path.join(OUT, 'transformers_sam'))
  return {'transformers/128': _nhwc(out)}


def main():
  torch.manual_seed(0)
  os.makedirs(OUT, exist_ok=True)
  images = np.random.default_rng(0).uniform(
      -1, 1, (1, 128, 128, 3)).astype(np.float32)
  golden = {'images': images, **timm_outputs(images),
            **transformers_outputs(images)}
  np.savez(os.path.join(OUT, 'golden.npz'), **golden)
  print('wrote', OUT, {k: v.shape for k, v in golden.items()})


if __name__ == '__main__':
  main()
