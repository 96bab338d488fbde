r"""Runs configs/deit_fmnist.py's arms for several seeds; prints the table.

  python scripts/deit_fmnist.py --out=/tmp/deit_fmnist --seeds=3 --steps=500

Each seed trains the teacher first, then the plain, augreg and deit arms
(deit distils from that seed's teacher). A finished run is not repeated.
Prints a markdown table: mean test accuracy, its standard error, the runs.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

ARMS = ('teacher', 'plain', 'augreg', 'deit')


def run(arm, seed, args):
  workdir = os.path.join(args.out, f'{arm}_{seed}')
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    flags = [f'--config.seed={seed}', f'--config.total_steps={args.steps}',
             f'--config.warmup_steps={args.steps // 10}',
             f'--config.progress_every={args.steps // 2}']
    if arm == 'deit':
      flags.append('--config.distill.teacher_path=' + os.path.join(
          args.out, f'teacher_{seed}', 'BiT-fmnist.npz'))
    subprocess.run([sys.executable, '-m', 'vit_jax.main',
                    f'--config=configs/deit_fmnist.py:{arm}',
                    f'--workdir={workdir}', *flags], check=True)
  with open(results) as f:
    return json.load(f)['accuracy']


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/deit_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=1500)
  args = parser.parse_args()
  accuracy = {arm: [] for arm in ARMS}
  for seed in range(args.seeds):
    for arm in ARMS:
      accuracy[arm].append(run(arm, seed, args))
  print(f'| arm | test accuracy (mean +- s.e., {args.seeds} seeds) | runs |')
  print('|---|---|---|')
  for arm in ARMS:
    acc = np.array(accuracy[arm])
    se = acc.std(ddof=1) / np.sqrt(len(acc)) if len(acc) > 1 else 0.
    runs = ', '.join(f'{a:.4f}' for a in acc)
    print(f'| {arm} | {acc.mean():.4f} +- {se:.4f} | {runs} |')


if __name__ == '__main__':
  main()
