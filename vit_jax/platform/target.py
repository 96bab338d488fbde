"""The devices a program is traced for, which pick the models' kernels and,
with `dtype='auto'`, their computation dtype.

Some implementations pay off on one backend only: `lean_ops`' custom
backward passes and the heads-first attention were measured faster and
leaner on XLA:CPU, and cost HBM traffic on a TPU (docs/performance.md);
cuDNN's flash attention runs on recent NVIDIA GPUs only
(`attention_implementation`), Pallas' splash attention on TPUs for long
sequences. The models ask `platform()`: the platform of
the devices the caller compiles for (`compiling_for`: the loop's mesh,
`vit_jax.plan`'s TPU slice), else `jax.default_backend()`, so that a
user's own `jax.jit` of `model.apply` in a TPU process gets the TPU path;
and `capability()`: the compute capability of those devices if they are
NVIDIA GPUs; and `mesh()`: the mesh a step is traced for, over whose
batch axis a kernel XLA cannot partition runs (`jax.shard_map`).
"""

import contextlib
import contextvars
from typing import Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

# A device of those compiled for, or only their platform's name.
_TARGET = contextvars.ContextVar('vit_jax_target', default=None)
# The mesh compiled for, if the caller gave one; else how many devices.
_MESH = contextvars.ContextVar('vit_jax_mesh', default=None)
_COUNT = contextvars.ContextVar('vit_jax_count', default=None)
# An attention implementation forced on every target (tests).
_ATTENTION = contextvars.ContextVar('vit_jax_attention', default=None)

# Sequences of at least this many tokens take splash attention on a TPU.
# Below it, XLA's fused attention holds no (tokens x tokens) temporaries
# either, and its roofline time is about the kernel's or better (ViT-B's
# heads, v5e: 577 tokens 221 us against 247; from 768 the kernel's is at
# most XLA's; benchmarks/long_attention.py --tokens, docs/performance.md).
SPLASH_MIN_TOKENS = 768


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


def mesh():
  """The mesh compiled for, if the caller gave one (the loop's), else
  jax's current mesh (`jax.set_mesh`), else None."""
  if _MESH.get() is not None:
    return _MESH.get()
  current = jax.sharding.get_abstract_mesh()
  return None if current.empty else current


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
  is_mesh = isinstance(devices, jax.sharding.Mesh)
  count = None
  if not isinstance(devices, str):
    count = 1 if hasattr(devices, 'platform') else np.size(
        devices.devices if is_mesh else list(devices))
  tokens = (_TARGET.set(_first(devices)),
            _MESH.set(devices if is_mesh else None), _COUNT.set(count))
  try:
    yield
  finally:
    for var, token in zip((_TARGET, _MESH, _COUNT), tokens):
      var.reset(token)


def traced_for(devices, fn):
  """`fn`, whose traces choose implementations for `devices`."""

  def wrapped(*args, **kwargs):
    with compiling_for(devices):
      return fn(*args, **kwargs)
  return wrapped


@contextlib.contextmanager
def using_attention(implementation: str):
  """Attention traced in this block runs `implementation`, whatever the
  target ('splash' on a CPU runs the kernel in Pallas' interpreter), where
  it can: 'splash' takes no bias or dense mask."""
  token = _ATTENTION.set(implementation)
  try:
    yield
  finally:
    _ATTENTION.reset(token)


def _places_kernels() -> bool:
  """Whether a kernel's inputs are known to be whole on one device, or
  split over the `data` axis of a known mesh (`mesh()`): XLA cannot
  partition a Pallas call, and refuses to compile one on other shardings.
  """
  count = _COUNT.get()
  if count is None:  # a platform by name: this process's devices
    count = jax.device_count()
  return count == 1 or (mesh() is not None and 'data' in mesh().shape)


def _compiles_tpu_kernels() -> bool:
  """Whether the program traced is compiled for TPU devices: a slice's
  (real or described), or by name in a TPU process; not a TPU's choices
  lowered on a CPU (`plan` counts the model's FLOPs so)."""
  device = _TARGET.get()
  if device is None or isinstance(device, str):
    return jax.default_backend() == 'tpu'
  return device.platform == 'tpu'


def attention_implementation(dtype, head_dim: int, masked: bool,
                             tokens: int = 0, segmented: bool = False) -> str:
  """How attention of `dtype` query, key and value runs on the target:
  'heads_first' (the CPU's), 'cudnn' (cuDNN's flash attention), 'splash'
  (Pallas' splash attention on TPUs, from SPLASH_MIN_TOKENS `tokens` on)
  or 'xla' (XLA's fusions: the TPU's, and a GPU's where cuDNN's may not
  run). `masked`: a bias or a dense mask; `segmented`: packed sequences'
  segment ids, which only the splash kernel takes as they are (the others
  get the dense mask they make).

  Splash attention's memory is linear in the tokens; XLA's keeps (tokens
  x tokens) logits per head. It runs where the program is compiled for
  TPU devices (`_compiles_tpu_kernels`) on one device or a known mesh
  (`_places_kernels`), without a bias or dense mask.

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
  forced = _ATTENTION.get()
  if forced is not None and not (forced == 'splash' and masked):
    return forced
  if platform() == 'cpu':
    return 'heads_first'
  if platform() == 'tpu':
    long = tokens >= SPLASH_MIN_TOKENS
    fits = (long and not masked and _compiles_tpu_kernels() and
            _places_kernels())
    return 'splash' if fits else 'xla'
  masked = masked or segmented
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
