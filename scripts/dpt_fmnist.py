r"""The linear probe against DPT's head on Fashion-MNIST scenes, and DPT's
relative depth, over seeds; prints the table of docs/dense.md ("Depth on
the scenes") and draws its picture.

  python scripts/dpt_fmnist.py --out=/tmp/dpt_fmnist --seeds=3 \
      --picture=docs/figures/depth_fmnist.png

Each seed s probes the default job's encoder (configs/segmentation_fmnist.py's
DEFAULT_ENCODER; the README's first command writes it) with three arms of
configs/segmentation_fmnist.py, seed s, `--steps` steps each (default the
config's): 'last4' (the linear head on the last four blocks), 'dpt' (DPT's
head on them) and 'depth' (DPT's head predicting the scenes' relative
depth). A finished run is not repeated; seeds share one JAX compilation
cache; `--seed=S` runs one seed (to run seeds side by side). `--picture=PNG`
draws test scenes, their true depth and seed 0's predicted depth.
"""

import argparse
import os

import numpy as np

import runs

# (label, arm, metric).
ARMS = (('linear, segmentation', 'last4', 'miou'),
        ('DPT, segmentation', 'dpt', 'miou'),
        ('DPT, depth', 'depth', 'abs_rel'))


def run_dir(out, seed, arm):
  return os.path.join(out, str(seed), arm)


def one_seed(seed, args):
  """{arm: (results, seconds)} of this seed's probes."""
  result = {}
  for _, arm, _ in ARMS:
    flags = [f'--config.seed={seed}', '--config.checkpoint_every=0']
    if args.steps:
      flags += [f'--config.total_steps={args.steps}',
                f'--config.progress_every={max(args.steps // 5, 1)}']
    r = runs.main_run(f'segmentation_fmnist.py:{arm}',
                      run_dir(args.out, seed, arm), *flags)
    result[arm] = r, r['seconds_since_start']
  return result


def picture(args, path, scenes=4):
  """Test scenes, their true disparity and seed 0's DPT prediction (its
  own scale: relative depth), nearer brighter."""
  # pylint: disable=g-import-not-at-top
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  from vit_jax import launch
  from vit_jax.configs import segmentation_fmnist
  from vit_jax.data import pipeline
  from vit_jax.data import segmentation as segmentation_data
  # pylint: enable=g-import-not-at-top
  config = segmentation_fmnist.get_config('depth')
  info = pipeline.dataset_info(pipeline.get_builder(config), config)
  batch = next(pipeline.eval_batches(info, config, batch_size=scenes,
                                     example=segmentation_data.eval_example))
  workdir = run_dir(args.out, 0, 'depth')
  task = launch.make_task(config, workdir, training=False)
  _, variables = task.checkpoint(f'{workdir}/ViT-fmnist.npz')
  predicted = np.asarray(task.model.apply(variables, batch['image']))[..., 0]
  columns = (('scene', batch['image'][..., 0], 'gray'),
             ('true depth', batch['depth'], 'magma'),
             ('DPT', predicted, 'magma'))
  fig, axes = plt.subplots(scenes, len(columns),
                           figsize=(1.7 * len(columns), 1.7 * scenes))
  for row in range(scenes):
    for col, (title, maps, cmap) in enumerate(columns):
      ax = axes[row, col]
      ax.imshow(maps[row], cmap=cmap, interpolation='nearest')
      ax.set_xticks([])
      ax.set_yticks([])
      if not row:
        ax.set_title(title, fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print('wrote', path)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/dpt_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, help="default: the config's")
  parser.add_argument('--picture', help="PNG of seed 0's depth")
  parser.add_argument('--seed', type=int,
                      help='run this seed only (seeds side by side)')
  args = parser.parse_args()
  os.environ.setdefault('JAX_COMPILATION_CACHE_DIR',
                        os.path.join(args.out, 'jax_cache'))
  if args.seed is not None:
    one_seed(args.seed, args)
    return
  results = [one_seed(seed, args) for seed in range(args.seeds)]
  steps = args.steps or "the config's"
  print(f'{args.seeds} seeds, mean +- s.e.; {steps} steps.\n')
  print('| head, target | metric | mean | runs | seconds per run |')
  print('|---|---|---|---|---|')
  listed = lambda xs: ', '.join(f'{x:.4f}' for x in xs)
  for label, arm, metric in ARMS:
    values = [r[arm][0][metric] for r in results]
    seconds = [r[arm][1] for r in results]
    print(f'| {label} | {metric} | {runs.mean_se(values)} | '
          f'{listed(values)} | {", ".join(f"{s:.0f}" for s in seconds)} |')
    if metric == 'abs_rel':
      delta = [r[arm][0]['delta1'] for r in results]
      print(f'| {label} | delta1 | {runs.mean_se(delta)} | {listed(delta)} '
            '| |')
  if args.picture:
    picture(args, args.picture)


if __name__ == '__main__':
  main()
