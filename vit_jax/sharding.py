"""Device mesh and sharding rules given as config data.

A rule is `(regex, spec)`: the first regex that `re.search`es a leaf's
'/'-joined path (e.g. 'params/Transformer/encoderblock_0/MlpBlock_0/Dense_0/
kernel', or the same path inside the optimizer state) gives its
PartitionSpec; leaves no rule matches are replicated.
"""

import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P


def make_mesh(axes: Sequence, devices=None) -> Mesh:
  """A mesh from `[(name, size), ...]`; one size may be -1 (all the rest)."""
  devices = np.asarray(jax.devices() if devices is None else devices)
  names = tuple(name for name, _ in axes)
  sizes = [int(size) for _, size in axes]
  if 'data' not in names:
    raise ValueError(f'The mesh needs a `data` axis, got axes {names}.')
  known = int(np.prod([s for s in sizes if s != -1]))
  if sizes.count(-1) > 1 or devices.size % known:
    raise ValueError(f'Mesh axes {list(axes)} do not fit {devices.size} '
                     'devices.')
  sizes = [devices.size // known if s == -1 else s for s in sizes]
  if int(np.prod(sizes)) != devices.size:
    raise ValueError(f'Mesh axes {dict(zip(names, sizes))} use '
                     f'{int(np.prod(sizes))} devices, but there are '
                     f'{devices.size}.')
  return Mesh(devices.reshape(sizes), names,
              axis_types=(AxisType.Auto,) * len(names))


def _path(key_path) -> str:
  parts = []
  for k in key_path:
    for attr in ('key', 'name', 'idx'):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
  return '/'.join(parts)


def tree_shardings(tree, mesh: Mesh, rules=()):
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs)."""
  compiled = [(re.compile(regex), P(*spec)) for regex, spec in rules]

  def sharding(key_path, leaf):
    path = _path(key_path)
    for regex, spec in compiled:
      if regex.search(path) and len(spec) <= np.ndim(leaf):
        return NamedSharding(mesh, spec)
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(sharding, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split on their leading axis over the `data` axis."""
  return NamedSharding(mesh, P('data'))
