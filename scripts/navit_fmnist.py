r"""NaViT against a plain ViT at 28 px on Fashion-MNIST, over seeds: the
accuracy-versus-resolution table of docs/navit.md.

  python scripts/navit_fmnist.py --out=/tmp/navit_fmnist --seeds=3

Each seed trains configs/navit_fmnist.py's two arms for the same steps, so
the same budget of token slots (16 x 256 = 4,096 a step): 'navit' (images
at random sides 14..56 px, packed) and 'vit28' (the ViT at 28 px). Both are
evaluated at 14, 28, 42 and 56 px, NaViT also on the mixed test stream.
A finished run is not repeated. Prints means +- standard errors over the
seeds, NaViT's packing efficiency and each run's time. Flags it does not
know go to every run (`--config.pp.test=test[:512]` for a quick check).
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = (('NaViT, packed, trained at 14..56 px', 'navit'),
        ('ViT trained at 28 px, position table resized', 'vit28'))
COLUMNS = ('14px', '28px', '42px', '56px', 'mixed')


def run(arm, seed, args, extra):
  """`python -m vit_jax.main` for one arm and seed; its results.json."""
  workdir = os.path.join(args.out, f'{arm}_{seed}')
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    n = args.steps
    subprocess.run([
        sys.executable, '-m', 'vit_jax.main',
        f'--config={ROOT}/configs/navit_fmnist.py:{arm}',
        f'--workdir={workdir}', f'--config.seed={seed}',
        f'--config.total_steps={n}',
        f'--config.warmup_steps={max(n // 15, 1)}',  # the config's 200/3000
        f'--config.progress_every={max(n // 10, 1)}', *extra],
                   check=True, cwd=ROOT)
  with open(results) as f:
    return json.load(f)


def mean_se(values):
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return f'{values.mean():.4f}'  # no standard error of one run
  se = values.std(ddof=1) / np.sqrt(len(values))
  return f'{values.mean():.4f} +- {se:.4f}'


def table(runs, args):
  """The markdown table of `runs` ({arm: [results per seed]})."""
  lines = [f'{args.seeds} seed(s), {args.steps} steps each, test accuracy '
           '(mean +- s.e.).', '',
           '| model | ' + ' | '.join(c.replace('px', ' px')
                                      for c in COLUMNS) + ' |',
           '|---|' + '---|' * len(COLUMNS)]
  for label, arm in ARMS:
    cells = [mean_se([r[f'accuracy_{c}'] for r in runs[arm]])
             if f'accuracy_{c}' in runs[arm][0] else '-' for c in COLUMNS]
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  lines.append('NaViT training batches, packing efficiency (real tokens / '
               'all tokens): ' + mean_se(
                   [r['packing_efficiency'] for r in runs['navit']]))
  for _, arm in ARMS:
    seconds = ', '.join(f'{r["seconds_since_start"]:.0f}'
                        for r in runs[arm])
    lines.append(f'{arm}: seconds per run (training and evaluation): '
                 f'{seconds}')
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/navit_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=3000)
  args, extra = parser.parse_known_args()
  runs = {arm: [run(arm, seed, args, extra) for seed in range(args.seeds)]
          for _, arm in ARMS}
  print(table(runs, args))


if __name__ == '__main__':
  main()
