r"""Writes the golden files of InternViT: timm's and transformers' models.

Needs torch, timm 1.0.31 and transformers 5.23 (the golden venv); the tests
need neither.

  /work/venv_golden/bin/python scripts/make_internvit_golden.py

writes into tests/data/internvit:
- timm/, timm_qknorm/: small random timm `vit_intern300m_patch14_448`
  models of InternViT-testing's shapes (the second with timm's per-head
  `qk_norm`), saved by timm's `save_for_hf`.
- hf_300m/, hf_300m_norm/, hf_6b/: small random transformers
  `InternVLVisionModel`s saved by `save_pretrained`: InternViT-300M's
  settings (LayerNorm, query/key/value biases), the same with
  `use_mean_pooling=False` (a final LayerNorm), and InternViT-6B's
  (RMSNorm, `use_qk_norm`, `attention_bias=False`) at 6B-testing's shapes;
  each with the hub's processor (`GotOcr2ImageProcessor`, ImageNet's mean
  and std).
- golden.npz: images (56 and 42 px, in ImageNet-normalized units), and
  NAME/out (timm: the pooled class token; transformers: every token),
  NAME/out@42 (each model resizing its table as it does: a 3 x 3 grid
  from 4 x 4, where antialiasing tells timm's from transformers'),
  NAME/blocks (timm: `forward_intermediates` of both blocks, NCHW;
  transformers: `hidden_states` after each block), and NAME/pixels, the
  processor's of tests/data/predict_image.jpg (every 8th row and column).

Every parameter is moved off its init by N(0, 0.3) first.

  /work/venv_golden/bin/python scripts/make_internvit_golden.py --check FOLDER

loads a folder that `convert --layout=transformers` wrote from hf_NAME
(FOLDER's name) with transformers and prints the largest difference of its
outputs from the golden ones; exits 1 above 1e-4.
"""

import os
import shutil
import sys

import numpy as np
from PIL import Image
import timm
import torch
import transformers

# The SSL golden files' parameter shift (this folder).
from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'internvit')
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406],
                image_std=[0.229, 0.224, 0.225])
SIDE, OTHER = 56, 42
# timm: name -> create_model's arguments (InternViT-testing's shapes).
TIMM = {'timm': {}, 'timm_qknorm': dict(qk_norm=True)}
TIMM_SHAPES = dict(embed_dim=16, depth=2, num_heads=2, mlp_ratio=4.)
# transformers: name -> InternVLVisionConfig's arguments.
_300M = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
             intermediate_size=64, attention_bias=True)
HF = {
    'hf_300m': _300M,
    'hf_300m_norm': dict(_300M, use_mean_pooling=False),
    'hf_6b': dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3,
                  intermediate_size=48, attention_bias=False,
                  use_qk_norm=True, norm_type='rms_norm'),
}



def _nchw(images):
  return torch.from_numpy(images).permute(0, 3, 1, 2)


def _timm(name, images, golden):
  model = timm.create_model('vit_intern300m_patch14_448', img_size=SIDE,
                            num_classes=0,
                            **dict(TIMM_SHAPES, **TIMM[name])).eval()
  _shift(model, 0.3)
  with torch.no_grad():
    for side, suffix in ((SIDE, ''), (OTHER, f'@{OTHER}')):
      x = _nchw(images[side])
      golden[f'{name}/out{suffix}'] = model.forward_head(
          model.forward_features(x), pre_logits=True).numpy()
    blocks = model.forward_intermediates(_nchw(images[SIDE]), indices=2,
                                         intermediates_only=True)
    golden[f'{name}/blocks'] = np.stack([b.numpy() for b in blocks])
  timm.models.save_for_hf(model, os.path.join(OUT, name),
                          safe_serialization=True)


def _processor(folder, golden, name):
  processor = transformers.GotOcr2ImageProcessor(
      size={'height': SIDE, 'width': SIDE}, **IMAGENET)
  processor.save_pretrained(folder)
  image = Image.open(os.path.join(os.path.dirname(OUT),
                                  'predict_image.jpg')).convert('RGB')
  pixels = processor(images=image, return_tensors='np')['pixel_values']
  golden[f'{name}/pixels'] = np.asarray(pixels).transpose(0, 2, 3, 1)[
      :, ::8, ::8]


def _hf_outputs(model, images):
  """(every token at 56 px, at 70 px, each block's tokens at 56 px)."""
  with torch.no_grad():
    out = model(pixel_values=_nchw(images[SIDE]), output_hidden_states=True)
    other = model(pixel_values=_nchw(images[OTHER])).last_hidden_state
  blocks = np.stack([h.numpy() for h in out.hidden_states[1:]])
  return out.last_hidden_state.numpy(), other.numpy(), blocks


def _hf(name, images, golden):
  config = transformers.InternVLVisionConfig(
      image_size=SIDE, patch_size=14, **HF[name])
  model = transformers.InternVLVisionModel(config).eval()
  _shift(model, 0.3)
  folder = os.path.join(OUT, name)
  model.save_pretrained(folder)
  out, other, blocks = _hf_outputs(model, images)
  golden.update({f'{name}/out': out, f'{name}/out@{OTHER}': other,
                 f'{name}/blocks': blocks})
  _processor(folder, golden, name)


def _images():
  rng = np.random.default_rng(0)
  return {side: rng.normal(size=(2, side, side, 3)).astype(np.float32)
          for side in (SIDE, OTHER)}


def main():
  torch.manual_seed(0)
  shutil.rmtree(OUT, ignore_errors=True)
  os.makedirs(OUT)
  images = _images()
  golden = {f'images/{side}': x for side, x in images.items()}
  for name in TIMM:
    _timm(name, images, golden)
  for name in HF:
    _hf(name, images, golden)
  np.savez(os.path.join(OUT, 'golden.npz'), **golden)
  print('wrote', OUT, sorted(golden))


def check(folder):
  """transformers' outputs of an exported folder against the golden."""
  name = os.path.basename(os.path.normpath(folder))
  golden = np.load(os.path.join(OUT, 'golden.npz'))
  images = {side: golden[f'images/{side}'] for side in (SIDE, OTHER)}
  model, info = transformers.InternVLVisionModel.from_pretrained(
      folder, output_loading_info=True)
  bad = {k: v for k, v in info.items() if v}
  outputs = dict(zip(('out', f'out@{OTHER}', 'blocks'),
                     _hf_outputs(model.eval(), images)))
  worst = max(float(np.abs(v - golden[f'{name}/{k}']).max())
              for k, v in outputs.items())
  print(f'{folder}: loading info {bad or "clean"}; largest difference '
        f'{worst:.2e}')
  return 0 if worst < 1e-4 and not bad else 1


if __name__ == '__main__':
  if len(sys.argv) == 3 and sys.argv[1] == '--check':
    sys.exit(check(sys.argv[2]))
  main()
