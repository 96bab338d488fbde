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
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ROWS = (('MAE pretrained', 'mae'), ('from scratch', 'scratch'))


def main_run(config, workdir, *flags):
  """`python -m vit_jax.main` once; its results.json."""
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    subprocess.run([sys.executable, '-m', 'vit_jax.main',
                    f'--config={ROOT}/configs/mae_fmnist.py:{config}',
                    f'--workdir={workdir}', *flags], check=True, cwd=ROOT)
  with open(results) as f:
    return json.load(f)


def initial_encoder(seed, path):
  """The ViT without a head at initialization (the loop's init key), as .npz."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import mae_fmnist  # pylint: disable=g-import-not-at-top
  from vit_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    config = mae_fmnist.get_config('finetune')
    model = models.VisionTransformer(num_classes=None, **config.model)
    key = jax.random.split(jax.random.key(seed))[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shape = (1, config.pp.crop, config.pp.crop, 3)
    checkpoint.save(model.init(key, jnp.zeros(shape), train=False)['params'],
                    path)
  return path


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
                  initial_encoder(seed, f'{out}/init/ViT-fmnist.npz'))
  return {'mae': (mae['accuracy'], pretrain['fewshot_10shot']),
          'scratch': (scratch['accuracy'], init['fewshot_10shot'])}


def mean_se(values):
  values = np.asarray(values)
  se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.
  return f'{values.mean():.4f} +- {se:.4f}'


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/mae_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--pretrain_steps', type=int, default=3000)
  parser.add_argument('--finetune_steps', type=int, default=1500)
  args = parser.parse_args()
  runs = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; MAE {args.pretrain_steps} steps, '
        f'fine-tuning {args.finetune_steps} steps.\n')
  print('| encoder | fine-tuned on 10% (test accuracy) | 10-shot linear |')
  print('|---|---|---|')
  for label, arm in ROWS:
    tuned, shots = zip(*(r[arm] for r in runs))
    print(f'| {label} | {mean_se(tuned)} | {mean_se(shots)} |')


if __name__ == '__main__':
  main()
