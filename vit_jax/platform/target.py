"""The platform a program is traced for, which picks the models' kernels.

Some implementations pay off on one backend only: `lean_ops`' custom
backward passes and the heads-first attention were measured faster and
leaner on XLA:CPU, and cost HBM traffic on a TPU (docs/performance.md).
The models ask `platform()`: the platform of the devices the caller
compiles for (`compiling_for`: the loop's mesh, `vit_jax.plan`'s TPU
slice), else `jax.default_backend()`, so that a user's own `jax.jit` of
`model.apply` in a TPU process gets the TPU path.
"""

import contextlib
import contextvars

import jax

_PLATFORM = contextvars.ContextVar('vit_jax_target_platform', default=None)


def platform() -> str:
  """'cpu', 'tpu' or 'gpu': what the program being traced will run on."""
  return _PLATFORM.get() or jax.default_backend()


def platform_of(devices) -> str:
  """The platform of `devices`: a Mesh, a sequence of devices, or a name."""
  if isinstance(devices, str):
    return devices
  if isinstance(devices, jax.sharding.Mesh):
    devices = devices.devices.flat
  return next(iter(devices)).platform


@contextlib.contextmanager
def compiling_for(devices):
  """Traces in this block choose implementations for `devices`' platform.

  jit traces a function at its first call: wrap the traced function's body
  (`traced_for`), or its `.lower()`, not the `jax.jit` call.
  """
  token = _PLATFORM.set(platform_of(devices))
  try:
    yield
  finally:
    _PLATFORM.reset(token)


def traced_for(devices, fn):
  """`fn`, whose traces choose implementations for `devices`' platform."""
  name = platform_of(devices)

  def wrapped(*args, **kwargs):
    with compiling_for(name):
      return fn(*args, **kwargs)
  return wrapped
