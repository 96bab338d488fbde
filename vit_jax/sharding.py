"""Device mesh and sharding rules given as config data.

A rule is `(regex, spec)`: the first regex that `re.search`es a leaf's
'/'-joined path (e.g. 'params/Transformer/encoderblock_0/MlpBlock_0/Dense_0/
kernel', or the same path inside the optimizer state) gives its
PartitionSpec; leaves no rule matches are replicated.
"""

import math
import re
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P


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
  return jax.make_mesh(sizes, names, axis_types=(AxisType.Auto,) * len(names),
                       devices=devices)


def tree_shardings(tree, mesh: Mesh, rules=()):
  """NamedShardings for every leaf of `tree` (arrays or ShapeDtypeStructs)."""
  compiled = [(re.compile(regex), P(*spec)) for regex, spec in rules]

  def sharding(key_path, leaf):
    path = jax.tree_util.keystr(key_path, simple=True, separator='/')
    for regex, spec in compiled:
      if regex.search(path) and len(spec) <= np.ndim(leaf):
        return NamedSharding(mesh, spec)
    return NamedSharding(mesh, P())

  return jax.tree_util.tree_map_with_path(sharding, tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Batches are split on their leading axis over the `data` axis."""
  return NamedSharding(mesh, P('data'))
