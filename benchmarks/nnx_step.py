r"""A training step of a preset as Linen code and as NNX code (docs/nnx.md).

Both steps: the model with `train=True` (dropout from the same stream
name), softmax cross-entropy on integer labels, `optax.adamw(1e-3)`. The
Linen step is `jax.jit` of `model.apply` with parameters and optimizer
state donated; the NNX step is `nnx.jit` of `vit_jax.nnx.to_nnx`'s module
with `nnx.Optimizer` (`vit_nnx.optimizer`, `vit_nnx.update`), called as it
is and through `nnx.cached_partial` (flax 0.11 on), which skips walking the
module's graph at each call. Prints the median time of a step of each,
after one step that compiles:

  python benchmarks/nnx_step.py --model=ViT-Ti_16 --batch=8 --size=64
"""

import argparse
import statistics
import time

import jax
import numpy as np
import optax
from flax import nnx

from vit_jax import models
from vit_jax import nnx as vit_nnx


def parse():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model', default='ViT-Ti_16')
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--size', type=int, default=64)
  parser.add_argument('--steps', type=int, default=20)
  return parser.parse_args()


def _loss(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def linen_step(model, tx):
  def step(params, opt_state, key, x, labels):
    loss, grads = jax.value_and_grad(lambda p: _loss(model.apply(
        {'params': p}, x, train=True, rngs={'dropout': key}), labels))(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return jax.jit(step, donate_argnums=(0, 1))


@nnx.jit
def nnx_step(module, opt, x, labels):
  loss, grads = nnx.value_and_grad(
      lambda m: _loss(m(x, train=True), labels))(module)
  vit_nnx.update(opt, module, grads)
  return loss


def _median(run, steps):
  """Median seconds of `run()` (which blocks), after one compiling call."""
  run()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def main():
  args = parse()
  model = models.get_model(args.model, num_classes=10)
  rng = np.random.RandomState(0)
  x = rng.randn(args.batch, args.size, args.size, 3).astype(np.float32)
  labels = rng.randint(0, 10, args.batch)
  params = model.init(jax.random.key(0), x, train=False)['params']
  tx = optax.adamw(1e-3)

  state = [jax.tree.map(np.array, params), None]
  state[1] = tx.init(state[0])
  step, keys = linen_step(model, tx), iter(jax.random.split(
      jax.random.key(1), args.steps + 1))
  def run_linen():
    state[0], state[1], loss = step(*state, next(keys), x, labels)
    loss.block_until_ready()

  module = vit_nnx.to_nnx(model, jax.tree.map(np.array, params),
                          rngs=nnx.Rngs(dropout=1))
  opt = vit_nnx.optimizer(module, tx)
  run_nnx = lambda: nnx_step(module, opt, x, labels).block_until_ready()
  cached = nnx.cached_partial(nnx_step, module, opt)
  run_cached = lambda: cached(x, labels).block_until_ready()

  linen_s = _median(run_linen, args.steps)
  print(f'{args.model}, batch {args.batch} at {args.size} px on '
        f'{jax.devices()[0].platform}: Linen {1e3 * linen_s:.1f} ms a step')
  for name, run in (('NNX', run_nnx), ('NNX, cached_partial', run_cached)):
    took = _median(run, args.steps)
    print(f'{name}: {1e3 * took:.1f} ms ({took / linen_s:.2f}x)')


if __name__ == '__main__':
  main()
