r"""ViViT on moving Fashion-MNIST from scratch, and from the default job's
image ViT with each tubelet-kernel initialization, over seeds; prints the
table of docs/video.md.

  python scripts/vivit_fmnist.py --out=/tmp/vivit_fmnist --seeds=3
  python scripts/vivit_fmnist.py --seeds=3 --arms=timesformer   # one arm

The image checkpoint is one: the default job's export
(`--image=/tmp/vit_default/ViT-fmnist.npz`, trained first if missing),
as a user starts from one published checkpoint; the seeds vary the video
runs (initialization of what is new, data order). Every arm trains
`--steps` steps of configs/vivit_fmnist.py and is tested on all test clips
with the config's temporal views. A finished run is not repeated.
"""

import argparse
import os

import runs

# (label, its folder, the config's arm, flags)
ARMS = (('scratch', 'scratch', 'scratch', []),
        ('from image, central frame', 'central_frame', 'from_image',
         ['--config.video.kernel_init=central_frame']),
        ('from image, average (inflation)', 'average', 'from_image',
         ['--config.video.kernel_init=average']),
        ('factorised encoder, from image', 'factorised', 'factorised', []),
        ('TimeSformer (divided), from image', 'timesformer', 'timesformer',
         []))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/vivit_fmnist')
  parser.add_argument('--image', default='/tmp/vit_default/ViT-fmnist.npz')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=600)
  parser.add_argument('--arms', default='',
                      help='comma-separated folders of ARMS (default all)')
  args = parser.parse_args()
  chosen = [a for a in ARMS if not args.arms or a[1] in args.arms.split(',')]
  if not os.path.exists(args.image):
    runs.main_run('default.py', os.path.dirname(args.image))
  table = {label: [] for label, *_ in chosen}
  for seed in range(args.seeds):
    for label, folder, arm, flags in chosen:
      image = [] if arm == 'scratch' else [
          f'--config.pretrained_path={args.image}']
      result = runs.main_run(
          f'vivit_fmnist.py:{arm}', os.path.join(args.out, str(seed), folder),
          *runs.seeded(seed, args.steps), *flags, *image)
      table[label].append((result['accuracy'],
                           result['seconds_since_start']))
  print(f'{args.seeds} seeds, mean +- s.e.; {args.steps} steps.\n')
  print('| model | test accuracy | runs | training time (s) |')
  print('|---|---|---|---|')
  for label, rows in table.items():
    accuracy, seconds = zip(*rows)
    print(f'| {label} | {runs.mean_se(accuracy)} | '
          + ' / '.join(f'{a:.4f}' for a in accuracy) + ' | '
          + ' / '.join(f'{s:.0f}' for s in seconds) + ' |')


if __name__ == '__main__':
  main()
