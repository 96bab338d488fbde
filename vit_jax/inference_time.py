"""`trainer='inference_time'`: times the jitted forward pass (img/s).

As in the original, a quick way to compare models at a resolution without
data: random images of `pp.crop` pixels, `batch_eval` per step, on the mesh.
"""

import time

from clu import metric_writers
import jax
import jax.numpy as jnp

from vit_jax.run import sharding
from vit_jax.tasks import classification


def inference_time(config, workdir: str, num_classes: int = 1000,
                   steps: int = 10) -> float:
  """Returns and logs the forward-pass throughput in images per second."""
  mesh = sharding.make_mesh(config.mesh)
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
