r"""VideoMAE on moving Fashion-MNIST over seeds: pretrain
(configs/videomae_fmnist.py, its k-NN accuracy), fine-tune from the
export, and the same model fine-tuned from scratch; prints the rows of
docs/video.md's table.

  python scripts/videomae_fmnist.py --out=/tmp/videomae_fmnist --seeds=3

Each seed pretrains its own encoder (`--pretrain_steps`), then trains
`--steps` steps of the `:finetune` arm from it and from random
initialization (`--config.pretrained_path=`). A finished run is not
repeated.
"""

import argparse
import os

import runs


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/videomae_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--pretrain_steps', type=int, default=1200)
  parser.add_argument('--steps', type=int, default=600)
  args = parser.parse_args()
  rows = {'VideoMAE-pretrained (sincos, mean pool)': [],
          'same model, scratch': []}
  knn = []
  for seed in range(args.seeds):
    folder = os.path.join(args.out, str(seed))
    pre = runs.main_run('videomae_fmnist.py', os.path.join(folder, 'pre'),
                        *runs.seeded(seed, args.pretrain_steps))
    knn.append(pre['knn_accuracy'])
    export = os.path.join(folder, 'pre', 'ViViT-fmnist.npz')
    for (label, out), path in zip(rows.items(), (export, '')):
      result = runs.main_run(
          'videomae_fmnist.py:finetune',
          os.path.join(folder, 'ft' if path else 'scratch'),
          *runs.seeded(seed, args.steps), f'--config.pretrained_path={path}')
      seconds = result['seconds_since_start'] + (
          pre['seconds_since_start'] if path else 0)
      out.append((result['accuracy'], seconds))
  print(f'{args.seeds} seeds, mean +- s.e.; pretraining {args.pretrain_steps}'
        f' steps (k-NN accuracy {runs.mean_se(knn)}), fine-tuning '
        f'{args.steps} steps.\n')
  print('| model | test accuracy | runs | training time (s) |')
  print('|---|---|---|---|')
  for label, results in rows.items():
    accuracy, seconds = zip(*results)
    print(f'| {label} | {runs.mean_se(accuracy)} | '
          + ' / '.join(f'{a:.4f}' for a in accuracy) + ' | '
          + ' / '.join(f'{s:.0f}' for s in seconds) + ' |')


if __name__ == '__main__':
  main()
