"""Command line: `python -m vit_jax.main --config=configs/vit.py:b16,cifar10
--workdir=DIR [--config.base_lr=0.01 ...]`."""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging
from etils import epy
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import launch
from vit_jax import run_config

with epy.lazy_imports():  # seconds to import: only once the config is good
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

FLAGS = flags.FLAGS
HELD = []  # --config.model.* flags parsed against a preset's model
config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file (path[:argument]).',
    lock_config=True)
flags.DEFINE_string('workdir', None, 'Checkpoints and TensorBoard events.')
flags.DEFINE_bool('distributed', False,
                  'Call jax.distributed.initialize() (multi-host runs); with no'
                  ' flags below, the cluster is detected (TPU VMs, SLURM, Open'
                  ' MPI, Kubernetes).')
flags.DEFINE_string('coordinator_address', None,
                    'HOST:PORT of process 0 (explicit multi-host setups).')
flags.DEFINE_integer('num_processes', None, 'Processes in the run.')
flags.DEFINE_integer('process_id', None, 'This process, 0..num_processes-1.')
flags.DEFINE_integer('heartbeat_timeout', 100,
                     'Seconds without heartbeats after which a process counts '
                     'as lost and every other process stops with an error.')
flags.DEFINE_bool('allow_config_change', False,
                  'Resume a workdir although the model, data or schedule '
                  'differ from those it recorded (config.json).')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.distributed:
    jax.distributed.initialize(
        coordinator_address=FLAGS.coordinator_address,
        num_processes=FLAGS.num_processes, process_id=FLAGS.process_id,
        heartbeat_timeout_seconds=FLAGS.heartbeat_timeout)
  logging.info('JAX process %d/%d, devices %s', jax.process_index(),
               jax.process_count(), jax.devices())
  # A preset named on the command line brings its model, the checkpoint's
  # record its settings; given flags win over both.
  config = run_config.resolve(
      FLAGS.config, config_flags.get_override_values(FLAGS['config']), HELD)
  # Every check that needs only the config and the devices, before the
  # data stack (TensorFlow) loads.
  mesh = launch.check(config)
  tf.config.set_visible_devices([], 'GPU')  # TF only feeds data
  launch.train_and_evaluate(config, FLAGS.workdir, mesh=mesh,
                            allow_config_change=FLAGS.allow_config_change)


if __name__ == '__main__':
  sys.argv, HELD = run_config.held_model_flags(sys.argv)
  cli.run(main, config_flag='config')
