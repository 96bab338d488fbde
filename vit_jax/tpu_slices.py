"""TPU slices as `vit_jax.plan` compiles for them: each generation's
published figures (`CHIPS`), topology names, and the abstract devices that
libtpu describes (no TPU needed)."""

import dataclasses
import importlib.util
import math
import re

from vit_jax.platform import tf_startup


@dataclasses.dataclass(frozen=True)
class Chip:
  """A TPU generation's published figures, per chip (Cloud TPU docs)."""
  name: str
  hbm_gib: float  # capacity
  peak_tflops: float  # bf16 matmuls
  hbm_gbps: float  # bandwidth, GB/s
  chips_per_host: int  # of multi-host slices


CHIPS = {
    'v4': Chip('TPU v4', 32, 275, 1200, 4),
    'v5e': Chip('TPU v5e', 16, 197, 819, 8),
    'v5p': Chip('TPU v5p', 95, 459, 2765, 4),
    'v6e': Chip('TPU v6e', 32, 918, 1640, 8),
}
_TOPOLOGY = re.compile(r'^(v4|v5e|v5p|v6e):(\d+(?:x\d+){1,2})$')


def parse_topology(name: str):
  """(Chip, number of chips) of a topology name, checked before libtpu."""
  match = _TOPOLOGY.match(name or '')
  if not match:
    raise ValueError(
        f'--topology={name!r}; expected GENERATION:SHAPE with GENERATION one '
        f'of {", ".join(CHIPS)}, e.g. v5e:2x2, v4:4x4x8, v5p:4x4x8, v6e:16x16.')
  return CHIPS[match[1]], math.prod(int(n) for n in match[2].split('x'))


def check_libtpu():
  if importlib.util.find_spec('libtpu') is None:
    raise ModuleNotFoundError(
        'vit_jax.plan compiles with libtpu, which is not installed: '
        "pip install -e '.[tpu]'")


def topology_devices(name: str):
  """The abstract devices of the TPU slice `name`, e.g. 'v5e:2x2'."""
  parse_topology(name)
  check_libtpu()
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  try:
    # libtpu's warnings about the absent TPU host: off the screen, all of
    # them (a refusal becomes one Error line below).
    with tf_startup.filtered_stderr(noise=re.compile('')):
      return topologies.get_topology_desc(platform='tpu',
                                          topology_name=name).devices
  except jax.errors.JaxRuntimeError as e:
    raise ValueError(f'libtpu refuses --topology={name}: '
                     f'{str(e).splitlines()[0]}') from None


def cores_per_chip(devices) -> int:
  """TensorCores of a chip that are devices of their own (v4: 2)."""
  return len({getattr(d, 'core_on_chip', 0) for d in devices})
