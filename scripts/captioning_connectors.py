r"""Three connectors from a frozen ViT to a small LM on Fashion-MNIST
scenes, over seeds; prints the table of docs/captioning.md.

  python scripts/captioning_connectors.py --out=/tmp/connectors --seeds=3

First the encoders, once: the default job's ViT (configs/default.py,
`--encoder_steps`) and a DINO-trained one (configs/dino_fmnist.py,
`--dino_steps`). Then each seed trains configs/captioning_fmnist.py's
`llava`, `internvl` and `prismatic` arms on the scenes (`:ARM,scenes`)
for `--steps` steps: LLaVA's MLP on the supervised ViT's tokens, InternVL's
pixel shuffle on its tiles, Prismatic's fusion of both encoders. Each run
ends with exact match, token F1 and CIDEr-D of greedy captions of `--test`;
scenes have no scoring classifier (it scores single items' class
prompts). The table adds the tokens each arm feeds its LM per image
(counted on seed 0's export: `encode` of a scene, padding excluded) and
the runs' mean seconds. A finished run is not repeated.
"""

import argparse
import json
import os
import sys

import ml_collections
import numpy as np

import runs

sys.path.insert(0, runs.ROOT)
# pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow as tf
from vit_jax.data import pipeline
from vit_jax.tasks import captioning as captioning_task
# pylint: enable=g-import-not-at-top,wrong-import-position

ARMS = {'llava': "LLaVA's MLP (supervised ViT)",
        'internvl': "InternVL's pixel shuffle + MLP, 2 x 2 tiles + thumbnail",
        'prismatic': "Prismatic's fusion (supervised ViT + DINO ViT)"}
METRICS = (('exact match', 'exact_match'), ('token F1', 'token_f1'),
           ('CIDEr-D', 'cider_d'))
SCENE = 56  # px


def encoders(args):
  """(supervised, DINO) export paths, trained once."""
  out = os.path.join(args.out, 'encoders')
  runs.main_run('default.py', f'{out}/supervised',
                *runs.seeded(0, args.encoder_steps))
  runs.main_run('dino_fmnist.py', f'{out}/dino',
                *runs.seeded(0, args.dino_steps),
                f'--config.warmup_steps={args.dino_steps // 10}')
  return f'{out}/supervised/ViT-fmnist.npz', f'{out}/dino/ViT-fmnist.npz'


def lm_tokens(workdir):
  """Image tokens the LM reads for one scene (NaN padding excluded)."""
  with open(os.path.join(workdir, 'config.json')) as f:
    name = json.load(f)['model_name']
  model, params, _, saved = captioning_task.load_captioner(
      captioning_task.export_path(workdir, name))
  image = pipeline.preprocess_eval(tf.zeros([SCENE, SCENE, 3], tf.uint8),
                                   ml_collections.ConfigDict(saved['pp']))
  memory = model.apply({'params': params}, image.numpy()[None],
                       method='encode')
  return int((~np.isnan(np.asarray(memory[0, :, 0]))).sum())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', default='/tmp/connectors')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=150)
  parser.add_argument('--encoder_steps', type=int, default=500)
  parser.add_argument('--dino_steps', type=int, default=400)
  parser.add_argument('--test', default='test[:256]',
                      help='The test scenes that the evaluator reads.')
  parser.add_argument('--seed', type=int, default=None,
                      help="Run this seed's arms only, no table (seeds in "
                      'parallel processes; a run without it then reads them).')
  args = parser.parse_args()
  supervised, dino = encoders(args)
  seeds = range(args.seeds) if args.seed is None else [args.seed]
  flags = {
      'llava': [f'--config.pretrained_path={supervised}'],
      'internvl': [f'--config.pretrained_path={supervised}'],
      'prismatic': [f"--config.captioning.encoders=({{'path': '{supervised}',"
                    f" 'size': 56}}, {{'path': '{dino}', 'size': 28}})"]}
  results = {arm: [] for arm in ARMS}
  for seed in seeds:  # every arm of a seed, then the next seed
    for arm in ARMS:
      workdir = os.path.join(args.out, str(seed), arm)
      result = runs.main_run(
          f'captioning_fmnist.py:{arm},scenes', workdir,
          *runs.seeded(seed, args.steps), f'--config.pp.test={args.test}',
          *flags[arm])
      results[arm].append(result)
      print(f'seed {seed} {arm}: ' + ', '.join(
          f'{k} {result[k]:.4f}' for _, k in METRICS) +
            f', {result["seconds_since_start"]:.0f} s', flush=True)
  if args.seed is not None:
    return
  print(f'\n{args.seeds} seeds, mean +- s.e.; {args.steps} steps at batch '
        f'128, {args.test}.\n')
  names = ' | '.join(name for name, _ in METRICS)
  print(f'| arm | {names} | LM tokens per image | run s |')
  print('|---|' + '---|' * (len(METRICS) + 2))
  for arm, rs in results.items():
    cells = [runs.mean_se([r[key] for r in rs]) for _, key in METRICS]
    seconds = np.mean([r['seconds_since_start'] for r in rs])
    tokens = lm_tokens(os.path.join(args.out, '0', arm))
    print(f'| `{arm}`: {ARMS[arm]} | {" | ".join(cells)} | {tokens} | '
          f'{seconds:.0f} |')
  for arm, rs in results.items():
    print(f'\n{arm}, seed 0:')
    for sample in rs[0]['samples'][:4]:
      print(f'  {sample["caption"]!r} (reference: {sample["reference"]!r})')


if __name__ == '__main__':
  main()
