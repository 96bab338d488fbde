r"""How Swin-T and ViT-S/16 grow with the image: FLOPs and forward time.

For each model and side (224, 448, 896 px): the patches, GFLOP per image
of the inference forward from XLA's `cost_analysis`, the analytic count of
the matmuls (2 x multiply-adds; norms, softmax and GELU left out) to see
how much of the work XLA counts, and the median forward time per image.
The calls are interleaved round by round (the machine may be shared), and
each timing is the median over the rounds.

  python benchmarks/swin_scaling.py --rounds=5 --batch=1

Random float32 parameters; the numbers are in docs/swin.md.
"""

import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import models

flags.DEFINE_list('sizes', ['224', '448', '896'], 'Image sides.')
flags.DEFINE_list('models', ['Swin-T', 'ViT-S_16'], 'Presets.')
flags.DEFINE_integer('rounds', 5, 'Timed calls of each (model, side).')
flags.DEFINE_integer('batch', 1, 'Images per call.')
FLAGS = flags.FLAGS


def analytic_gflops(name, side):
  """2 x the multiply-adds of the matmuls (and the patch projection)."""
  config = models.MODEL_CONFIGS[name]
  if name.startswith('Swin-'):
    n, c, m2 = (side // config.patch_size)**2, config.embed_dim, (
        config.window_size**2)
    macs = n * 3 * config.patch_size**2 * c
    for i, depth in enumerate(config.depths):
      if i:  # merging: n / 4 tokens of 4c -> 2c
        macs += n // 4 * 4 * c * 2 * c
        n, c = n // 4, 2 * c
      window = min(m2, n)
      macs += depth * (12 * n * c * c + 2 * n * window * c)
    return 2 * macs / 1e9
  d, patch = config.hidden_size, config.patches.size[0]
  n = (side // patch)**2 + 1
  layers, mlp = config.transformer.num_layers, config.transformer.mlp_dim
  macs = (n - 1) * 3 * patch**2 * d + layers * (
      4 * n * d * d + 2 * n * d * mlp + 2 * n * n * d)
  return 2 * macs / 1e9


def xla_flops(compiled):
  costs = compiled.cost_analysis()
  costs = costs[0] if isinstance(costs, (list, tuple)) else costs
  return costs.get('flops', float('nan'))


def prepare(name, side, batch):
  """(compiled forward, its arguments, XLA's GFLOP per image)."""
  model = models.get_model(name, num_classes=1000)
  x = jnp.asarray(np.random.default_rng(0).uniform(
      -1, 1, (batch, side, side, 3)), jnp.float32)
  params = jax.jit(lambda: model.init(jax.random.key(0), x[:1],
                                      train=False))()
  forward = jax.jit(lambda p, x: model.apply(p, x, train=False))
  compiled = forward.lower(params, x).compile()
  compiled(params, x).block_until_ready()  # warm-up
  return compiled, (params, x), xla_flops(compiled) / batch / 1e9


def main(argv):
  del argv
  cases = [(n, int(s)) for n in FLAGS.models for s in FLAGS.sizes]
  prepared = {c: prepare(*c, FLAGS.batch) for c in cases}
  times = {c: [] for c in cases}
  for _ in range(FLAGS.rounds):
    for case in cases:  # interleaved: a busy spell hits every case
      compiled, args, _ = prepared[case]
      start = time.perf_counter()
      compiled(*args).block_until_ready()
      times[case].append((time.perf_counter() - start) / FLAGS.batch)
  print(f'{jax.devices()[0].device_kind}, batch {FLAGS.batch}, '
        f'{FLAGS.rounds} rounds, medians')
  print('| model | side | patches | GFLOP/img (XLA) | GFLOP/img (matmuls) '
        '| ms/img |')
  print('|---|---|---|---|---|---|')
  for name, side in cases:
    config = models.MODEL_CONFIGS[name]
    patch = config.get('patch_size') or config.patches.size[0]
    print(f'| {name} | {side} | {(side // patch)**2} | '
          f'{prepared[name, side][2]:.2f} | {analytic_gflops(name, side):.2f} '
          f'| {1e3 * np.median(times[name, side]):.0f} |')


if __name__ == '__main__':
  app.run(main)
