r"""BEiT (both tokenizers) against MAE, DINO and a random-init encoder on
Fashion-MNIST, over seeds; prints the table of docs/self_supervised.md.

  python scripts/beit_fmnist.py --out=/tmp/beit_fmnist --seeds=3

Each seed pretrains the default job's ViT without labels for `--steps`
steps each way: DINO (configs/dino_fmnist.py), MAE (mae_fmnist.py), and
BEiT (beit_fmnist.py) on the codes of a VQ-KD tokenizer and of a dVAE, each
tokenizer trained first for `--steps` steps. The VQ-KD teacher is that
seed's DINO encoder, so that no arm sees a label before evaluation. Every
encoder (and the encoder at initialization) is evaluated the same way on
all 10,000 test images: DINO's weighted k-NN (k = 20, T = 0.07) and 10-shot
linear regression, both with the labeled 10% of the training set
(`train[:10%]`) as memory and shots; then fine-tuned on that 10% for
`--finetune_steps` with layer-wise learning-rate decay 0.65
(beit_fmnist.py:finetune). A finished run is not repeated.
"""

import argparse
import os

import runs

ARMS = (('BEiT, VQ-KD tokenizer', 'beit_vqkd'),
        ('BEiT, dVAE tokenizer', 'beit_dvae'), ('MAE', 'mae'),
        ('DINO', 'dino'), ('random init', 'init'))
LABELED = ['--config.evals.knn.train=train[:10%]',
           '--config.evals.fewshot.train=train[:10%]']


def frozen_results(seed, args):
  """{arm: (its exported encoder, its k-NN and 10-shot results)}: DINO's
  and BEiT's runs end with those evaluators, MAE's encoder and the one at
  initialization are evaluated after."""
  out, seeded = os.path.join(args.out, str(seed)), runs.seeded(seed,
                                                               args.steps)
  found = {'dino': runs.main_run('dino_fmnist.py', f'{out}/dino', *seeded,
                                 *LABELED)}
  teacher = f'{out}/dino/ViT-fmnist.npz'
  for kind in ('vqkd', 'dvae'):
    tokenizer = f'{out}/tokenizer_{kind}'
    runs.main_run(f'beit_fmnist.py:{kind}_tokenizer', tokenizer, *seeded,
                  f'--config.beit.tokenizer.teacher_path={teacher}')
    found[f'beit_{kind}'] = runs.main_run(
        f'beit_fmnist.py:{kind}', f'{out}/beit_{kind}', *seeded, *LABELED,
        f'--config.beit.tokenizer_path={tokenizer}')
  runs.main_run('mae_fmnist.py:pretrain', f'{out}/mae', *seeded)
  runs.initial_encoder(seed, f'{out}/init/ViT-fmnist.npz')
  for arm in ('mae', 'init'):
    found[arm] = runs.main_run(
        'dino_fmnist.py', f'{out}/{arm}_eval', '--config.trainer=evaluate',
        *LABELED, f'--config.pretrained_path={out}/{arm}/ViT-fmnist.npz')
  return {arm: (f'{out}/{arm}/ViT-fmnist.npz', r) for arm, r in found.items()}


def one_seed(seed, args):
  """({arm: (k-NN, 10-shot linear, fine-tuned accuracy)}, {tokenizer kind:
  codebook usage})."""
  out = os.path.join(args.out, str(seed))
  results = {}
  for arm, (path, frozen) in frozen_results(seed, args).items():
    tuned = runs.main_run(
        'beit_fmnist.py:finetune', f'{out}/{arm}_finetune',
        *runs.seeded(seed, args.finetune_steps),
        f'--config.pretrained_path={path}')
    results[arm] = (frozen['knn_accuracy'], frozen['fewshot_10shot'],
                    tuned['accuracy'])
  usage = {kind: runs.main_run(f'beit_fmnist.py:{kind}_tokenizer',
                               f'{out}/tokenizer_{kind}')['codebook_usage']
           for kind in ('vqkd', 'dvae')}
  return results, usage


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', default='/tmp/beit_fmnist')
  parser.add_argument('--seeds', type=int, default=3)
  parser.add_argument('--steps', type=int, default=500)
  parser.add_argument('--finetune_steps', type=int, default=500)
  args = parser.parse_args()
  results = [one_seed(seed, args) for seed in range(args.seeds)]
  print(f'{args.seeds} seeds, mean +- s.e.; {args.steps} pretraining steps, '
        f'{args.finetune_steps} fine-tuning steps.\n')
  print('| encoder | k-NN (k = 20) | 10-shot linear | fine-tuned on 10% | '
        'runs (k-NN / 10-shot / fine-tuned) |')
  print('|---|---|---|---|---|')
  for label, arm in ARMS:
    columns = list(zip(*(r[arm] for r, _ in results)))
    runs_text = '; '.join(' / '.join(f'{x:.4f}' for x in seed)
                          for seed in zip(*columns))
    print(f'| {label} | ' + ' | '.join(runs.mean_se(c) for c in columns) +
          f' | {runs_text} |')
  for kind in ('vqkd', 'dvae'):
    usage = [u[kind] for _, u in results]
    print(f'\n{kind} codebook usage (test images): {runs.mean_se(usage)}')


if __name__ == '__main__':
  main()
