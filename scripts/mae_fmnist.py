r"""MAE on Fashion-MNIST against the same ViT from scratch, over seeds; prints
the table of docs/recipes.md.

  python scripts/mae_fmnist.py --out=/tmp/mae_fmnist --seeds=3

Each seed: MAE pretraining without labels (configs/mae_fmnist.py), then
fine-tuning on the labeled 10% (its 'finetune' arm, deit_fmnist.py's
split and recipe) from the MAE encoder and from scratch; and the 10-shot
linear accuracy (shots from the labeled 10%) of the MAE encoder and of the
same encoder at initialization. A finished run is not repeated. Means and
standard errors over the seeds.
"""

import argparse
import os

import runs

ROWS = (('MAE pretrained', 'mae'), ('from scratch', 'scratch'))


def main_run(arm, workdir, *flags):
  return runs.main_run(f'mae_fmnist.py:{arm}', workdir, *flags)


def one_seed(seed, args):
  """{arm: (fine-tuned test accuracy, 10-shot linear accuracy)}."""
  steps = lambda n: [f'--config.total_steps={n}',  # pylint: disable=g-long-lambda
                     f'--config.warmup_steps={max(n // 15, 1)}',
                     f'--config.progress_every={max(n // 5, 1)}']
  seeded = [f'--config.seed={seed}']
  out = os.path.join(args.out, str(seed))
  pretrain = main_run('pretrain', f'{out}/mae', *seeded,
                      *steps(args.pretrain_steps))
  encoder = f'{out}/mae/ViT-fmnist.npz'
  finetune = steps(args.finetune_steps)
  mae = main_run('finetune', f'{out}/mae_finetune', *seeded, *finetune,
                 f'--config.pretrained_path={encoder}')
  scratch = main_run('finetune', f'{out}/scratch', *seeded, *finetune)
  init = main_run('finetune', f'{out}/init_fewshot', *seeded,
                  '--config.trainer=fewshot', '--config.pretrained_path=' +
                  runs.initial_encoder(seed, f'{out}/init/ViT-fmnist.npz'))
  return {'mae': (mae['accuracy'], pretrain['fewshot_10shot']),
          'scratch': (scratch['accuracy'], init['fewshot_10shot'])}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/mae_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--pretrain_steps', type=int, default=3000)
  parser.add_argument('--finetune_steps', type=int, default=1500)
  args = parser.parse_args()
  results = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; MAE {args.pretrain_steps} steps, '
        f'fine-tuning {args.finetune_steps} steps.\n')
  print('| encoder | fine-tuned on 10% (test accuracy) | 10-shot linear |')
  print('|---|---|---|')
  for label, arm in ROWS:
    tuned, shots = zip(*(r[arm] for r in results))
    print(f'| {label} | {runs.mean_se(tuned)} | {runs.mean_se(shots)} |')


if __name__ == '__main__':
  main()
