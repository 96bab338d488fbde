r"""Long sequences on a TPU slice: the training step with XLA's attention
against Pallas' splash attention, compiled by the TPU compiler on this CPU.

For each image size, the loop's own step (`vit_jax.plan.compile_step`: the
config's optimizer, shardings and donation) is compiled twice, attention
forced to 'xla' (the (tokens x tokens) logits in HBM) and to 'splash'
(`target.using_attention`). Printed per chip: temporaries, HBM bytes,
FLOPs, the roofline step time of `plan.estimate`, and the all-gathers in
the program. XLA counts none of a Pallas kernel's work, so the kernel's
FLOPs and HBM traffic are added from its tiling (`kernel_cost`), an
upper bound on its traffic. With `--big_vision`, big_vision's ViT is
compiled beside at --big_vision_size (`benchmarks/big_vision_step.py`'s
step).

  pip install -e '.[tpu]'
  python benchmarks/long_attention.py --topology=v5e:2x2 \
      --config=vit_jax/configs/augreg.py:b16,none,i1k \
      --config.model.dtype=bfloat16 --sizes=224,512,1024,1536 \
      --big_vision=PATH --big_vision_size=1024
  # the threshold: one attention layer at these token counts
  python benchmarks/long_attention.py --topology=v5e:2x2 \
      --config=vit_jax/configs/augreg.py:b16,none,i1k \
      --tokens=197,257,577,1025,2049,4097
  # ViViT-B at 8 and 32 frames of 224 px
  python benchmarks/long_attention.py --topology=v5e:2x2 \
      --config=configs/vivit_fmnist.py:scratch \
      --config.model_name=ViViT-B_16x2 --config.model.dtype=bfloat16 \
      --config.pp.crop=224 --num_classes=400 \
      --size_field=video.frames --sizes=8,32
"""

import argparse
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax import plan  # pylint: disable=g-import-not-at-top  (sets JAX_PLATFORMS first)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax import run_config
from vit_jax.models import attention
from vit_jax.platform import target

flags.DEFINE_list('sizes', ['224', '512', '1024', '1536'],
                  'Values of --size_field: image sides in pixels, or frames.')
flags.DEFINE_string('size_field', 'pp.crop',
                    "The config field that sets the input's side.")
flags.DEFINE_integer('per_chip', 2, 'Images (examples) per chip.')
flags.DEFINE_list('implementations', ['xla', 'splash'],
                  "Attention implementations to compile ('xla', 'splash').")
flags.DEFINE_list('tokens', [],
                  "Instead of the step: one attention's forward and backward "
                  "passes at these token counts (--heads, --head_dim), for "
                  "the threshold `target.SPLASH_MIN_TOKENS`.")
flags.DEFINE_integer('heads', 12, 'Heads of --tokens (ViT-B).')
flags.DEFINE_integer('head_dim', 64, 'Head dim of --tokens (ViT-B).')
flags.DEFINE_string('big_vision', None,
                    "big_vision's checkout: compile its ViT (the config's "
                    'variant) at --big_vision_size too.')
flags.DEFINE_integer('big_vision_size', None,
                     "big_vision's image side; default: the largest size.")
FLAGS = flags.FLAGS


def kernel_cost(shape, itemsize, block):
  """(FLOPs, HBM bytes) of splash attention's forward and backward passes
  on (batch, heads, tokens, depth) inputs with square `block` tiles.

  FLOPs: the forward's two products, the dq kernel's three (logits
  recomputed, dP, dQ), the dkv kernel's four (logits, dV, dP, dK).
  Bytes: each kernel reads the operands it tiles over once per tile of
  the other side (k and v per query tile; q, dO and the softmax's
  statistics per key tile), the rest once.
  """
  batch, heads, tokens, depth = shape
  tiles = tokens / block
  matrix = tokens * depth * itemsize  # one head's q, k, v, out or grads
  stats = tokens * 4  # one head's float32 log-sum-exp (or dO . O)
  forward = 3 * matrix + 2 * tiles * matrix + stats  # q, o, lse; k, v
  dq = 3 * matrix + 2 * stats + 2 * tiles * matrix  # q, dO, dq; k, v
  dkv = 4 * matrix + tiles * (2 * matrix + 2 * stats)  # k, v, dk, dv; q..
  per_head = 18. * tokens * tokens * depth, forward + dq + dkv
  return tuple(batch * heads * x for x in per_head)


@dataclasses.dataclass
class Row:
  size: int
  implementation: str
  estimate: plan.Estimate
  kernel_flops: float
  kernel_bytes: float
  all_gathers: int
  seconds: float


def compile_row(config, devices, info, chip, size, implementation):
  """The step at `size` with `implementation`'s attention, per chip."""
  calls = []
  traced = attention._splash_kernel  # pylint: disable=protected-access

  def recorded(query, *args, block, **kwargs):
    if target.mesh() is not None:  # the step's, not the initialization's
      calls.append((query.shape, query.dtype.itemsize, block))
    return traced(query, *args, block=block, **kwargs)

  attention._splash_kernel = recorded  # pylint: disable=protected-access
  t = time.perf_counter()
  try:
    with target.using_attention(implementation):
      compiled = plan.compile_step(config, devices, info, count=False)
  finally:
    attention._splash_kernel = traced  # pylint: disable=protected-access
  # Unrolled blocks without remat: each traced call runs once each way.
  costs = [kernel_cost(*call) for call in calls]
  flops, traffic = (sum(c[i] for c in costs) for i in (0, 1))
  counted = dataclasses.replace(compiled, flops=compiled.flops + flops,
                                hbm_bytes=compiled.hbm_bytes + traffic)
  text = compiled.executable.as_text()
  return Row(size, implementation, plan.estimate(counted, chip, 1), flops,
             traffic, text.count(' all-gather('),
             time.perf_counter() - t)


def attention_row(devices, chip, tokens, implementation):
  """(temporaries, HBM bytes, FLOPs, roofline seconds) per chip of one
  bfloat16 attention's forward and backward passes, --per_chip examples
  a chip, the batch split over a `data` axis of every chip."""
  mesh = jax.sharding.Mesh(devices, ('data',))
  shape = (FLAGS.per_chip * len(devices), tokens, FLAGS.heads,
           FLAGS.head_dim)
  x = jax.ShapeDtypeStruct(shape, jax.numpy.bfloat16,
                           sharding=jax.sharding.NamedSharding(
                               mesh, jax.sharding.PartitionSpec('data')))
  loss = lambda q, k, v: attention.attention(q, k, v).astype(
      jax.numpy.float32).sum()
  grad = target.traced_for(mesh, jax.grad(loss, argnums=(0, 1, 2)))
  with target.using_attention(implementation):
    compiled = jax.jit(grad).lower(x, x, x).compile()
  flops, traffic = plan._cost(compiled)  # pylint: disable=protected-access
  if implementation == 'splash':
    block = attention.splash_block(tokens)
    padded = -(-tokens // block) * block
    more = kernel_cost((FLAGS.per_chip, FLAGS.heads, padded, FLAGS.head_dim),
                       2, block)
    flops, traffic = flops + more[0], traffic + more[1]
  seconds = max(flops / (chip.peak_tflops * 1e12),
                traffic / (chip.hbm_gbps * 1e9))
  return (compiled.memory_analysis().temp_size_in_bytes, traffic, flops,
          seconds)


def threshold_table(devices, chip):
  print(f'One attention, forward and backward, {FLAGS.heads} heads of '
        f'{FLAGS.head_dim}, bfloat16, {FLAGS.per_chip} per chip; per chip:')
  print('| tokens | attention | temporaries | HBM bytes | FLOPs | '
        'roofline |')
  print('|---' * 6 + '|', flush=True)
  for tokens in map(int, FLAGS.tokens):
    for implementation in FLAGS.implementations:
      temp, traffic, flops, seconds = attention_row(devices, chip, tokens,
                                                    implementation)
      print(f'| {tokens} | {implementation} | {temp / 2**20:.1f} MiB | '
            f'{plan.si(traffic, "B")} | {plan.si(flops, "FLOP")} | '
            f'{seconds * 1e6:.0f} us |', flush=True)


def unit() -> str:
  """The size column's unit: pixels, or the --size_field's name."""
  return 'px' if FLAGS.size_field == 'pp.crop' else FLAGS.size_field.split(
      '.')[-1]


def print_row(row, tokens):
  e = row.estimate
  print(f'| {row.size} {unit()} | {tokens} | {row.implementation} | '
        f'{e.temp_gib:.2f} GiB | {plan.si(e.hbm_bytes, "B")} | '
        f'{plan.si(e.flops, "FLOP")} | {e.seconds * 1e3:.1f} ms '
        f'({e.bound}) | {plan.si(row.kernel_bytes, "B")} | '
        f'{row.all_gathers} |', flush=True)
  print(f'  (compiled in {row.seconds:.0f} s)', file=sys.stderr, flush=True)


def longest_sequence(config) -> int:
  """Tokens of the model's longest attention: a ViT's patches and class
  token; a video's tubelets of all frames and the class token, or, in the
  factorised encoder, one frame's (its spatial transformer's)."""
  patch = config.model.get('patches', {}).get('size', (16, 16))
  tokens = (config.pp.crop // patch[0]) * (config.pp.crop // patch[1])
  if config.get('video') and config.model.get('encoder') == 'unfactorised':
    tokens *= config.video.frames // config.model.tubelet
  return tokens + 1


def big_vision_row(config, devices, size):
  """big_vision's ViT of the config's variant at `size`, through
  big_vision_step.py's step (same batch, AdamW, replicated state)."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import big_vision_step  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  preset = config.model_name.split('-augreg')[0]
  args = argparse.Namespace(
      big_vision=FLAGS.big_vision, model=preset, depth=None,
      batch=FLAGS.per_chip * len(devices), image=size,
      dtype=config.model.get('dtype', 'float32'), fsdp=False)
  mesh = jax.sharding.Mesh(devices, ('data',))
  with target.compiling_for(devices):
    compiled, seconds = big_vision_step.compile_step(
        big_vision_step.big_vision_model(args), args, mesh)
  return big_vision_step.report('big_vision', compiled, seconds)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = run_config.resolve(
      FLAGS.config, config_flags.get_override_values(FLAGS['config']),
      plan.HELD)
  chip, chips = plan.parse_topology(FLAGS.topology)
  plan.check_libtpu()
  devices = plan.topology_devices(FLAGS.topology)
  if FLAGS.tokens:
    threshold_table(devices, chip)
    return
  info = plan.dataset_info(config, FLAGS.num_classes)
  print(f'{config.model_name}, dtype {config.model.get("dtype")}, '
        f'{FLAGS.per_chip} per chip on {FLAGS.topology}; per chip:')
  print('| size | tokens | attention | temporaries | HBM bytes | FLOPs | '
        'step (roofline) | of which kernel bytes | all-gathers |')
  print('|---' * 9 + '|', flush=True)
  for size in map(int, FLAGS.sizes):
    sized = plan._with(  # pylint: disable=protected-access
        config, batch=FLAGS.per_chip * chips, accum_steps=1,
        **{FLAGS.size_field: size})
    tokens = longest_sequence(sized)
    for implementation in FLAGS.implementations:
      try:
        row = compile_row(sized, devices, info, chip, size, implementation)
      except jax.errors.JaxRuntimeError as e:
        if not plan._out_of_memory(e):  # pylint: disable=protected-access
          raise
        needed = plan._NEEDED.search(str(e))  # pylint: disable=protected-access
        print(f'| {size} {unit()} | {tokens} | {implementation} | does not fit '
              f'{chip.hbm_gib:g} GiB: temporaries '
              f'{"".join(needed.groups()) if needed else "?"}B |',
              flush=True)
        continue
      print_row(row, tokens)
  if FLAGS.big_vision:
    big_vision_row(config, devices,
                   FLAGS.big_vision_size or max(map(int, FLAGS.sizes)))


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'topology'])
  sys.argv, plan.HELD = run_config.held_model_flags(sys.argv)
  cli.run(main, config_flag='config')
