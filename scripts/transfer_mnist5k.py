r"""The small transfer table: the default job's ViT on MNIST-5k, fine-tuned and
few-shot, against no pretraining; several seeds; prints the markdown table.

Fine-tuning: configs/finetune_mnist5k.py (42 px, 500 steps) from the
pretrained checkpoint, and the same budget from scratch. Few-shot: the
frozen pre-logits at the pretraining resolution (28 px), of the pretrained
model and of randomly initialized ones (one per seed). Workdirs that already
hold a results.json are kept.

  python scripts/transfer_mnist5k.py --pretrained_dir=/tmp/vit_default \
      --workdir=/tmp/transfer --seeds=3
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import jax
import tensorflow as tf

from vit_jax.configs import default
from vit_jax.configs import finetune_mnist5k
from scripts import collect_results
from vit_jax import launch
from vit_jax.run import loop
from vit_jax.tasks import classification

flags.DEFINE_string('pretrained_dir', None, 'Workdir of the default job.',
                    required=True)
flags.DEFINE_string('workdir', None, 'One sub-folder per run.', required=True)
flags.DEFINE_integer('seeds', 3, 'Runs per setting (seeds 0 .. seeds-1).')
flags.DEFINE_float('base_lr', 0.1, 'Fine-tuning learning rate (the best of '
                   'scripts/finetune_vs_scratch.py).')
FLAGS = flags.FLAGS
PRETRAINED, NONE = 'fmnist_pretrained', 'no_pretraining'


def _done(workdir):
  return os.path.exists(os.path.join(workdir, 'results.json'))


def finetune(seed, pretrained):
  workdir = os.path.join(FLAGS.workdir, PRETRAINED if pretrained else NONE,
                         f'finetune_s{seed}')
  if not _done(workdir):
    config = finetune_mnist5k.get_config().unlock()
    config.seed, config.base_lr = seed, FLAGS.base_lr
    if pretrained:
      config.pretrained_dir = FLAGS.pretrained_dir
    launch.train_and_evaluate(config.lock(), workdir)
  return workdir


def fewshot_config(seed):
  config = default.get_config().unlock()
  config.trainer, config.seed = 'fewshot', seed
  config.evals.fewshot.dataset = 'mnist5k'
  return config


def fewshot_pretrained():
  workdir = os.path.join(FLAGS.workdir, PRETRAINED, 'fewshot')
  if not _done(workdir):
    config = fewshot_config(0)
    config.pretrained_dir = FLAGS.pretrained_dir
    launch.evaluate(config.lock(), workdir)
  return workdir


def fewshot_random_init(seed):
  """Few-shot of a random init: its parameters exported, then evaluated."""
  workdir = os.path.join(FLAGS.workdir, NONE, f'fewshot_s{seed}')
  if not _done(workdir):
    config = fewshot_config(seed)
    model = classification.make_model(config, 10)
    params = model.init(jax.random.key(seed), jax.numpy.zeros(
        (1, config.pp.crop, config.pp.crop, 3)), train=False)['params']
    path = os.path.join(workdir, 'init', f'{config.model_name}.npz')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    loop.export_npz(params, path)
    config.pretrained_path = path
    launch.evaluate(config.lock(), workdir)
  return workdir


def main(_):
  tf.config.set_visible_devices([], 'GPU')
  logging.set_verbosity(logging.WARNING)
  workdirs = [fewshot_pretrained()]
  for seed in range(FLAGS.seeds):
    workdirs += [finetune(seed, True), finetune(seed, False),
                 fewshot_random_init(seed)]
  print(collect_results.table(collect_results.read_runs(workdirs), 'parent'))


if __name__ == '__main__':
  app.run(main)
