r"""Runs every variant of configs/ablation_posemb.py and prints a table.

  python scripts/posemb_ablation.py --workdir=/tmp/ablation
"""

import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
import tensorflow as tf

from vit_jax.configs import ablation_posemb
from vit_jax import launch

flags.DEFINE_string('workdir', None, 'One sub-folder per variant.',
                    required=True)
flags.DEFINE_list('variants', list(ablation_posemb.VARIANTS), 'Which to run.')
FLAGS = flags.FLAGS


def main(_):
  tf.config.set_visible_devices([], 'GPU')
  logging.set_verbosity(logging.WARNING)
  rows = []
  for variant in FLAGS.variants:
    config = ablation_posemb.get_config(variant)
    workdir = os.path.join(FLAGS.workdir, variant)
    start = time.perf_counter()
    launch.train_and_evaluate(config, workdir)
    with open(os.path.join(workdir, 'results.json')) as f:
      accuracy = json.load(f)['accuracy']
    rows.append((variant, accuracy, time.perf_counter() - start))
  print('| variant | test accuracy | wall time |\n|---|---|---|')
  for variant, accuracy, secs in rows:
    print(f'| {variant} | {accuracy:.2%} | {secs / 60:.1f} min |')


if __name__ == '__main__':
  app.run(main)
