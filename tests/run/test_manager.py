"""The loop's Orbax manager writes small replicated arrays whole: no
per-replica slice (and no program to compile for it); large ones still in
slices, one per replica."""

import logging

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from vit_jax.run import loop


class _Compiles(logging.Handler):
  """The names of the programs jax compiles while attached."""

  def __init__(self):
    super().__init__()
    self.names = []

  def emit(self, record):
    message = record.getMessage()
    if message.startswith('Finished XLA compilation of'):
      self.names.append(message.split()[4])


def test_small_replicated_arrays_are_written_whole(tmp_path):
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ('data',))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  big_rows = 8 * loop.MIN_SLICE_BYTES // (4 * 64)  # 8 slices of the minimum
  state = {'small': jnp.arange(24 * 40, dtype=jnp.float32).reshape(24, 40),
           'big': jnp.ones((big_rows, 64), jnp.float32)}
  state = jax.device_put(state, replicated)
  config = ml_collections.ConfigDict({'checkpoint_every': 0})
  manager = loop.make_manager(config, str(tmp_path))
  compiles = _Compiles()
  logger = logging.getLogger('jax._src.dispatch')
  logger.addHandler(compiles)
  try:
    with jax.log_compiles(True):
      manager.save(1, args=ocp.args.StandardSave(state), force=True)
      manager.wait_until_finished()
  finally:
    logger.removeHandler(compiles)
  # The big array's 8 slices share one shape: one program per offset at
  # most; the small array adds none.
  slices = compiles.names.count('jit(slice)')
  assert 1 <= slices <= len(jax.devices()), compiles.names
  restored = manager.restore(1, args=ocp.args.StandardRestore(
      jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                  sharding=replicated),
                   state)))
  manager.close()
  for key in state:
    np.testing.assert_array_equal(restored[key], state[key])
