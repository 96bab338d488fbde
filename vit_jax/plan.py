r"""Plan a TPU run on a machine without TPUs: compile the loop's step for a
slice and read what the TPU compiler says of it.

  pip install -e '.[tpu]'
  python -m vit_jax.plan --config=configs/default.py --topology=v5e:2x2
  python -m vit_jax.plan --config=configs/vit.py:b16,imagenet2012 \
      --topology=v5p:4x4x8 --config.batch=4096 --fit

libtpu compiles for a slice it only describes
(`jax.experimental.topologies`); the step is the loop's own (`loop.
abstract_state`, `loop.jit_train_step`: shardings, donation, optimizer,
accumulation, remat, scan and FSDP as the config sets them), traced as a
TPU process traces it (`target`). Printed per chip: parameters and
optimizer state, temporaries, their sum against the chip's HBM, FLOPs and
HBM bytes per step, and a roofline estimate: step time = max(FLOPs / peak
FLOP/s, bytes / HBM bandwidth), from the chip's published peaks. It leaves
out collectives and the host, and XLA's bytes accessed include some that
stay on chip: an estimate to compare plans by (docs/performance.md).
"""

import dataclasses
import math
import os
import re
import sys

# The plan compiles for a slice it only describes: this process never takes
# a real TPU (one running a job keeps it), and several plans, or a plan
# beside a TPU process, may load libtpu at once.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')

# pylint: disable=g-import-not-at-top,g-bad-import-order
import time

from absl import app
from absl import flags
import jax
from ml_collections import config_flags
import tensorflow_datasets as tfds

from vit_jax import cli
from vit_jax import launch
from vit_jax import run_config
from vit_jax.data import labels as task_labels
from vit_jax.data import pipeline
from vit_jax.models import vit as models_vit
from vit_jax.platform import sharding
from vit_jax.platform import target
from vit_jax.run import loop
from vit_jax.tasks import registry
from vit_jax.tpu_slices import check_libtpu
from vit_jax.tpu_slices import Chip
from vit_jax.tpu_slices import CHIPS  # pylint: disable=unused-import
from vit_jax.tpu_slices import cores_per_chip
from vit_jax.tpu_slices import parse_topology
from vit_jax.tpu_slices import topology_devices
# pylint: enable=g-import-not-at-top,g-bad-import-order

FLAGS = flags.FLAGS
HELD = []  # --config.model.* flags parsed against a preset's model
config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file (path[:argument]).',
    lock_config=True)
flags.DEFINE_string('topology', None,
                    'A TPU slice, GENERATION:SHAPE: v4:2x2x1, v5e:16x16, '
                    'v5p:4x4x8, v6e:8x16 ...')
flags.DEFINE_integer('num_classes', None,
                     "Classes of the head; default: the config's dataset's "
                     '(tfds metadata: no data is read).')
flags.DEFINE_bool('fit', False,
                  'Find the largest batch per chip that fits, for each remat '
                  'policy, replicated and FSDP.')
flags.DEFINE_float('host_img_per_core', None,
                   "Images/s one host CPU core feeds the step; default: "
                   "input_pipeline's measured rate for the config's recipe.")


def dataset_info(config, num_classes=None):
  """A `DatasetInfo` for building the step: the head's classes from
  `num_classes`, else from the dataset's tfds metadata (no data read)."""
  if num_classes is None:
    num_classes = _metadata_classes(config)
  return pipeline.DatasetInfo(builder=None, num_classes=num_classes,
                                    num_train=0, num_test=0, channels=3)


def _metadata_classes(config) -> int:
  try:
    builder = tfds.builder(config.dataset, data_dir=config.tfds_data_dir)
    return task_labels.num_classes(config.pp.get('label'), builder)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f'The classes of config.dataset={config.dataset!r} are not in tfds\' '
        f'metadata ({type(e).__name__}); give --num_classes.') from None


@dataclasses.dataclass
class Compiled:
  """A compiled step and what it takes per chip."""
  executable: object  # the program of one device
  micro_batch: int  # per chip
  state_bytes: int  # parameters and optimizer state, per chip
  model_flops: float  # per chip and micro-batch, without remat's recompute
  flops: float  # per device and micro-batch, as compiled
  hbm_bytes: float  # per device and micro-batch, as compiled
  cores: int = 1  # devices per chip: libtpu compiles a v4 chip's 2 cores
  # as 2 devices (no megacore), each with half its HBM, FLOP/s and bandwidth


def sharded_state(config, devices, info):
  """(the task, the mesh, the training state as ShapeDtypeStructs with
  their shardings, those shardings) of `config` on `devices`."""
  mesh = sharding.make_mesh(config.mesh, devices)
  task = launch.make_task(config, None, mesh=mesh, info=info)
  _, abstract, shardings = loop.abstract_state(task, config, mesh)
  state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, shardings)
  return task, mesh, state, shardings


def _lowered_step(config, devices, info, platform=None):
  """(the loop's training step for `config` lowered for `devices`, with
  the implementations of `platform` (default: the devices'), its state,
  the number of chips on the `data` axis)."""
  task, mesh, state, shardings = sharded_state(config, devices, info)
  data = sharding.batch_sharding(mesh)
  batch = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=data),
      task.abstract_batch(config.batch // config.accum_steps))
  step = loop.jit_train_step(task, config, mesh, shardings,
                             platform=platform)
  with target.compiling_for(platform or devices):
    return step.lower(state, batch), state, mesh.shape['data']


def compile_step(config, devices, info, count=True) -> Compiled:
  """The loop's training step for `config`, compiled for `devices`; without
  `count`, its FLOPs are not counted (`fit` needs only its memory)."""
  lowered, state, data = _lowered_step(config, devices, info)
  executable = lowered.compile()
  micro = config.batch // config.accum_steps // data  # per device
  cores = cores_per_chip(devices)
  compiled = Compiled(executable, micro * cores, per_chip_bytes(state) * cores,
                      0., *_cost(executable), cores)
  return count_flops(compiled, config, devices, info) if count else compiled


def count_flops(compiled, config, devices, info) -> Compiled:
  """`compiled` with its FLOPs without remat (`model_flops`) and, for a
  scanned step, the FLOPs and bytes of all its blocks."""
  micro = compiled.micro_batch // compiled.cores
  changes = {'model_flops': _model_flops(config, micro, info) * compiled.cores}
  if _scanned(config):
    changes['flops'], changes['hbm_bytes'] = _unrolled_cost(config, devices,
                                                            info)
  return dataclasses.replace(compiled, **changes)


def _cost(program):
  """(FLOPs, bytes accessed) of a compiled or lowered program."""
  cost = program.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost['flops']), float(cost['bytes accessed'])


def _scanned(config) -> bool:
  return bool((config.model.get('transformer') or {}).get('scan'))


def _unrolled_cost(config, devices, info):
  """(FLOPs, bytes) of a scanned step, from the same step unrolled with one
  block and with two: XLA counts a loop's body once, whatever its trips.
  Both compile in seconds; the blocks are alike, so the cost is linear."""
  layers = config.model.transformer.num_layers
  one, two = (_cost(_lowered_step(_with(
      config, **{'model.transformer.scan': False,
                 'model.transformer.num_layers': n}), devices, info)[0]
                    .compile()) for n in (1, 2))
  return tuple(a + (layers - 1) * (b - a) for a, b in zip(one, two))


def per_chip_bytes(tree) -> int:
  """Bytes of one device's shards of `tree` (ShapeDtypeStructs with
  shardings)."""
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
             for x in jax.tree.leaves(tree))


def _model_flops(config, per_chip: int, info) -> float:
  """FLOPs of one chip's micro-batch step without remat (what MFU counts):
  XLA's count of the program before optimization, that step lowered with
  `remat_policy='none'` on one CPU device with the TPU's implementations
  (a program lowered for a TPU slice has no cost analysis). Lowering takes
  seconds; nothing compiles."""
  changes = dict(batch=per_chip, accum_steps=1, mesh=[('data', 1)])
  if 'remat_policy' in (config.model.get('transformer') or {}):
    changes['model.transformer.remat_policy'] = 'none'
  if _scanned(config):  # a loop's body counts once
    changes['model.transformer.scan'] = False
  lowered, _, _ = _lowered_step(_with(config, **changes),
                                jax.devices('cpu')[:1], info, platform='tpu')
  return _cost(lowered)[0]


@dataclasses.dataclass
class Estimate:
  """Per chip, per training step (`accum_steps` micro-batches)."""
  state_gib: float  # parameters and optimizer state
  temp_gib: float  # the step's temporaries
  total_gib: float  # arguments, outputs not donated, temporaries, code
  flops: float
  hbm_bytes: float
  seconds: float  # roofline: the slower of compute and HBM traffic
  bound: str  # 'compute' or 'HBM bandwidth'
  img_per_s: float
  mfu: float


def estimate(compiled: Compiled, chip: Chip, accum_steps: int) -> Estimate:
  """The compiler's figures for `compiled`, and the roofline estimate."""
  memory = compiled.executable.memory_analysis()
  gib, cores = 2.0**30, compiled.cores
  total = cores * (memory.argument_size_in_bytes +
                   memory.output_size_in_bytes - memory.alias_size_in_bytes +
                   memory.temp_size_in_bytes +
                   memory.generated_code_size_in_bytes)
  flops = accum_steps * cores * compiled.flops
  traffic = accum_steps * cores * compiled.hbm_bytes
  compute_s = flops / (chip.peak_tflops * 1e12)
  memory_s = traffic / (chip.hbm_gbps * 1e9)
  seconds = max(compute_s, memory_s)
  return Estimate(
      state_gib=compiled.state_bytes / gib,
      temp_gib=cores * memory.temp_size_in_bytes / gib, total_gib=total / gib,
      flops=flops, hbm_bytes=traffic, seconds=seconds,
      bound='compute' if compute_s >= memory_s else 'HBM bandwidth',
      img_per_s=accum_steps * compiled.micro_batch / seconds,
      mfu=accum_steps * compiled.model_flops / seconds /
      (chip.peak_tflops * 1e12))


# Images/s that one host core's input pipeline delivers at 224 px, by recipe
# (benchmarks/input_speed.py on a 2-core Intel Xeon, docs/performance.md).
HOST_IMG_PER_CORE = {'Inception crop, flip': 500,
                     'Inception crop, flip, RandAugment': 250}


def host_recipe(config) -> str:
  return ('Inception crop, flip, RandAugment' if config.pp.get('randaug')
          else 'Inception crop, flip')


def _gib(x):
  return f'{x:7.2f} GiB'


def si(value: float, unit: str) -> str:
  """'2.31 GFLOP': three significant digits and a decimal prefix."""
  for power, prefix in ((12, 'T'), (9, 'G'), (6, 'M'), (3, 'k')):
    if abs(value) >= 10**power:
      return f'{value / 10**power:.3g} {prefix}{unit}'
  return f'{value:.3g} {unit}'


def describe(config, chip, chips, compiled: Compiled, e: Estimate,
             img_per_core=None):
  """The plan, per chip, as lines of text."""
  transformer = config.model.get('transformer') or {}
  frames = config.video.frames if config.get('video') else 1
  hosts = max(1, chips // chip.chips_per_host)
  lines = [
      f'{config.model_name} on {chip.name}, {chips} chips ({hosts} '
      f'host{"s" * (hosts > 1)}); global batch {config.batch} = '
      f'{chips} x {compiled.micro_batch} x {config.accum_steps} '
      '(chips x per chip x accumulation).',
      f'Settings: dtype {config.model.get("dtype", "float32")}, remat '
      f'{transformer.get("remat_policy", "none")}, scan '
      f'{transformer.get("scan", False)}, sharding '
      f'{config.sharding_strategy}, optimizer {config.optimizer}.',
      'Per chip, from the TPU compiler:',
      f'  parameters + optimizer state {_gib(e.state_gib)}',
      f'  temporaries of the step      {_gib(e.temp_gib)}',
      f'  in all (with batch, code)    {_gib(e.total_gib)} of '
      f'{chip.hbm_gib:g} GiB HBM: '
      f'{"fits" if e.total_gib <= chip.hbm_gib else "DOES NOT FIT"}',
      f'  FLOPs per step               {si(e.flops, "FLOP")}',
      f'  HBM bytes per step           {si(e.hbm_bytes, "B")}',
      f'Estimate (roofline from the published peaks, {chip.peak_tflops:g} '
      f'TFLOP/s and {chip.hbm_gbps:g} GB/s; collectives and the host not '
      'counted):',
      f'  step time    {e.seconds * 1e3:10.3g} ms ({e.bound} bound)',
      f'  {"clips" if frames > 1 else "images"}/s'
      f'{" " * (5 if frames > 1 else 4)}{e.img_per_s:10.0f} per chip',
      f'  MFU          {100 * e.mfu:10.1f} %']
  recipe = host_recipe(config)
  rate = img_per_core or HOST_IMG_PER_CORE.get(recipe)
  if rate:
    # A clip's frames are decoded and cropped as so many images.
    cores = math.ceil(e.img_per_s * frames * min(chips, chip.chips_per_host)
                      / rate)
    lines.append(f'  host cores   {cores:10d} per host of '
                 f'{min(chips, chip.chips_per_host)} chips, at {rate:g} img/s '
                 f'per core ({recipe}, 224 px'
                 f'{f"; {frames} frames a clip" if frames > 1 else ""})')
    if config.pp.crop != 224 and not img_per_core:
      lines.append(f'  (this config crops {config.pp.crop} px: measure its '
                   f'rate with benchmarks/input_speed.py --size='
                   f'{config.pp.crop}, pass --host_img_per_core)')
  return lines


# Fitting the batch.


def _with(config, **changes):
  """A copy of `config` with `changes`: 'a.b' keys are nested fields."""
  config = config.copy_and_resolve_references()
  config.update_from_flattened_dict(changes)
  return config


def _out_of_memory(error) -> bool:
  text = str(error)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


_NEEDED = re.compile(r'required for HLO temporaries \(([\d.]+)([KMGT]?)\)')


def try_batch(config, devices, info, chip, per_chip: int):
  """(the memory per chip in GiB, or None if unknown; (Compiled, Estimate,
  config) if it fits the chip, else None) at `per_chip` images per chip,
  one micro-batch. A step the compiler refuses gives the temporaries it
  says it needed."""
  cores = cores_per_chip(devices)
  if per_chip % cores:
    return None, None
  config = _with(config, batch=per_chip * len(devices) // cores,
                 accum_steps=1)
  try:
    compiled = compile_step(config, devices, info, count=False)
  except jax.errors.JaxRuntimeError as e:
    if not _out_of_memory(e):
      raise
    needed = _NEEDED.search(str(e))
    if not needed:
      return None, None
    scale = 1000.0**(' KMGT'.index(needed[2] or ' ')) / 2**30
    return cores * float(needed[1]) * scale, None
  e = estimate(compiled, chip, 1)
  return e.total_gib, ((compiled, e, config) if e.total_gib <= chip.hbm_gib
                       else None)


def fit_batch(config, devices, info, chip, start: int, compiles: int = 10):
  """The largest batch per chip that fits, with its (Compiled, Estimate,
  config); (0, None) if not even one image does.

  Memory grows linearly with the batch: each guess is where the line
  through the two tries nearest the boundary meets the chip's HBM, until
  the largest fit and the smallest failure are within 5% (or 8 images).
  Batches of 16 or more are multiples of 8, the TPU's sublane tile.
  """
  tries = {}  # batch -> (GiB or None, found or None)
  batch = max(1, start)
  for _ in range(compiles):
    tries[batch] = try_batch(config, devices, info, chip, batch)
    fits = sorted(b for b, (_, found) in tries.items() if found)
    fails = sorted(b for b, (_, found) in tries.items() if not found)
    if not fits:
      if batch == 1:
        return 0, None
      batch //= 2
      continue
    low, high = fits[-1], (fails[0] if fails else None)
    if high is not None and high - low <= max(8, low // 20):
      break
    batch = _next_guess(tries, low, high, chip.hbm_gib)
    if batch is None:
      break
  low = max(b for b, (_, found) in tries.items() if found)
  return low, tries[low][1]


def _next_guess(tries, low, high, hbm_gib):
  """The next batch to try between the largest fit `low` and the smallest
  failure `high` (None: none yet); None if no batch is left between. The
  line goes through `low` and `high`, else the two largest fits."""
  gib = {b: m for b, (m, _) in tries.items() if m is not None}
  fits = sorted(b for b in gib if tries[b][1] and b < low)
  other = high if high in gib else (fits[-1] if fits else None)
  guess = 2 * low
  if other is not None and low in gib:
    slope = (gib[other] - gib[low]) / (other - low)
    if slope > 0:
      guess = int(low + (0.995 * hbm_gib - gib[low]) / slope)
  if high is not None and not low < guess < high - 8:
    guess = (low + high) // 2  # the line misses the bracket: halve it
  if guess >= 16:
    guess = guess // 8 * 8
  if guess <= low:  # the line says low is the answer: check the next one
    guess = low + (8 if low >= 16 else 1)
  if high is not None and guess >= high:
    return None
  return guess


def fit_table(config, devices, info, chip, start: int):
  """Lines of the largest batch per chip for each sharding and remat."""
  transformer = config.model.get('transformer')
  policies = ('none',)
  if transformer is not None and 'remat_policy' in transformer:
    policies = tuple(models_vit.REMAT_POLICIES)
  lines = [f'Largest batch per chip that fits {chip.hbm_gib:g} GiB '
           '(estimates as above, one micro-batch):',
           '  sharding   remat          batch/chip   memory   step ms  '
           'img/s/chip   MFU']
  print('\n'.join(lines), flush=True)
  for strategy in ('replicate', 'fsdp'):
    for policy in policies:
      changes = {'sharding_strategy': strategy}
      if len(policies) > 1:
        changes['model.transformer.remat_policy'] = policy
      batch, found = fit_batch(_with(config, **changes), devices, info, chip,
                               start)
      if not found:
        lines.append(f'  {strategy:10s} {policy:14s} {"nothing fits":>10s}')
        print(lines[-1], flush=True)
        continue
      compiled, _, fitted = found
      e = estimate(count_flops(compiled, fitted, devices, info), chip, 1)
      lines.append(f'  {strategy:10s} {policy:14s} {batch:10d} '
                   f'{e.total_gib:6.2f} GiB {e.seconds * 1e3:8.1f} '
                   f'{e.img_per_s:10.0f} {100 * e.mfu:6.1f}%')
      print(lines[-1], flush=True)
  return lines


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = run_config.resolve(
      FLAGS.config, config_flags.get_override_values(FLAGS['config']), HELD)
  chip, chips = parse_topology(FLAGS.topology)
  check_libtpu()
  if config.trainer not in registry.planned():
    raise ValueError(f'config.trainer={config.trainer!r}: vit_jax.plan '
                     f'compiles the steps of {registry.planned()}.')
  devices = topology_devices(FLAGS.topology)
  launch.check(config, sharding.make_mesh(config.mesh, devices))
  info = dataset_info(config, FLAGS.num_classes)
  t = time.perf_counter()
  try:
    compiled = compile_step(config, devices, info)
  except jax.errors.JaxRuntimeError as e:
    if not _out_of_memory(e):
      raise
    raise ValueError(f'The step does not fit {chip.name}\'s '
                     f'{chip.hbm_gib:g} GiB: {str(e).splitlines()[0]} '
                     'Try --fit.') from None
  e = estimate(compiled, chip, config.accum_steps)
  print('\n'.join(describe(config, chip, chips, compiled, e,
                           FLAGS.host_img_per_core)), flush=True)
  print(f'(compiled for {FLAGS.topology} in {time.perf_counter() - t:.0f} s)')
  if FLAGS.fit:
    fit_table(config, devices, info, chip, compiled.micro_batch)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'topology'])
  sys.argv, HELD = run_config.held_model_flags(sys.argv)
  cli.run(main, config_flag='config')
