"""Device mesh and sharding rules given as config data.

A rule is `(regex, spec)`: the first regex that `re.search`es a leaf's
'/'-joined path (e.g. 'params/Transformer/encoderblock_0/MlpBlock_0/Dense_0/
kernel', or the same path inside the optimizer state) gives its
PartitionSpec. Leaves no rule matches follow the strategy: 'replicate' copies
them to every device; 'fsdp' splits each large leaf over the `data` axis
(`fsdp_spec`), as big_vision's `fsdp` strategy.
"""

import math
import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

STRATEGIES = ('replicate', 'fsdp')
# Leaves with fewer elements stay replicated under 'fsdp': biases and norm
# scales weigh little, and gathering them at every step would cost more
# latency than the memory they take.
FSDP_MIN_SIZE = 2**12


def make_mesh(axes: Sequence, devices=None) -> Mesh:
  """A mesh from `[(name, size), ...]`; one size may be -1 (all the rest)."""
  devices = list(jax.devices() if devices is None else devices)
  names = tuple(name for name, _ in axes)
  sizes = [int(size) for _, size in axes]
  if 'data' not in names:
    raise ValueError(f'The mesh needs a `data` axis, got axes {names}.')
  known = math.prod(s for s in sizes if s != -1)
  if sizes.count(-1) > 1 or len(devices) % known:
    raise ValueError(f'Mesh axes {list(axes)} do not fit {len(devices)} '
                     'devices.')
  sizes = [len(devices) // known if s == -1 else s for s in sizes]
  if math.prod(sizes) != len(devices):
    raise ValueError(f'Mesh axes {dict(zip(names, sizes))} use '
                     f'{math.prod(sizes)} devices, but there are '
                     f'{len(devices)}.')
  if any(getattr(d, 'core_on_chip', 0) for d in devices):
    # A TPU's cores as devices of their own (libtpu's v4 slices described
    # for compiling): jax's TPU layout wants one device a chip.
    return Mesh(np.asarray(devices).reshape(sizes), names,
                axis_types=(AxisType.Auto,) * len(names))
  return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names),
                       devices=devices)


def fsdp_spec(shape, axis_size: int, min_size: int = FSDP_MIN_SIZE) -> P:
  """Splits the largest dim divisible by `axis_size` over the `data` axis.

  Leaves under `min_size` elements, or with no divisible dim, are replicated.
  Among dims of equal size the first is split. Optimizer-state leaves have
  their parameter's shape, hence its spec.
  """
  if axis_size <= 1 or math.prod(shape) < min_size:
    return P()
  for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
    if shape[dim] % axis_size == 0:
      return P(*(None,) * dim, 'data')
  return P()


def tree_shardings(tree, mesh: Mesh, rules=(), strategy: str = 'replicate'):
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs).

  A matching rule wins; other leaves follow `strategy` (see module doc).
  """
  if strategy not in STRATEGIES:
    raise ValueError(f'Unknown sharding strategy {strategy!r}; expected one '
                     f'of {STRATEGIES}.')
  compiled = [(re.compile(regex), P(*spec)) for regex, spec in rules]

  def sharding(key_path, leaf):
    path = jax.tree_util.keystr(key_path, simple=True, separator='/')
    for regex, spec in compiled:
      if regex.search(path) and len(spec) <= np.ndim(leaf):
        return NamedSharding(mesh, spec)
    if strategy == 'fsdp':
      return NamedSharding(mesh, fsdp_spec(np.shape(leaf), mesh.shape['data']))
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(sharding, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split on their leading axis over the `data` axis."""
  return NamedSharding(mesh, P('data'))


def process_rows(mesh: Mesh, batch: int) -> list:
  """The rows of a global batch that this process's devices hold."""
  shards = batch_sharding(mesh).addressable_devices_indices_map((batch,))
  return sorted({row for index in shards.values()
                 for row in range(*index[0].indices(batch))})


def global_batches(batches, mesh: Mesh, batch_size: int):
  """Host batches -> global arrays of `batch_size` rows split over `data`."""
  data = batch_sharding(mesh)
  for batch in batches:
    yield jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        data, x, (batch_size,) + x.shape[1:]), batch)
