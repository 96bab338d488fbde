r"""What bf16, remat and scan cost or save: compiled temp memory, compile time
and step time of one gradient step of a ViT, each variant side by side.

  python benchmarks/memory.py --model=ViT-B_16 --layers=4 --batch=8 --size=224
"""

import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints import files
from vit_jax import models

flags.DEFINE_string('model', 'ViT-B_16', 'Model preset.')
flags.DEFINE_integer('layers', 4, 'Encoder blocks (fewer than the preset '
                     'keeps a CPU run short).')
flags.DEFINE_integer('batch', 8, 'Images per step.')
flags.DEFINE_integer('size', 224, 'Image side.')
flags.DEFINE_integer('steps', 3, 'Timed steps.')
FLAGS = flags.FLAGS

VARIANTS = [  # (dtype, remat_policy, scan)
    ('float32', 'none', False), ('float32', 'full', False),
    ('float32', 'none', True), ('float32', 'full', True),
    ('float32', 'dots', True), ('bfloat16', 'none', False),
    ('bfloat16', 'full', True)]


def _model(dtype, remat_policy, scan):
  config = models.MODEL_CONFIGS[FLAGS.model]
  return models.get_model(FLAGS.model, num_classes=1000, dtype=dtype,
                          transformer=dict(config.transformer,
                                           num_layers=FLAGS.layers,
                                           remat_policy=remat_policy,
                                           scan=scan))


def _step(model):
  def loss(params, images, labels):
    logits = model.apply({'params': params}, images, train=False)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))
  return jax.jit(jax.value_and_grad(loss))


def main(_):
  shape = (FLAGS.batch, FLAGS.size, FLAGS.size, 3)
  images = jnp.asarray(np.random.uniform(-1, 1, shape), jnp.float32)
  labels = jax.nn.one_hot(np.arange(FLAGS.batch) % 1000, 1000)
  print(f'{FLAGS.model} with {FLAGS.layers} blocks, batch {FLAGS.batch}, '
        f'{FLAGS.size} px, {jax.devices()[0].device_kind}:')
  print('| dtype | remat | scan | temp memory (MB) | compile (s) | step (s) |')
  print('|---|---|---|---|---|---|')
  for dtype, policy, scan in VARIANTS:
    model = _model(dtype, policy, scan)
    params = model.init(jax.random.key(0), images[:1], train=False)['params']
    if not scan:  # init a scanned model once, the rest from its stack
      unrolled = params
    else:
      params = files.scan_like(unrolled, params)
    start = time.perf_counter()
    compiled = _step(model).lower(params, images, labels).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(params, images, labels))
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
      out = compiled(params, images, labels)
    jax.block_until_ready(out)
    step_s = (time.perf_counter() - start) / FLAGS.steps
    temp = compiled.memory_analysis().temp_size_in_bytes / 1e6
    print(f'| {dtype} | {policy} | {scan} | {temp:.0f} | {compile_s:.1f} | '
          f'{step_s:.2f} |', flush=True)


if __name__ == '__main__':
  app.run(main)
