r"""Per-device temporaries of SigLIP's loss and its gradient: chunked over
the devices (`losses.sigmoid_loss_chunked`) against all-gathered
(`losses.sigmoid_loss` under jit on sharded embeddings).

Compiled, not run: XLA's `memory_analysis()` of the program of one device.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python benchmarks/siglip_loss_memory.py
  python benchmarks/siglip_loss_memory.py --topology=v5e:16x16 --batch=32768
  python benchmarks/siglip_loss_memory.py --topology=v5p:8x8x16 \
      --batch=1048576

(`pip install -e '.[tpu]'` for the TPU topologies, compiled here by libtpu.)
"""

import argparse
import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

from vit_jax import losses
from vit_jax import tpu_slices


def temporaries(loss, mesh, batch, width):
  """Bytes of temporaries per device of value_and_grad(loss)."""
  rows = NamedSharding(mesh, P('data'))
  scalar = NamedSharding(mesh, P())
  shapes = (jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=rows),
            jax.ShapeDtypeStruct((batch, width), jnp.float32, sharding=rows),
            jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar),
            jax.ShapeDtypeStruct((), jnp.float32, sharding=scalar))
  step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
  compiled = step.lower(*shapes).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--topology', help='a TPU slice, e.g. v5e:16x16')
  parser.add_argument('--batch', type=int, nargs='+',
                      default=[1024, 4096, 16384])
  parser.add_argument('--width', type=int, default=768)
  args = parser.parse_args()
  devices = (tpu_slices.topology_devices(args.topology) if args.topology
             else jax.devices())
  mesh = Mesh(np.array(devices), ('data',))
  where = args.topology or f'{len(devices)} {devices[0].platform} devices'
  print(f'{where}, embeddings {args.width} wide, float32; temporaries per '
        'device of the loss and its gradient:')
  print('| global batch | all-gathered | chunked | ratio |')
  print('|---|---|---|---|')
  chunked = functools.partial(losses.sigmoid_loss_chunked, mesh=mesh)
  for batch in args.batch:
    gathered_bytes = temporaries(losses.sigmoid_loss, mesh, batch, args.width)
    chunked_bytes = temporaries(chunked, mesh, batch, args.width)
    print(f'| {batch:,} | {gathered_bytes / 2**20:,.1f} MiB | '
          f'{chunked_bytes / 2**20:,.1f} MiB | '
          f'{gathered_bytes / max(chunked_bytes, 1):.1f}x |', flush=True)


if __name__ == '__main__':
  main()
