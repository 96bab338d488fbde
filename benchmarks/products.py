r"""Each matrix product of a training step: GFLOP/s inside the step and alone.

  python benchmarks/products.py --model=ViT-Ti_16 --batch=32

Inside: one training step (the one `benchmarks/speed.py` times) traced with
`jax.profiler`; every fusion of the compiled HLO that holds one product is
a product, its FLOPs from its shapes, its time from the trace, and
"beside" the share of that time during which another fusion ran too (XLA's
CPU runtime runs independent fusions at once). Rows group a product's
instances over the blocks. Alone: the same product (operand shapes and
contracted dimensions) jitted by itself, and torch's `a @ b` of the same
size when torch is installed, best of --repeats. docs/performance.md has
the table and what it shows.
"""

import collections
import os
import re
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

try:  # before anything that may import TensorFlow: their LLVMs clash
  import torch  # pylint: disable=g-import-not-at-top
except ImportError:
  torch = None

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
import speed  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_string('model', 'ViT-Ti_16', 'Preset.')
flags.DEFINE_integer('repeats', 8, 'Timed runs of each product alone.')
flags.DEFINE_integer('top', 12, 'Rows to print (the longest first).')
FLAGS = flags.FLAGS

_DOT = re.compile(r'= \w+\[([\d,]*)\]\S* dot\((%[\w.\-]+), (%[\w.\-]+)\)'
                  r'(.*?lhs_contracting_dims=\{(\d+)\}, '
                  r'rhs_contracting_dims=\{(\d+)\})')


def _shape(body, operand):
  found = re.search(re.escape(operand) + r' = \w+\[([\d,]*)\]', body)
  return tuple(int(d) for d in found.group(1).split(',') if d)


def products(hlo):
  """{instruction: (label, FLOPs, lhs shape, rhs shape, dims)} of the
  entry's fusions that hold exactly one 2-D or batched product."""
  computations = op_profile._computations(hlo)  # pylint: disable=protected-access
  found = {}
  for line in hlo[hlo.index('ENTRY'):].splitlines():
    match = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = .*calls=(%[\w.\-]+)', line)
    if not match:
      continue
    body = computations.get(match.group(2), '')
    dots = _DOT.findall(body)
    if len(dots) != 1:
      continue
    out, lhs, rhs, rest, lhs_k, rhs_k = dots[0]
    lhs_shape, rhs_shape = _shape(body, lhs), _shape(body, rhs)
    depth = lhs_shape[int(lhs_k)]
    flops = 2 * np.prod([int(d) for d in out.split(',')]) * depth
    op_name = (re.search(r'op_name="([^"]*)"', line) or [None, ''])[1]
    where = re.sub(r'encoderblock_\d+/|_blocks/|/?transpose\(jvp\([^)]*\)\)', '',
                   op_name.split('/Transformer.')[-1])
    kind = 'backward' if 'transpose(jvp(' in op_name else 'forward'
    label = f'{kind} {where.split("/dot_general")[0]} [{out}] K={depth}'
    dims = None if 'batch_dims' in rest else (int(lhs_k), int(rhs_k))
    found[match.group(1)] = (label, flops, lhs_shape, rhs_shape, dims)
  return found


def inside_rows(found, events, fusions):
  """{label: [seconds, FLOPs, seconds beside another fusion, count]}."""
  spans = sorted((e['ts'], e['ts'] + e['dur'], e['name']) for e in events
                 if e['name'] in fusions)
  rows = collections.defaultdict(lambda: [0., 0., 0., 0])
  for i, (start, end, name) in enumerate(spans):
    if name not in found:
      continue
    label, flops = found[name][:2]
    beside = 0.
    for other_start, other_end, _ in spans[max(0, i - 40):i + 40]:
      if (other_start, other_end) != (start, end):
        beside += max(0., min(end, other_end) - max(start, other_start))
    row = rows[label]
    row[0] += (end - start) / 1e6
    row[1] += flops
    row[2] += min(beside, end - start) / 1e6
    row[3] += 1
  return rows


def _best(run, sync, repeats):
  run()
  sync()
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    run()
    sync()
    best = min(best, time.perf_counter() - start)
  return best


def alone(lhs_shape, rhs_shape, dims, flops):
  """(XLA, torch) GFLOP/s of the product by itself; torch None without it."""
  rng = np.random.default_rng(0)
  lhs = rng.standard_normal(lhs_shape, dtype=np.float32)
  rhs = rng.standard_normal(rhs_shape, dtype=np.float32)
  numbers = (((dims[0],), (dims[1],)), ((), ()))
  product = jax.jit(lambda a, b: jax.lax.dot_general(a, b, numbers))
  a, b, out = jax.numpy.asarray(lhs), jax.numpy.asarray(rhs), [None]
  xla = _best(lambda: out.__setitem__(0, product(a, b)),
              lambda: jax.block_until_ready(out[0]), FLAGS.repeats)
  if torch is None:
    return flops / xla / 1e9, None
  torch.set_num_threads(os.cpu_count())
  a = torch.from_numpy(lhs if dims[0] == 1 else lhs.T.copy())  # (M, K)
  b = torch.from_numpy(rhs if dims[1] == 0 else rhs.T.copy())  # (K, N)
  other = _best(lambda: a @ b, lambda: None, FLAGS.repeats)
  return flops / xla / 1e9, flops / other / 1e9


def main(argv):
  del argv
  runner = speed.jax_runner(FLAGS.model)
  runner.train(1)
  found = products(runner.step.as_text())
  fusions = {m.group(1) for m in re.finditer(
      r'^\s*(?:ROOT )?%([\w.\-]+) = ', runner.step.as_text(), re.M)}
  rows = inside_rows(found, op_profile.trace_events(
      lambda: runner.train(1)), fusions)
  shapes = {v[0]: v[2:] for v in found.values()}
  print(f'{FLAGS.model}, batch {FLAGS.batch}, {FLAGS.size} px, '
        f'{jax.device_count()} {jax.default_backend()} device(s); GFLOP/s')
  print('| product | n | inside the step | beside another fusion | alone, XLA '
        '| alone, torch |')
  print('|---|---|---|---|---|---|')
  for label, (seconds, flops, beside, count) in sorted(
      rows.items(), key=lambda kv: -kv[1][0])[:FLAGS.top]:
    lhs_shape, rhs_shape, dims = shapes[label]
    xla = other = None
    if dims is not None:
      xla, other = alone(lhs_shape, rhs_shape, dims, flops / count)
    cells = [f'{x:.0f}' if x else '-' for x in (xla, other)]
    print(f'| {label} | {count} | {flops / seconds / 1e9:.0f} | '
          f'{beside / seconds:.0%} | {cells[0]} | {cells[1]} |')


if __name__ == '__main__':
  app.run(main)
