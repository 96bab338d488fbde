"""`trainer='inference_time'`: times the jitted forward pass (img/s).

As in the original, a quick way to compare models at a resolution without
data: random images of `pp.crop` pixels, `batch_eval` per step, on the mesh.
"""

import time

from etils import epy
import jax
import jax.numpy as jnp

from vit_jax.platform import sharding
from vit_jax.tasks import base
from vit_jax.tasks import classification
from vit_jax.tasks import registry

with epy.lazy_imports():  # its TensorBoard writer loads TensorFlow
  from clu import metric_writers  # pylint: disable=g-import-not-at-top


def inference_time(config, workdir: str, num_classes: int = 1000,
                   steps: int = 10, mesh=None) -> float:
  """Returns and logs the forward-pass throughput in images per second."""
  mesh = mesh or sharding.make_mesh(config.mesh)
  model = classification.make_model(config, num_classes)
  shape = (config.batch_eval, config.pp.crop, config.pp.crop, 3)
  images = jax.device_put(jnp.zeros(shape), sharding.batch_sharding(mesh))
  params = jax.jit(lambda x: model.init(jax.random.key(0), x[:1],
                                        train=False)['params'])(images)
  params = jax.device_put(params, sharding.tree_shardings(
      params, mesh, config.sharding_rules, config.sharding_strategy))
  forward = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))
  jax.block_until_ready(forward(params, images))  # compile
  start = time.perf_counter()
  for _ in range(steps):
    out = forward(params, images)
  jax.block_until_ready(out)
  img_s = steps * shape[0] / (time.perf_counter() - start)
  print(f'{config.model_name} at {shape[1]}x{shape[2]}, batch {shape[0]}: '
        f'{img_s:.1f} img/s', flush=True)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  writer.write_scalars(0, {'inference_img_per_sec': img_s})
  writer.flush()
  return img_s


@registry.register
class Task(base.Task):
  """Times the forward pass instead of training (no data, no optimizer)."""

  trainers = ('inference_time',)
  standalone = True

  def __init__(self, config, workdir, mesh, *, training=True):
    del workdir, training
    self.config, self.mesh = config, mesh

  @classmethod
  def check_config(cls, config, data_devices):
    del config, data_devices  # no training settings to check

  def run(self, workdir):
    return inference_time(self.config, workdir, mesh=self.mesh)
