r"""The three captioning arms of configs/captioning_fmnist.py over seeds;
prints the table of docs/captioning.md and seed 0's sample captions.

  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_default
  python scripts/captioning_fmnist.py --out=/tmp/captioning --seeds=3

Each seed runs `cappa`, `cappa_ar` and `llava` (the default job's export
frozen) for `--steps` steps and reads the scoring classifier's accuracy and
the exact match, token F1 and CIDEr-D of greedy captions of the first 2,000
test images (`--test`). A finished run is not repeated.

`--encoders` then compares the encoders that CapPa trained (cappa,
cappa_ar) with the default job's supervised recipe at the same steps and
seed, by dino_fmnist.py's evaluators (`trainer='evaluate'`): weighted
20-NN and 10-shot linear accuracy on the 10,000 test images.
"""

import argparse
import os

import runs

ARMS = ('cappa', 'cappa_ar', 'llava')
METRICS = (('scoring accuracy', 'scoring_accuracy'),
           ('exact match', 'exact_match'), ('token F1', 'token_f1'),
           ('CIDEr-D', 'cider_d'))


def encoder_table(args):
  """k-NN and 10-shot accuracy of CapPa's encoders and a supervised one."""
  rows = {'supervised (default.py)': [], 'cappa': [], 'cappa_ar': []}
  for seed in range(args.seeds):
    out = os.path.join(args.out, str(seed))
    runs.main_run('default.py', f'{out}/supervised',
                  *runs.seeded(seed, args.steps))
    paths = {'supervised (default.py)': f'{out}/supervised/ViT-fmnist.npz',
             'cappa': f'{out}/cappa/ViT-fmnist-cappa.npz',
             'cappa_ar': f'{out}/cappa_ar/ViT-fmnist-cappa_ar.npz'}
    for label, path in paths.items():
      r = runs.main_run('dino_fmnist.py', f'{path[:-4]}_eval',
                        '--config.trainer=evaluate',
                        f'--config.pretrained_path={path}')
      rows[label].append((r['knn_accuracy'], r['fewshot_10shot']))
  print('\n| encoder | 20-NN accuracy | 10-shot linear accuracy |')
  print('|---|---|---|')
  for label, values in rows.items():
    knn, shots = zip(*values)
    print(f'| {label} | {runs.mean_se(knn)} | {runs.mean_se(shots)} |')


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='/tmp/captioning')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--test', default='test[:2000]',
                      help='The test split that the evaluators read.')
  parser.add_argument('--encoders', action='store_true')
  args = parser.parse_args()
  results = {arm: [] for arm in ARMS}
  for seed in range(args.seeds):  # every arm of a seed, then the next seed
    for arm in ARMS:
      results[arm].append(runs.main_run(
          f'captioning_fmnist.py:{arm}', os.path.join(args.out, str(seed), arm),
          *runs.seeded(seed, args.steps), f'--config.pp.test={args.test}'))
  print(f'| arm | {" | ".join(name for name, _ in METRICS)} |')
  print('|---|' + '---|' * len(METRICS))
  for arm, rs in results.items():
    cells = [runs.mean_se([r[key] for r in rs]) for _, key in METRICS]
    print(f'| {arm} | {" | ".join(cells)} |')
  if args.encoders:
    encoder_table(args)
  for arm, rs in results.items():
    print(f'\n{arm}, seed 0:')
    for sample in rs[0]['samples']:
      print(f'  {sample["caption"]!r} (a reference: {sample["reference"]!r})')


if __name__ == '__main__':
  main()
