r"""SigLIP against SigLIP 2's recipe, and NaFlex against fixed resolution,
on Fashion-MNIST scenes over seeds; prints the tables of docs/siglip2.md.

  python scripts/siglip2_scenes.py --out=/tmp/siglip2_scenes --seeds=3

Each seed trains configs/siglip2_scenes.py's three arms for `--steps`
steps, then evaluates each exported image tower three ways:
- zero-shot: the run's own `zeroshot_accuracy` (Fashion-MNIST's test
  items named by their classes);
- 10-shot: least squares on the MAP-pooled features (the few-shot
  evaluator's `fewshot.accuracies`) of 10 training items a class, on
  `--test` test items;
- a dense probe: configs/segmentation_fmnist.py's linear head on the frozen
  tower for `--probe_steps` steps, its mean IoU on the test scenes.
The NaFlex table puts each test item on a wide (28 x 56) and a tall
(56 x 28) canvas: the fixed-resolution towers see the canvas squashed to
their 56 x 56, the NaFlex tower sees it at its own aspect within 64
patches (`packing.naflex_grid`); zero-shot accuracy of each. A finished
run is not repeated. Means and standard errors over the seeds.
"""

import argparse
import gzip
import os
import sys
import time

import numpy as np

import runs

sys.path.insert(0, runs.ROOT)
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from vit_jax import models
from vit_jax.checkpoints import record
from vit_jax.configs import siglip2_scenes
from vit_jax.data import packing
from vit_jax.data import tokenizers
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import zeroshot
from vit_jax.models import backbone
# pylint: enable=g-import-not-at-top,wrong-import-position

FMNIST = '/usr/share/datasets/fashion-mnist'
LABELS = {'siglip': 'SigLIP (sigmoid loss)',
          'siglip2': 'SigLIP 2 (+ LocCa, SILC, TIPS)',
          'siglip2_naflex': 'SigLIP 2 NaFlex (+ LocCa)'}
SIDE, PATCH, BUDGET = 56, 7, 64


def read_fmnist(split):
  """(uint8 images (n, 28, 28), labels) of Debian's Fashion-MNIST files."""
  prefix = 'train' if split == 'train' else 't10k'
  with gzip.open(f'{FMNIST}/{prefix}-images-idx3-ubyte.gz') as f:
    images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
  with gzip.open(f'{FMNIST}/{prefix}-labels-idx1-ubyte.gz') as f:
    labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
  return images, labels


def pixels(images, height, width):
  """Gray uint8 images resized (PIL bilinear) to RGB [-1, 1] inputs."""
  rgb = np.repeat(images[..., None], 3, axis=-1)
  return np.stack([packing.normalize(packing.resize(x, height, width))
                   for x in rgb])


def canvas(images, wide):
  """Each 28 px item centred on a black 28 x 56 (wide) or 56 x 28 canvas."""
  n = len(images)
  if wide:
    out = np.zeros((n, 28, 56), np.uint8)
    out[:, :, 14:42] = images
  else:
    out = np.zeros((n, 56, 28), np.uint8)
    out[:, 14:42] = images
  return out


class Towers:
  """An export's two towers, its tokenizer and its pooled image features."""

  def __init__(self, workdir):
    self.pretrained = models.from_pretrained(workdir)
    self.model, self.params = self.pretrained.model, self.pretrained.params
    path, rec = record.resolve(workdir)
    self.tokenizer = tokenizers.get_tokenizer(
        'sentencepiece', os.path.join(os.path.dirname(path), rec['vocab']),
        self.model.pp['max_len'])
    tower, params = backbone.image_encoder(self.model, self.params)
    self.tower = tower.clone(num_classes=None)
    self.tower_params = {k: v for k, v in params.items() if k != 'head'}

  def zeroshot(self, images, labels):
    classes = zeroshot.class_embeddings(
        self.model, self.params, self.tokenizer,
        siglip2_scenes.CLASS_NAMES, ('a {}',))
    classify = jax.jit(lambda p, x: zeroshot.classify(self.model, p, x,
                                                      classes)[0])
    predicted = np.concatenate([classify(self.params, images[i:i + 500])
                                for i in range(0, len(images), 500)])
    return float(np.mean(predicted == labels))

  def features(self, images):
    apply = jax.jit(lambda p, x: self.tower.apply({'params': p}, x,
                                                  train=False))
    return np.concatenate([apply(self.tower_params, images[i:i + 500])
                           for i in range(0, len(images), 500)])


def ten_shot(towers, train, test, seed):
  """10-shot accuracy of least squares on the pooled features."""
  idx = fewshot.pick_shots(train[1], 10, 10, seed)
  train_x = towers.features(pixels(train[0][idx], SIDE, SIDE))
  test_x = towers.features(pixels(test[0], SIDE, SIDE))
  out = fewshot.accuracies((train_x, train[1][idx]), (test_x, test[1]), 10,
                           (10,), 1, l2_reg=2.0**10)
  return out[10][0]


def aspect_zeroshot(towers, test, naflex):
  """Zero-shot accuracy on wide and tall canvases."""
  out = []
  for wide in (True, False):
    images = canvas(test[0], wide)
    if naflex:
      rows, cols = packing.naflex_grid(*images.shape[1:], PATCH, BUDGET)
      x = pixels(images, rows * PATCH, cols * PATCH)
    else:
      x = pixels(images, SIDE, SIDE)  # squashed to the fixed square
    out.append(towers.zeroshot(x, test[1]))
  return out


def one_seed(seed, args, train, test):
  """{arm: {metric: value}}."""
  out = {}
  for arm in siglip2_scenes.ARMS:
    workdir = os.path.join(args.out, str(seed), arm)
    start = time.time()
    result = runs.main_run(
        f'siglip2_scenes.py:{arm}', workdir, *runs.seeded(seed, args.steps),
        f'--config.evals.zeroshot.split=test[:{args.test}]',
        *([f'--config.evals.locca.split=test[:{args.scenes}]']
          if arm != 'siglip' else []))
    probe = runs.main_run(
        'segmentation_fmnist.py', f'{workdir}_probe',
        *runs.seeded(seed, args.probe_steps),
        f'--config.pretrained_path={workdir}')
    towers = Towers(workdir)
    out[arm] = {
        'zeroshot': result['zeroshot_accuracy'],
        'ten_shot': ten_shot(towers, train, test, seed),
        'miou': probe['miou'],
        'cider': result.get('cider_d'),
        'box': result.get('ref_box_accuracy'),
        'seconds': result['seconds_since_start'],
        'aspect': aspect_zeroshot(towers, test, arm.endswith('naflex')),
    }
    print(f'seed {seed} {arm}: {out[arm]} ({time.time() - start:.0f} s)',
          flush=True)
  return out


def table(results, args):
  """The markdown tables of docs/siglip2.md."""
  ms = lambda arm, key, i=None: runs.mean_se(
      [r[arm][key] if i is None else r[arm][key][i] for r in results])
  print(f'\n{args.seeds} seeds, mean +- s.e.; {args.steps} training steps, '
        f'{args.probe_steps} probe steps, {args.test} test items.\n')
  print('| recipe | zero-shot | 10-shot | dense probe mIoU | caption '
        'CIDEr-D | ref. box acc@0.5 | run s |')
  print('|---|---|---|---|---|---|---|')
  for arm, label in LABELS.items():
    decoder = results[0][arm]['cider'] is not None
    print(f'| {label} | {ms(arm, "zeroshot")} | {ms(arm, "ten_shot")} | '
          f'{ms(arm, "miou")} | {ms(arm, "cider") if decoder else "-"} | '
          f'{ms(arm, "box") if decoder else "-"} | '
          f'{np.mean([r[arm]["seconds"] for r in results]):.0f} |')
  print('\n| tower | wide 28 x 56 | tall 56 x 28 |')
  print('|---|---|---|')
  for arm, label in LABELS.items():
    print(f'| {label} | {ms(arm, "aspect", 0)} | {ms(arm, "aspect", 1)} |')


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/siglip2_scenes')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--probe_steps', type=int, default=300)
  parser.add_argument('--test', type=int, default=2000)
  parser.add_argument('--scenes', type=int, default=256)
  args = parser.parse_args()
  train = read_fmnist('train')
  test = tuple(x[:args.test] for x in read_fmnist('test'))
  results = [one_seed(seed, args, train, test) for seed in range(args.seeds)]
  table(results, args)


if __name__ == '__main__':
  main()
