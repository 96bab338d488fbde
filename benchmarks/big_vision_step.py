r"""A user's ViT training step beside big_vision's, compiled for a TPU slice.

Both steps are the same user code: the model's `apply` with `train=True`,
softmax cross-entropy on integer labels, `optax.adamw(1e-3)`, parameters
and optimizer state replicated and donated, the batch sharded over a
`data` axis of every chip. vit_jax's model is `models.get_model(NAME,
num_classes=1000, dtype=...)`, with its implementations chosen as a TPU
process chooses them; big_vision's is `models/vit.py` with `pool_type='tok'`
and `dtype_mm`. Prints, per chip, what the TPU compiler reports: arguments,
temporaries, FLOPs and HBM bytes (docs/performance.md).

Needs the `tpu` extra, and big_vision's source (not installed: its folder
is put on `sys.path`) with `einops`:

  python benchmarks/big_vision_step.py --big_vision=/path/to/big_vision \
      --model=ViT-B_16 --topology=v5e:2x2 --batch=256 --dtype=bfloat16
"""

import argparse
import sys
import time

import numpy as np

VARIANTS = {'ViT-Ti_16': 'Ti/16', 'ViT-S_16': 'S/16', 'ViT-B_16': 'B/16',
            'ViT-B_32': 'B/32', 'ViT-L_16': 'L/16', 'ViT-H_14': 'H/14'}


def parse():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--big_vision', default=None,
                      help="big_vision's checkout (the folder holding the "
                      '`big_vision` package); without it, vit_jax alone')
  parser.add_argument('--model', default='ViT-B_16', choices=list(VARIANTS))
  parser.add_argument('--depth', type=int, default=None,
                      help='fewer blocks than the preset (quick looks)')
  parser.add_argument('--topology', default='v5e:2x2')
  parser.add_argument('--batch', type=int, default=256, help='global batch')
  parser.add_argument('--image', type=int, default=224)
  parser.add_argument('--dtype', default='bfloat16',
                      choices=('bfloat16', 'float32'))
  parser.add_argument('--fsdp', action='store_true',
                      help="shard parameters and optimizer state over "
                      "`data` (vit_jax's 'fsdp' strategy, for both)")
  parser.add_argument('--hlo', default=None,
                      help='write each compiled program to HLO.{name}.txt')
  return parser.parse_args()


def vit_jax_model(args):
  import jax.numpy as jnp
  from vit_jax import models
  preset = models.MODEL_CONFIGS[args.model]
  transformer = dict(preset.transformer)
  if args.depth:
    transformer['num_layers'] = args.depth
  return models.get_model(args.model, num_classes=1000,
                          dtype=jnp.dtype(args.dtype),
                          transformer=transformer)


def big_vision_model(args):
  sys.path.insert(0, args.big_vision)
  from big_vision.models import vit  # pylint: disable=import-outside-toplevel
  depth = {'depth': args.depth} if args.depth else {}
  return vit.Model(num_classes=1000, variant=VARIANTS[args.model],
                   pool_type='tok', dtype_mm=args.dtype, **depth)


def compile_step(model, args, mesh):
  """The compiled step of `model`: (compiled, seconds to compile)."""
  import jax
  import jax.numpy as jnp
  import optax
  from jax.sharding import NamedSharding, PartitionSpec as P
  from vit_jax.platform import sharding
  tx = optax.adamw(1e-3)
  images = jax.ShapeDtypeStruct((args.batch, args.image, args.image, 3),
                                jnp.float32)
  labels = jax.ShapeDtypeStruct((args.batch,), jnp.int32)

  def loss_fn(params, x, y, key):
    out = model.apply({'params': params}, x, train=True,
                      rngs={'dropout': key})
    logits = out[0] if isinstance(out, tuple) else out  # big_vision: (x, out)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  def step(params, opt_state, x, y, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  params = jax.eval_shape(
      lambda: model.init(jax.random.key(0), jnp.zeros((1, args.image,
                                                       args.image, 3)),
                         train=False)
  )['params']
  state = (params, jax.eval_shape(tx.init, params))
  strategy = 'fsdp' if args.fsdp else 'replicate'
  state_shardings = sharding.tree_shardings(state, mesh, (), strategy)
  data = NamedSharding(mesh, P('data'))
  replicated = NamedSharding(mesh, P())
  jitted = jax.jit(step, in_shardings=(*state_shardings, data, data,
                                       replicated),
                   out_shardings=(*state_shardings, replicated),
                   donate_argnums=(0, 1))
  key = jax.eval_shape(lambda: jax.random.key(0))
  t = time.perf_counter()
  compiled = jitted.lower(*state, images, labels, key).compile()
  return compiled, time.perf_counter() - t


def report(name, compiled, seconds):
  memory = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  gib = 2.0**30
  print(f'{name:10s} arguments {memory.argument_size_in_bytes / gib:6.2f} GiB'
        f'  temporaries {memory.temp_size_in_bytes / gib:6.2f} GiB'
        f'  FLOPs {cost["flops"] / 1e12:6.2f} T'
        f'  HBM bytes {cost["bytes accessed"] / 1e9:6.1f} GB'
        f'  (compiled in {seconds:.0f} s)', flush=True)
  return memory.temp_size_in_bytes, cost['bytes accessed']


def main():
  args = parse()
  import jax  # pylint: disable=import-outside-toplevel
  from vit_jax import plan  # pylint: disable=import-outside-toplevel
  from vit_jax.platform import target  # pylint: disable=import-outside-toplevel
  devices = plan.topology_devices(args.topology)
  mesh = jax.sharding.Mesh(np.array(devices), ('data',))
  print(f'{args.model}{f" depth {args.depth}" if args.depth else ""}, '
        f'{args.dtype}, global batch {args.batch} at {args.image} px, '
        f'{"FSDP" if args.fsdp else "replicated"} on {args.topology} '
        f'({len(devices)} chips); per chip:', flush=True)
  figures = {}
  models = [('vit_jax', vit_jax_model)]
  if args.big_vision:
    models.insert(0, ('big_vision', big_vision_model))
  for name, make in models:
    with target.compiling_for(devices):  # as a TPU process traces it
      compiled, seconds = compile_step(make(args), args, mesh)
    figures[name] = report(name, compiled, seconds)
    if args.hlo:
      with open(f'{args.hlo}.{name}.txt', 'w') as f:
        f.write(compiled.as_text())
  if len(figures) == 2:
    (t0, b0), (t1, b1) = figures['big_vision'], figures['vit_jax']
    print(f'vit_jax / big_vision: temporaries {t1 / t0:.3f}x, HBM bytes '
          f'{b1 / b0:.3f}x')


if __name__ == '__main__':
  main()
