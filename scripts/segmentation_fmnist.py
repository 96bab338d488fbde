r"""Dense linear probes of four encoders on Fashion-MNIST scenes, over seeds;
prints the table of docs/dense.md and draws its picture.

  python scripts/segmentation_fmnist.py --out=/tmp/seg_fmnist --seeds=3

Each seed trains the default job's ViT three ways for `--steps` steps, as
scripts/dino_fmnist.py does: supervised (configs/default.py), MAE and DINO
(without labels), and takes the same ViT at initialization; then probes
each encoder with configs/segmentation_fmnist.py:ARM (DINOv2's linear head
on the last block, or on the last four: `--arm`; the seed's probe) and reads
its mean IoU and pixel accuracy on the 1,024 test scenes. A finished run is
not repeated. `--picture=PNG` draws three test scenes, their labels and
seed 0's predictions.
"""

import argparse
import os

import numpy as np

import runs

ARMS = (('supervised', 'supervised'), ('MAE', 'mae'), ('DINO', 'dino'),
        ('random init', 'init'))
CONFIGS = {'dino': 'dino_fmnist.py', 'mae': 'mae_fmnist.py:pretrain',
           'supervised': 'default.py'}


def encoders(seed, out, steps):
  """{arm: the .npz of its encoder}, trained unless there."""
  flags = runs.seeded(seed, steps)
  paths = {'init': runs.initial_encoder(seed, f'{out}/init/ViT-fmnist.npz')}
  for arm, config in CONFIGS.items():
    runs.main_run(config, f'{out}/{arm}', *flags)
    paths[arm] = f'{out}/{arm}/ViT-fmnist.npz'
  return paths


def probe_dir(out, arm, probe):
  return f'{out}/{arm}_probe_{probe}'


def one_seed(seed, args):
  """{arm: (mean IoU, pixel accuracy)} of the probes of this seed."""
  out = os.path.join(args.out, str(seed))
  result = {}
  for arm, path in encoders(seed, out, args.steps).items():
    r = runs.main_run(f'segmentation_fmnist.py:{args.arm}',
                      probe_dir(out, arm, args.arm),
                      f'--config.pretrained_path={path}',
                      f'--config.seed={seed}')
    result[arm] = r['miou'], r['pixel_accuracy']
  return result


def picture(args, path, scenes=3):
  """Scenes, their labels and each encoder's prediction (seed 0's)."""
  # pylint: disable=g-import-not-at-top
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  from vit_jax import launch
  from vit_jax.checkpoints import files
  from vit_jax.configs import segmentation_fmnist
  from vit_jax.data import pipeline
  from vit_jax.data import segmentation as segmentation_data
  from vit_jax.models import segmentation
  # pylint: enable=g-import-not-at-top
  out = os.path.join(args.out, '0')
  config = segmentation_fmnist.get_config(args.arm)
  info = pipeline.dataset_info(pipeline.get_builder(config), config)
  batch = next(pipeline.eval_batches(info, config, batch_size=scenes,
                                     example=segmentation_data.eval_example))
  columns = [('scene', None), ('labels', batch['segmentation'])]
  for label, arm in ARMS:
    config = segmentation_fmnist.get_config(args.arm).unlock()
    config.pretrained_path = f'{out}/{arm}/ViT-fmnist.npz'
    probe = probe_dir(out, arm, args.arm)
    task = launch.make_task(config, probe, training=False)
    variables = files.load(f'{probe}/ViT-fmnist.npz')
    logits = task.model.apply(variables, batch['image'])
    columns.append((label, np.argmax(segmentation.upsample(
        logits, batch['segmentation'].shape[1:]), -1)))
  fig, axes = plt.subplots(scenes, len(columns),
                           figsize=(1.6 * len(columns), 1.7 * scenes))
  for row in range(scenes):
    for col, (title, maps) in enumerate(columns):
      ax = axes[row, col]
      if maps is None:
        ax.imshow(batch['image'][row, ..., 0], cmap='gray', vmin=-1, vmax=1)
      else:
        ax.imshow(maps[row], cmap='tab20', vmin=0, vmax=19,
                  interpolation='nearest')
      ax.set_xticks([])
      ax.set_yticks([])
      if not row:
        ax.set_title(title, fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print('wrote', path)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/seg_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=1000)
  parser.add_argument('--arm', default='last4', help='the probe: last, last4')
  parser.add_argument('--picture', help='PNG of seed 0\'s predictions')
  args = parser.parse_args()
  results = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; encoders trained '
        f'{args.steps} steps; probe {args.arm}.\n')
  print('| encoder | mean IoU | runs | pixel accuracy | runs |')
  print('|---|---|---|---|---|')
  listed = lambda xs: ', '.join(f'{x:.4f}' for x in xs)
  for label, arm in ARMS:
    miou, accuracy = zip(*(r[arm] for r in results))
    print(f'| {label} | {runs.mean_se(miou)} | {listed(miou)} | '
          f'{runs.mean_se(accuracy)} | {listed(accuracy)} |')
  if args.picture:
    picture(args, args.picture)


if __name__ == '__main__':
  main()
