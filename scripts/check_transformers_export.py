r"""Checks `--layout=transformers` with transformers itself.

Each golden folder of transformers (tests/data/transformers) is converted
to an .npz and back to a transformers folder by vit_jax, run with
VIT_JAX_PYTHON (default /work/venv/bin/python: torch and jax need not share
a venv); then transformers loads the folder with `from_pretrained` and
must report no missing, unexpected or mismatched keys, its outputs on the
golden images must be the golden outputs (transformers_golden.npz), and
its image processor must give the golden processor's pixels. Prints the
largest absolute difference of each; exits 1 if any check fails.

  /work/golden-venv/bin/python scripts/check_transformers_export.py

Needs torch and transformers 5.23 (as scripts/make_transformers_golden.py).
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image
import torch
import transformers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, 'tests', 'data')
PYTHON = os.environ.get('VIT_JAX_PYTHON', '/work/venv/bin/python')
GOLDEN = np.load(os.path.join(DATA, 'transformers_golden.npz'))
TOLERANCE = 1e-5
# case: (golden folder, image side, {output: golden key}, processor).
# Two-tower models give their image tower; their embeddings are normalized.
CASES = {
    'vit': ('vit', 32, {'logits': 'vit/logits'}, 'vit'),
    'vit_model': ('vit_model', 32, {
        'last_hidden_state': 'vit_model/last_hidden_state',
        'pooler_output': 'vit_model/pooler_output'}, 'vit'),
    'deit': ('deit', 32, {'logits': 'deit/logits'}, 'deit'),
    'dinov2': ('dinov2', 70, {
        'last_hidden_state': 'dinov2/last_hidden_state',
        'pooler_output': 'dinov2/pooler_output'}, 'dinov2'),
    'dinov2@98': ('dinov2', 98, {
        'last_hidden_state': 'dinov2/last_hidden_state@98'}, None),
    'dinov2_registers': ('dinov2_registers', 70, {
        'last_hidden_state': 'dinov2_registers/last_hidden_state',
        'pooler_output': 'dinov2_registers/pooler_output'}, 'dinov2'),
    'dinov2_registers@42': ('dinov2_registers', 42, {
        'last_hidden_state': 'dinov2_registers/last_hidden_state@42'}, None),
    'clip_vision': ('clip_vision', 32, {
        'last_hidden_state': 'clip_vision/last_hidden_state',
        'pooler_output': 'clip_vision/pooler_output'}, 'clip'),
    'clip_vision_projection': ('clip_vision_projection', 32, {
        'image_embeds': 'clip_vision_projection/image_embeds',
        'last_hidden_state': 'clip_vision_projection/last_hidden_state'},
                               'clip'),
    'siglip_vision': ('siglip_vision', 32, {
        'last_hidden_state': 'siglip_vision/last_hidden_state',
        'pooler_output': 'siglip_vision/pooler_output'}, 'siglip'),
    'swin': ('swin', 32, {'logits': 'swin/logits'}, 'swin'),
    'mae': ('mae', 32, {'last_hidden_state': 'mae/last_hidden_state'},
            'mae'),
    'mae_pretraining': ('mae_pretraining', 32, {
        'last_hidden_state': 'mae_pretraining/last_hidden_state'}, 'mae'),
    'clip': ('clip', 32, {'image_embeds': 'clip/image_embeds'}, 'clip'),
    'siglip': ('siglip', 32, {'pooler_output': 'siglip/image_embeds'},
               'siglip'),
}
TWO_TOWERS = ('clip', 'siglip')


def vit_jax(*args):
  """Runs `python -m vit_jax.convert ARGS` with vit_jax's Python."""
  env = dict(os.environ, PYTHONPATH=ROOT)
  done = subprocess.run([PYTHON, '-m', 'vit_jax.convert', *args], env=env,
                        capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f'vit_jax.convert {" ".join(args)}:\n{done.stderr}')


def export(folder, work):
  """The golden folder, converted to an .npz and back; the .npz's path."""
  npz = os.path.join(work, f'{folder}.npz')
  out = os.path.join(work, folder)
  if not os.path.exists(out):
    # A two-tower folder's image tower alone, by its image preset.
    image = {'clip': ['--model_name=CLIP-testing-quickgelu'],
             'siglip': ['--model_name=SigLIP-testing']}.get(folder, [])
    vit_jax(os.path.join(DATA, 'transformers', folder), npz, *image)
    vit_jax(npz, out, '--layout=transformers')
  return npz, out


def load(out, **kw):
  """transformers' model of the folder, and what loading reported."""
  with open(os.path.join(out, 'config.json')) as f:
    arch = json.load(f)['architectures'][0]
  model, info = getattr(transformers, arch).from_pretrained(
      out, output_loading_info=True, **kw)
  problems = {k: v for k, v in info.items() if v and k != 'error_msgs'}
  problems.update({'error_msgs': info['error_msgs']} if info.get(
      'error_msgs') else {})
  return model.eval(), arch, problems


def run(model, case, images):
  """The model's outputs of NHWC `images`, as the golden script ran them."""
  x = torch.from_numpy(images).permute(0, 3, 1, 2)
  with torch.no_grad():
    if case.startswith('mae'):  # every patch, in order
      noise = torch.arange(x.shape[2] * x.shape[3] // 256)[None].float()
      return model(x, noise=noise.repeat(len(x), 1))
    return model(pixel_values=x)


def compare(outputs, wanted, normalize):
  """The largest absolute difference of each output from the golden."""
  diffs = {}
  for name, key in wanted.items():
    have = outputs[name].numpy()
    if normalize:
      have = have / np.linalg.norm(have, axis=-1, keepdims=True)
    diffs[name] = float(np.abs(have - GOLDEN[key]).max())
  return diffs


def processor_diff(out, processor):
  """How far the written processor's pixels of the test image are from the
  golden processor's (every 8th row and column)."""
  with open(os.path.join(out, 'preprocessor_config.json')) as f:
    name = json.load(f)['image_processor_type']
  cls = getattr(transformers, name.replace('Processor', 'ProcessorPil'),
                None) or getattr(transformers, name)
  image = Image.open(os.path.join(DATA, 'predict_image.jpg')).convert('RGB')
  pixels = cls.from_pretrained(out)(images=image, return_tensors='np')[
      'pixel_values']
  pixels = np.asarray(pixels).transpose(0, 2, 3, 1)[:, ::8, ::8]
  want = GOLDEN[f'{processor}/pixels']
  if pixels.shape != want.shape:
    return float('inf')
  return float(np.abs(pixels - want).max())


def check(case, work):
  """Prints one case's figures; whether it passed."""
  folder, side, wanted, processor = CASES[case]
  _, out = export(folder, work)
  model, arch, problems = load(out)
  diffs = compare(run(model, case, GOLDEN[f'images/{side}']), wanted,
                  folder in TWO_TOWERS)
  if processor:
    diffs['processor'] = processor_diff(out, processor)
  print(f'{case:24s} {arch:38s} keys: {problems or "ok"}; max abs diff: '
        + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  return not problems and all(v <= TOLERANCE for v in diffs.values())


def check_headless_vit(work):
  """The ViT without its head: a ViTModel without a pooler, whose hidden
  states are the classifier's."""
  npz, _ = export('vit', work)
  headless = os.path.join(work, 'vit_headless.npz')
  with np.load(npz) as z:
    np.savez(headless, **{k: z[k] for k in z.files if not k.startswith(
        'head/')})
  shutil.copy(npz[:-4] + '.transform.json',
              headless[:-4] + '.transform.json')  # its GELU and epsilon
  out = os.path.join(work, 'vit_headless')
  vit_jax(headless, out, '--layout=transformers')
  model, arch, problems = load(out, add_pooling_layer=False)
  original = transformers.ViTForImageClassification.from_pretrained(
      os.path.join(DATA, 'transformers', 'vit')).eval()
  x = torch.from_numpy(GOLDEN['images/32']).permute(0, 3, 1, 2)
  with torch.no_grad():
    want = original.vit(pixel_values=x).last_hidden_state
    have = model(pixel_values=x).last_hidden_state
  diff = float((have - want).abs().max())
  print(f'{"vit (no head, no pooler)":24s} {arch:38s} keys: '
        f'{problems or "ok"}; max abs diff: last_hidden_state {diff:.2e}')
  return not problems and diff <= TOLERANCE


def check_siglip2(work):
  """SigLIP 2's NaFlex tower: the Siglip2VisionModel folder written back,
  on the processor's padded patches (siglip2_golden.npz), and its
  processor's patches of the golden images."""
  golden = np.load(os.path.join(DATA, 'siglip2_golden.npz'))
  _, out = export('siglip2_vision', work)
  model, arch, problems = load(out)
  inputs = {k: torch.from_numpy(golden[k]) for k in (
      'pixel_values', 'pixel_attention_mask', 'spatial_shapes')}
  with torch.no_grad():
    outputs = model(**inputs)
  diffs = {k: float(np.abs(getattr(outputs, k).numpy() -
                           golden[f'vision/{k}']).max())
           for k in ('pooler_output', 'last_hidden_state')}
  processor = transformers.AutoImageProcessor.from_pretrained(out)
  images = [Image.fromarray(golden['images'][0]),
            Image.fromarray(golden['images'][1, :48, :48])]
  pixels = processor(images=images, return_tensors='np')['pixel_values']
  diffs['processor'] = float(np.abs(pixels - golden['pixel_values']).max())
  print(f'{"siglip2_vision":24s} {arch:38s} keys: {problems or "ok"}; max '
        'abs diff: ' + ', '.join(f'{k} {v:.2e}' for k, v in diffs.items()))
  return not problems and all(v <= TOLERANCE for v in diffs.values())


def main():
  transformers.utils.logging.disable_progress_bar()
  with tempfile.TemporaryDirectory() as work:
    passed = [check(case, work) for case in CASES]
    passed.append(check_headless_vit(work))
    passed.append(check_siglip2(work))
  print('all passed' if all(passed) else 'FAILED')
  sys.exit(0 if all(passed) else 1)


if __name__ == '__main__':
  main()
