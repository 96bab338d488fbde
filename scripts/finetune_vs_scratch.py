r"""Fine-tuned vs from scratch on MNIST-5k (configs/finetune_mnist5k.py), over
a small learning-rate sweep as the paper does; prints a table.

  python scripts/finetune_vs_scratch.py --pretrained_dir=/tmp/vit_default \
      --workdir=/tmp/ft_sweep
"""

import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import tensorflow as tf

from vit_jax.configs import finetune_mnist5k
from vit_jax import launch

flags.DEFINE_string('pretrained_dir', None, 'Workdir of the default job.',
                    required=True)
flags.DEFINE_string('workdir', None, 'One sub-folder per run.', required=True)
flags.DEFINE_list('lrs', ['0.01', '0.03', '0.1'], 'Base learning rates.')
FLAGS = flags.FLAGS


def main(_):
  tf.config.set_visible_devices([], 'GPU')
  logging.set_verbosity(logging.WARNING)
  table = {}
  for init in ('pretrained', 'scratch'):
    for lr in FLAGS.lrs:
      config = finetune_mnist5k.get_config().unlock()
      config.base_lr = float(lr)
      if init == 'pretrained':
        config.pretrained_dir = FLAGS.pretrained_dir
      workdir = os.path.join(FLAGS.workdir, f'{init}_lr{lr}')
      launch.train_and_evaluate(config.lock(), workdir)
      with open(os.path.join(workdir, 'results.json')) as f:
        table[init, lr] = json.load(f)['accuracy']
  print('| init | ' + ' | '.join(f'lr {lr}' for lr in FLAGS.lrs) + ' |')
  print('|---|' + '---|' * len(FLAGS.lrs))
  for init in ('pretrained', 'scratch'):
    print(f'| {init} | ' + ' | '.join(f'{table[init, lr]:.1%}'
                                      for lr in FLAGS.lrs) + ' |')


if __name__ == '__main__':
  app.run(main)
