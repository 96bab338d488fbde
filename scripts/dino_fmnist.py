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
import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
ARMS = (('DINO', 'dino'), ('MAE', 'mae'), ('random init', 'init'),
        ('supervised (reference)', 'supervised'))
CONFIGS = {'dino': 'dino_fmnist.py', 'mae': 'mae_fmnist.py:pretrain',
           'supervised': 'default.py'}


def main_run(config, workdir, *flags):
  """`python -m vit_jax.main` once (skipped if finished); its results."""
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    subprocess.run([sys.executable, '-m', 'vit_jax.main',
                    f'--config={ROOT}/configs/{config}',
                    f'--workdir={workdir}', *flags], check=True, cwd=ROOT)
  with open(results) as f:
    return json.load(f)


def initial_encoder(seed, path):
  """The ViT without a head at initialization (the loop's init key), .npz."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from vit_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax import models  # pylint: disable=g-import-not-at-top
  from vit_jax.configs import default  # pylint: disable=g-import-not-at-top
  if not os.path.exists(path):
    config = default.get_config()
    model = models.VisionTransformer(num_classes=None, **config.model)
    key = jax.random.split(jax.random.key(seed))[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shape = (1, config.pp.crop, config.pp.crop, 3)
    checkpoint.save(model.init(key, jnp.zeros(shape), train=False)['params'],
                    path)
  return path


def one_seed(seed, args):
  """{arm: (k-NN accuracy, 10-shot linear accuracy)}."""
  out = os.path.join(args.out, str(seed))
  seeded = [f'--config.seed={seed}', f'--config.total_steps={args.steps}',
            f'--config.progress_every={max(args.steps // 5, 1)}',
            '--config.checkpoint_every=0']
  # DINO's run ends with these evaluators; the others are evaluated after.
  results = {'dino': main_run(CONFIGS['dino'], f'{out}/dino', *seeded)}
  encoders = {'init': initial_encoder(seed, f'{out}/init/ViT-fmnist.npz')}
  for arm in ('mae', 'supervised'):
    main_run(CONFIGS[arm], f'{out}/{arm}', *seeded)
    encoders[arm] = f'{out}/{arm}/ViT-fmnist.npz'
  for arm, path in encoders.items():
    results[arm] = main_run('dino_fmnist.py', f'{out}/{arm}_eval',
                            '--config.trainer=evaluate',
                            f'--config.pretrained_path={path}')
  return {arm: (r['knn_accuracy'], r['fewshot_10shot'])
          for arm, r in results.items()}


def mean_se(values):
  values = np.asarray(values)
  se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.
  return f'{values.mean():.4f} +- {se:.4f}'


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/dino_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=1000)
  args = parser.parse_args()
  runs = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; {args.steps} training steps.\n')
  print('| encoder | k-NN (k = 20) | runs | 10-shot linear | runs |')
  print('|---|---|---|---|---|')
  for label, arm in ARMS:
    knn, shots = zip(*(r[arm] for r in runs))
    print(f'| {label} | {mean_se(knn)} | {", ".join(f"{x:.4f}" for x in knn)}'
          f' | {mean_se(shots)} | {", ".join(f"{x:.4f}" for x in shots)} |')


if __name__ == '__main__':
  main()
