r"""DINO against MAE, a random-init encoder and supervised training, on
Fashion-MNIST, over seeds; prints the table of docs/dino.md.

  python scripts/dino_fmnist.py --out=/tmp/dino_fmnist --seeds=3

Each seed trains the default job's ViT three ways, each for `--steps`
steps: DINO (configs/dino_fmnist.py) and MAE (configs/mae_fmnist.py)
without labels, and the default job's supervised recipe with them (a
reference); and takes the same encoder at initialization. Every encoder is
evaluated with dino_fmnist.py's evaluators (DINO's run ends with them, the
others by `trainer='evaluate'`): DINO's weighted k-NN (k = 20, T = 0.07,
the 60,000 training images as memory) and 10-shot linear regression, on
all 10,000 test images. A finished run is not repeated. Means and
standard errors over the seeds.
"""

import argparse
import os

import runs

ARMS = (('DINO', 'dino'), ('MAE', 'mae'), ('random init', 'init'),
        ('supervised (reference)', 'supervised'))
CONFIGS = {'dino': 'dino_fmnist.py', 'mae': 'mae_fmnist.py:pretrain',
           'supervised': 'default.py'}


def one_seed(seed, args):
  """{arm: (k-NN accuracy, 10-shot linear accuracy)}."""
  out = os.path.join(args.out, str(seed))
  seeded = runs.seeded(seed, args.steps)
  # DINO's run ends with these evaluators; the others are evaluated after.
  results = {'dino': runs.main_run(CONFIGS['dino'], f'{out}/dino',
                                   *seeded)}
  encoders = {'init': runs.initial_encoder(seed, f'{out}/init/ViT-fmnist.npz')}
  for arm in ('mae', 'supervised'):
    runs.main_run(CONFIGS[arm], f'{out}/{arm}', *seeded)
    encoders[arm] = f'{out}/{arm}/ViT-fmnist.npz'
  for arm, path in encoders.items():
    results[arm] = runs.main_run('dino_fmnist.py', f'{out}/{arm}_eval',
                                 '--config.trainer=evaluate',
                                 f'--config.pretrained_path={path}')
  return {arm: (r['knn_accuracy'], r['fewshot_10shot'])
          for arm, r in results.items()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/dino_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=1000)
  args = parser.parse_args()
  results = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; {args.steps} training steps.\n')
  print('| encoder | k-NN (k = 20) | runs | 10-shot linear | runs |')
  print('|---|---|---|---|---|')
  listed = lambda xs: ', '.join(f'{x:.4f}' for x in xs)
  for label, arm in ARMS:
    knn, shots = zip(*(r[arm] for r in results))
    print(f'| {label} | {runs.mean_se(knn)} | {listed(knn)} | '
          f'{runs.mean_se(shots)} | {listed(shots)} |')


if __name__ == '__main__':
  main()
