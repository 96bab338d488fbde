r"""Training throughput (img/s) of a config: the jitted step alone on synthetic
data, and the input pipeline alone.

  python benchmarks/train_throughput.py --config=configs/default.py
"""

import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from flax.training import train_state
import jax
import jax.numpy as jnp
from ml_collections import config_flags
import numpy as np
import optax
import tensorflow as tf

from vit_jax import models
from vit_jax.data import pipeline
from vit_jax.run import optim
from vit_jax.platform import sharding

config_flags.DEFINE_config_file('config', 'configs/default.py', 'Config.',
                                lock_config=True)
flags.DEFINE_integer('steps', 50, 'Timed steps.')
flags.DEFINE_bool('pipeline', True, 'Also time the input pipeline.')
FLAGS = flags.FLAGS


def train_step(state, batch, loss):
  """A training step as tasks/classification.py's: dropout on, the config's
  loss."""
  rng = jax.random.fold_in(jax.random.key(0), state.step)

  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': rng})
    if loss == 'sigmoid_xent':
      return optax.sigmoid_binary_cross_entropy(logits, batch['label']).sum(
          -1).mean()
    return optax.softmax_cross_entropy(logits, batch['label']).mean()

  value, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


def _time(fn, steps):
  fn()  # compile / warm up
  t = time.perf_counter()
  for _ in range(steps):
    out = fn()
  jax.block_until_ready(out)
  return time.perf_counter() - t


def main(_):
  tf.config.set_visible_devices([], 'GPU')
  config = FLAGS.config
  mesh = sharding.make_mesh(config.mesh)
  micro = config.batch // config.accum_steps
  model = models.model_class(config.model_name)(num_classes=10,
                                                **config.model)
  tx = optim.make_optimizer(config)
  shape = (micro, config.pp.crop, config.pp.crop, 3)
  params = model.init(jax.random.key(0), jnp.zeros((1,) + shape[1:]),
                      train=False)['params']
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                       tx=tx)
  # As in training: every argument placed on the mesh (mixing placements
  # makes XLA copy the state every step).
  state = jax.device_put(state, sharding.tree_shardings(
      state, mesh, config.sharding_rules))
  data = sharding.batch_sharding(mesh)
  batch = {'image': jax.device_put(np.random.uniform(-1, 1, shape)
                                   .astype(np.float32), data),
           'label': jax.device_put(np.eye(10, dtype=np.float32)[
               np.random.randint(0, 10, micro)], data)}
  step = jax.jit(lambda s, b: train_step(s, b, config.loss),
                 donate_argnums=0)
  holder = [state]

  def run():
    holder[0], m = step(holder[0], batch)
    return m['loss']

  n = sum(x.size for x in jax.tree.leaves(params))
  secs = _time(run, FLAGS.steps)
  print(f'{config.model_name}: {n:,} params, micro-batch {micro}, '
        f'{jax.device_count()} {jax.devices()[0].platform} device(s): '
        f'train step {FLAGS.steps * micro / secs:.0f} img/s')
  if FLAGS.pipeline:
    info = pipeline.dataset_info(
        pipeline.get_builder(config), config)
    it = pipeline.train_iterator(info, config, batch_size=micro)
    secs = _time(lambda: next(it), FLAGS.steps)
    print(f'input pipeline {FLAGS.steps * micro / secs:.0f} img/s')


if __name__ == '__main__':
  app.run(main)
