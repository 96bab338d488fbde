r"""Writes the golden files of transformers' video models: ViViT, VideoMAE.

Needs torch and transformers 5.23 (the golden venv); the tests need
neither.

  /work/venv_golden/bin/python scripts/make_video_golden.py

writes into tests/data/transformers_video, each folder by `save_pretrained`
(the model and its image processor's preprocessor_config.json):
- vivit/: a `VivitForVideoClassification` (hidden 32, 2 blocks of 2 heads,
  tubelets 2x8x8, 4 frames of 32 px, 5 classes; tanh GELU `gelu_fast`),
  with `VivitImageProcessor` (its [-1, 1] rescale, then its mean and std).
- videomae/: a `VideoMAEForVideoClassification` of the same shapes
  (VideoMAE-testing's), mean pooling and `fc_norm`, query and value
  biases, with `VideoMAEImageProcessor` and ImageNet's mean and std, as
  the hub's MCG-NJU folders.
- videomae_pretraining/: a `VideoMAEForPreTraining` (use_mean_pooling
  False: the final norm; a decoder of 1 block of width 16).
- golden.npz: clip, (2, 4, 32, 32, 3) in the models' input units (NTHWC;
  the models take NTCHW); NAME/out: vivit's and videomae's logits,
  videomae_pretraining's encoder's last_hidden_state; frames, (2, 8, 8,
  3) uint8, and NAME/pixels, each processor's (rescaled and normalized,
  no resize or crop) of them, NTHWC.

Every parameter is moved off its init by N(0, 0.3) first, then rounded to
float16, in which the weights are saved (half the bytes); the outputs are
float32's of those values.

  /work/venv_golden/bin/python scripts/make_video_golden.py --check FOLDER NAME

loads a folder that `convert --layout=transformers` wrote from NAME's
conversion with transformers and prints the largest differences of its
outputs (a VideoMAEModel's: last_hidden_state) and of its processor's
pixels from the golden ones; exits 1 above 1e-4.
"""

import os
import shutil
import sys

import numpy as np
import torch
import transformers

# The SSL golden files' parameter shift (this folder).
from make_ssl_golden import _shift

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'transformers_video')
SHAPES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
              intermediate_size=64, image_size=32, num_frames=4)
IMAGENET = dict(image_mean=[0.485, 0.456, 0.406],
                image_std=[0.229, 0.224, 0.225])


def _models():
  """name -> (model, image processor)."""
  vivit = transformers.VivitConfig(tubelet_size=[2, 8, 8], num_labels=5,
                                   **SHAPES)
  videomae = dict(SHAPES, patch_size=8, tubelet_size=2, qv_bias=True)
  return {
      'vivit': (transformers.VivitForVideoClassification(vivit),
                transformers.VivitImageProcessor(
                    size={'shortest_edge': 36},
                    crop_size={'height': 32, 'width': 32})),
      'videomae': (
          transformers.VideoMAEForVideoClassification(
              transformers.VideoMAEConfig(num_labels=5, use_mean_pooling=True,
                                          **videomae)),
          transformers.VideoMAEImageProcessor(
              size={'shortest_edge': 32},
              crop_size={'height': 32, 'width': 32}, **IMAGENET)),
      'videomae_pretraining': (
          transformers.VideoMAEForPreTraining(transformers.VideoMAEConfig(
              use_mean_pooling=False, decoder_hidden_size=16,
              decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
              decoder_intermediate_size=32, **videomae)),
          transformers.VideoMAEImageProcessor(
              size={'shortest_edge': 32},
              crop_size={'height': 32, 'width': 32}, **IMAGENET)),
  }


def _outputs(name, model, clip):
  pixels = torch.from_numpy(clip).permute(0, 1, 4, 2, 3)  # NTCHW
  with torch.no_grad():
    if name == 'videomae_pretraining':
      return model.videomae(pixels).last_hidden_state.numpy()
    return model(pixels).logits.numpy()


def main():
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  clip = rng.normal(size=(2, 4, 32, 32, 3)).astype(np.float32)
  frames = rng.integers(0, 256, (2, 8, 8, 3), dtype=np.uint8)
  golden = {'clip': clip, 'frames': frames}
  shutil.rmtree(OUT, ignore_errors=True)
  for name, (model, processor) in _models().items():
    model.eval()
    _shift(model, 0.3)
    with torch.no_grad():
      for param in model.parameters():
        param.copy_(param.half().float())
    golden[f'{name}/out'] = _outputs(name, model, clip)
    model.half().save_pretrained(os.path.join(OUT, name))
    processor.save_pretrained(os.path.join(OUT, name))
    pixels = processor(list(frames), do_resize=False, do_center_crop=False,
                       return_tensors='pt').pixel_values
    golden[f'{name}/pixels'] = pixels[0].permute(0, 2, 3, 1).numpy()
  np.savez(os.path.join(OUT, 'golden.npz'), **golden)
  print(f'Wrote {OUT}: {sorted(os.listdir(OUT))}')


def check(folder, name):
  golden = np.load(os.path.join(OUT, 'golden.npz'))
  config = transformers.AutoConfig.from_pretrained(folder)
  model = getattr(transformers, config.architectures[0]).from_pretrained(
      folder).eval()
  pixels = torch.from_numpy(golden['clip']).permute(0, 1, 4, 2, 3)
  with torch.no_grad():
    out = model(pixels)
  out = (out.logits if hasattr(out, 'logits') else out.last_hidden_state)
  error = float(np.abs(out.numpy() - golden[f'{name}/out']).max())
  processor = transformers.AutoImageProcessor.from_pretrained(folder)
  made = processor(list(golden['frames']), do_resize=False,
                   do_center_crop=False, return_tensors='pt').pixel_values
  pixel_error = float(np.abs(made[0].permute(0, 2, 3, 1).numpy() -
                             golden[f'{name}/pixels']).max()) if (
                                 f'{name}/pixels' in golden) else 0.
  print(f'{folder} ({config.architectures[0]}): outputs within {error:.2e}, '
        f'pixels within {pixel_error:.2e}')
  sys.exit(int(max(error, pixel_error) > 1e-4))


if __name__ == '__main__':
  if sys.argv[1:2] == ['--check']:
    check(*sys.argv[2:4])
  else:
    main()
