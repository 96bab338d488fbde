r"""Zero-shot Fashion-MNIST: CLIP and SigLIP trained from scratch (both
towers, configs/siglip_fmnist.py) against LiT on the default job's locked
ViT (configs/lit_fmnist.py), the same steps and captions; prints the table.

  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_default
  python scripts/image_text_fmnist.py --out=/tmp/image_text --seeds=3 \
      --image_init=/tmp/vit_default/ViT-fmnist.npz

A finished run is not repeated. The table: mean zero-shot test accuracy,
its standard error, the runs.
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

# arm: (config, extra flags)
ARMS = {'LiT (softmax, locked ViT)': ('configs/lit_fmnist.py:softmax', True),
        'LiT (sigmoid, locked ViT)': ('configs/lit_fmnist.py:sigmoid', True),
        'CLIP from scratch': ('configs/siglip_fmnist.py:clip', False),
        'SigLIP from scratch': ('configs/siglip_fmnist.py:siglip', False)}


def run(arm, seed, args):
  config, locked = ARMS[arm]
  workdir = os.path.join(args.out, f'{config.split(":")[-1]}_'
                         f'{"lit" if locked else "scratch"}_{seed}')
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    flags = [f'--config.seed={seed}', f'--config.total_steps={args.steps}',
             f'--config.evals.zeroshot.every={args.steps}']
    if locked:
      flags.append(f'--config.lit.image_init={args.image_init}')
    subprocess.run([sys.executable, '-m', 'vit_jax.main', f'--config={config}',
                    f'--workdir={workdir}', *flags], check=True)
  with open(results) as f:
    return json.load(f)['zeroshot_accuracy']


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='/tmp/image_text')
  parser.add_argument('--image_init', default='/tmp/vit_default/ViT-fmnist.npz')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=500)
  args = parser.parse_args()
  accuracy = {arm: [run(arm, seed, args) for seed in range(args.seeds)]
              for arm in ARMS}
  print(f'| arm | zero-shot accuracy (mean +- s.e., {args.seeds} seeds, '
        f'{args.steps} steps) | runs |')
  print('|---|---|---|')
  for arm, runs in accuracy.items():
    acc = np.array(runs)
    se = acc.std(ddof=1) / np.sqrt(len(acc)) if len(acc) > 1 else 0.
    print(f'| {arm} | {acc.mean():.4f} +- {se:.4f} | '
          f'{", ".join(f"{a:.4f}" for a in acc)} |')


if __name__ == '__main__':
  main()
