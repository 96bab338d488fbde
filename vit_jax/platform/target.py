"""The devices a program is traced for, which pick the models' kernels and,
with `dtype='auto'`, their computation dtype.

Some implementations pay off on one backend only: `lean_ops`' custom
backward passes and the heads-first attention were measured faster and
leaner on XLA:CPU, and cost HBM traffic on a TPU (docs/performance.md);
cuDNN's flash attention runs on recent NVIDIA GPUs only
(`attention_implementation`). The models ask `platform()`: the platform of
the devices the caller compiles for (`compiling_for`: the loop's mesh,
`vit_jax.plan`'s TPU slice), else `jax.default_backend()`, so that a
user's own `jax.jit` of `model.apply` in a TPU process gets the TPU path;
and `capability()`: the compute capability of those devices if they are
NVIDIA GPUs.
"""

import contextlib
import contextvars
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

# A device of those compiled for, or only their platform's name.
_TARGET = contextvars.ContextVar('vit_jax_target', default=None)


def _first(devices):
  """A device of `devices` (a Mesh or a sequence), or `devices` itself (a
  device or a platform's name)."""
  if isinstance(devices, jax.sharding.Mesh):
    devices = devices.devices.flat
  if isinstance(devices, str) or hasattr(devices, 'platform'):
    return devices
  return next(iter(devices))


def platform_of(devices) -> str:
  """The platform of `devices`: a Mesh, devices, a device, or a name."""
  first = _first(devices)
  return first if isinstance(first, str) else first.platform


def platform() -> str:
  """'cpu', 'tpu' or 'gpu': what the program being traced will run on."""
  target = _TARGET.get()
  return platform_of(target) if target is not None else jax.default_backend()


def capability(devices=None) -> Optional[Tuple[int, int]]:
  """(major, minor) compute capability of `devices` (default: those
  compiled for, else this process's), if they are NVIDIA GPUs; None for
  other devices or where it is unknown (a platform name off a GPU host,
  ROCm's 'gfx90a')."""
  device = _first(devices) if devices is not None else _TARGET.get()
  if device is None or isinstance(device, str):  # this host's GPU, if any
    if device not in (None, 'gpu') or jax.default_backend() != 'gpu':
      return None
    device = jax.devices()[0]
  if device.platform != 'gpu':
    return None
  try:
    major, minor = str(device.compute_capability).split('.')
    return int(major), int(minor)
  except (AttributeError, ValueError):
    return None


@contextlib.contextmanager
def compiling_for(devices):
  """Traces in this block choose implementations for `devices`.

  jit traces a function at its first call: wrap the traced function's body
  (`traced_for`), or its `.lower()`, not the `jax.jit` call.
  """
  token = _TARGET.set(_first(devices))
  try:
    yield
  finally:
    _TARGET.reset(token)


def traced_for(devices, fn):
  """`fn`, whose traces choose implementations for `devices`."""
  first = _first(devices)

  def wrapped(*args, **kwargs):
    with compiling_for(first):
      return fn(*args, **kwargs)
  return wrapped


def attention_implementation(dtype, head_dim: int, masked: bool) -> str:
  """How attention of `dtype` query, key and value runs on the target:
  'heads_first' (the CPU's), 'cudnn' (cuDNN's flash attention) or 'xla'
  (XLA's fusions: the TPU's, and a GPU's where cuDNN's may not run).

  cuDNN's limits, as jax 0.10.2 checks them (jax/_src/cudnn/
  fused_attention_stablehlo.py): fp16 or bf16 query, key and value of one
  dtype (`check_layout`, lines 288-291); a head dim that is a multiple of
  8 and at most 128, or 256 from capability 9.0 on
  (`check_is_flash_attention`, 379-389); capability 10.3 needs cuDNN
  9.11 (365-368), whose version jax has no public way to read. jax 0.10.2
  does not check the capability itself; cuDNN's SDPA needs 8.0 (its
  frontend's docs, operations/Attention, "Support Matrix"), so a T4 (7.5)
  fails when it compiles. A bias or mask stays on XLA's path, as before.
  """
  if platform() == 'cpu':
    return 'heads_first'
  cap = capability() if platform() == 'gpu' and not masked else None
  if cap is None:
    return 'xla'
  half = np.dtype(dtype) in (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
  head_max = 256 if cap >= (9, 0) else 128
  fits = (half and cap >= (8, 0) and cap != (10, 3) and head_dim % 8 == 0
          and head_dim <= head_max)
  return 'cudnn' if fits else 'xla'


def compute_dtype(devices=None, training: bool = True) -> str:
  """The computation dtype that `devices` (default: jax.devices()) run
  fastest without loss scaling, for `dtype='auto'`.

  'bfloat16' on TPUs and NVIDIA GPUs of capability 8.0 on (Ampere's bf16
  tensor cores); on older GPUs with fp16 tensor cores (7.0 on: V100, T4)
  'float16' for inference and 'float32' for training, whose loop scales
  no loss; 'float32' on CPUs and on GPUs of unknown capability.
  """
  devices = jax.devices() if devices is None else devices
  name = platform_of(devices)
  if name == 'tpu':
    return 'bfloat16'
  cap = capability(devices) if name == 'gpu' else None
  if cap is None:
    return 'float32'
  if cap >= (8, 0):
    return 'bfloat16'
  return 'float16' if cap >= (7, 0) and not training else 'float32'
