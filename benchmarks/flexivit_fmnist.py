r"""FlexiViT against ViTs of one patch size on Fashion-MNIST: the accuracy at
patch sizes 4, 7 and 14 of each arm of configs/flexivit_fmnist.py, over
seeds (mean +- standard deviation), the table of docs/flexivit.md.

  python benchmarks/flexivit_fmnist.py --out=/tmp/flexivit_fmnist --seeds=3

Each run is `python -m vit_jax.main` for the same steps; a finished run
(its results.json) is not repeated. Flags it does not know go to every run
(`--config.pp.test=test[:500]` for a quick check).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARMS = (('FlexiViT, random patch size 4, 7 or 14 each step', 'flexi'),
        ('ViT trained at patch size 4', 'vit4'),
        ('ViT trained at patch size 14', 'vit14'))
SIZES = (4, 7, 14)


def run(arm, seed, args, extra):
  """One arm and seed, trained and evaluated; its results.json."""
  workdir = os.path.join(args.out, f'{arm}_{seed}')
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    subprocess.run([
        sys.executable, '-m', 'vit_jax.main',
        f'--config={ROOT}/configs/flexivit_fmnist.py:{arm}',
        f'--workdir={workdir}', f'--config.seed={seed}',
        f'--config.total_steps={args.steps}',
        f'--config.progress_every={max(args.steps // 5, 1)}', *extra],
                   check=True, cwd=ROOT)
  with open(results) as f:
    return json.load(f)


def mean_std(values):
  values = np.asarray(values, np.float64)
  std = values.std(ddof=1) if len(values) > 1 else 0.
  return f'{values.mean():.4f} +- {std:.4f}'


def cpu_name():
  """The CPU's model name (`lscpu`), else what Python knows."""
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True).stdout
  except OSError:
    return platform.processor() or platform.machine()
  names = [line.split(':', 1)[1].strip() for line in out.splitlines()
           if line.startswith('Model name')]
  return names[0] if names else platform.machine()


def table(runs, args):
  """The markdown table of `runs` ({arm: [results per seed]})."""
  lines = [f'{args.seeds} seeds, {args.steps} steps each; test accuracy '
           '(mean +- std over seeds), 10,000 test images. '
           f'{cpu_name()}, {os.cpu_count()} cores.', '',
           '| model | ' + ' | '.join(f'patch {p}' for p in SIZES) + ' |',
           '|---|' + '---|' * len(SIZES)]
  for label, arm in ARMS:
    cells = [mean_std([r[f'accuracy_patch{p}'] for r in runs[arm]])
             for p in SIZES]
    lines.append(f'| {label} | ' + ' | '.join(cells) + ' |')
  lines.append('')
  for _, arm in ARMS:
    seconds = ', '.join(f'{r["seconds_since_start"]:.0f}' for r in runs[arm])
    lines.append(f'{arm}: seconds per run (training and evaluation): '
                 f'{seconds}')
  return '\n'.join(lines)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/flexivit_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=1000)
  args, extra = parser.parse_known_args()
  start = time.perf_counter()
  runs = {arm: [run(arm, seed, args, extra) for seed in range(args.seeds)]
          for _, arm in ARMS}
  print(table(runs, args))
  print(f'Wall time of this invocation: {time.perf_counter() - start:.0f} s.')


if __name__ == '__main__':
  main()
