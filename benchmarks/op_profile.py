"""Where a training step's time goes, op by op, in vit_jax (XLA) and timm
(torch): the table that `benchmarks/speed.py --profile` prints.

Each framework's profiler times one step; every op is put in one row:
products (forward, input gradient, weight gradient), the attention core
(q k^T, softmax, weights v, forward and backward), LayerNorm, GELU, copies
and transposes, the optimizer update, and the rest (bias and residual adds,
the loss). XLA's ops are its fusions, named in the compiled HLO: a fusion
holding a product or convolution is a product; the rest go by the source
operation (`op_name`) that XLA records. timm's are aten ops, with
`record_shapes`: a backward `mm` whose contracted dimension is the batch's
tokens makes a weight gradient.
"""

import collections
import glob
import gzip
import json
import os
import re
import tempfile

import jax
import numpy as np

ROWS = ('products, forward', 'products, input gradient',
        'products, weight gradient', 'attention core', 'LayerNorm', 'GELU',
        'copies and transposes', 'optimizer update', 'other')


def _computations(hlo: str):
  """{computation name: its text} of an HLO module."""
  blocks, name = {}, None
  for line in hlo.splitlines():
    match = re.match(r'^(?:ENTRY )?(%[\w.\-]+) ', line)
    if match and line.rstrip().endswith('{'):
      name = match.group(1)
      blocks[name] = []
    elif name is not None:
      blocks[name].append(line)
  return {k: '\n'.join(v) for k, v in blocks.items()}


def _xla_row(line: str, computations, param_sizes) -> str:
  """The row of one scheduled HLO instruction."""
  op_name = (re.search(r'op_name="([^"]*)"', line) or [None, ''])[1]
  called = re.search(r'calls=(%[\w.\-]+)', line)
  body = computations.get(called.group(1), '') if called else line
  shape = re.search(r'= (\w+\[[\d,]*\])', line)
  backward = 'transpose(jvp(' in op_name
  if 'jvp(' not in op_name and 'VisionTransformer' not in op_name:
    return 'optimizer update' if op_name else 'other'
  if 'attention' in op_name.lower() and not re.search(
      r'/(query|key|value|out)/', op_name):
    return 'attention core'
  if ' dot(' in body or ' convolution(' in body:
    if not backward:
      return 'products, forward'
    size = shape and np.prod([int(d) for d in re.findall(
        r'\d+', shape.group(1).split('[')[1])])
    return ('products, weight gradient' if size in param_sizes else
            'products, input gradient')
  if 'LayerNorm' in op_name or 'encoder_norm' in op_name:
    return 'LayerNorm'
  if 'MlpBlock' in op_name and not re.search(r'/Dense_\d/', op_name):
    return 'GELU'
  if re.search(r'\b(copy|transpose)\b', body) and ' add(' not in body:
    return 'copies and transposes'
  return 'other'


def trace_events(run_step):
  """The complete ('X') events of a `jax.profiler` trace of `run_step()`."""
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    run_step()
    jax.profiler.stop_trace()
    path = glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'),
                     recursive=True)[0]
    with gzip.open(path) as f:
      return [e for e in json.load(f)['traceEvents'] if e.get('ph') == 'X']


def profile_xla(compiled, run_step, params) -> dict:
  """{row: seconds} of one step of `compiled`, run by `run_step()`."""
  hlo = compiled.as_text()
  computations = _computations(hlo)
  entry = hlo[hlo.index('ENTRY'):]
  rows = {}
  # A backward product the size of a parameter is its gradient (XLA may
  # reshape it: (D, 3, 64) -> (D, 192)).
  param_sizes = {x.size for x in jax.tree.leaves(params)}
  for line in entry.splitlines():
    match = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = ', line)
    if match:
      rows[match.group(1)] = _xla_row(line, computations, param_sizes)
  seconds = collections.Counter()
  for event in trace_events(run_step):
    row = rows.get(event['name'])
    if row:
      seconds[row] += event['dur'] / 1e6
  return dict(seconds)


def _torch_row(event, tokens: int) -> str:
  """The row of one aten op of timm's step, from its ancestors' names."""
  name, parents = event.name, []
  parent = event.cpu_parent
  while parent is not None:
    parents.append(parent.name)
    parent = parent.cpu_parent
  context = ' '.join(parents)
  if 'Optimizer.step' in context:
    return 'optimizer update'
  backward = 'Backward' in context or 'backward' in name
  if 'attention' in name or 'ScaledDotProduct' in context:
    return 'attention core'
  if name in ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::convolution',
              'aten::mkldnn_convolution', 'aten::convolution_backward',
              'aten::_convolution'):
    if not backward:
      return 'products, forward'
    shapes = [s for s in event.input_shapes if s]
    weight = (name == 'aten::convolution_backward' or
              (len(shapes) >= 2 and len(shapes[0]) == 2 and
               shapes[0][1] == tokens))
    return ('products, weight gradient' if weight else
            'products, input gradient')
  if 'layer_norm' in name:
    return 'LayerNorm'
  if 'gelu' in name:
    return 'GELU'
  if name in ('aten::copy_', 'aten::clone', 'aten::contiguous',
              'aten::_unsafe_view', 'aten::reshape', 'aten::t',
              'aten::transpose', 'aten::permute'):
    return 'copies and transposes'
  return 'other'


def profile_torch(run_step, tokens: int) -> dict:
  """{row: seconds} of one step of timm's model, by aten ops' self time;
  `tokens` is batch x tokens per image (a weight gradient's contraction)."""
  import torch  # pylint: disable=g-import-not-at-top
  with torch.profiler.profile(activities=[
      torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
    run_step()
  seconds = collections.Counter()
  for event in prof.events():
    if event.name.startswith('aten::') and event.self_cpu_time_total:
      seconds[_torch_row(event, tokens)] += event.self_cpu_time_total / 1e6
  return dict(seconds)


def table(name, profiles, flops) -> str:
  """Markdown rows: each row's ms per step per framework, and GFLOP/s
  where `flops` ({row: FLOPs of one step}) gives the work."""
  lines = []
  for row in ROWS:
    cells = [name, row]
    for framework in ('vit_jax', 'timm'):
      seconds = profiles.get(framework, {}).get(row)
      if seconds is None:
        cells += ['-', '-']
        continue
      rate = (f'{flops[framework][row] / seconds / 1e9:.0f}'
              if flops.get(framework, {}).get(row) else '')
      cells += [f'{seconds * 1e3:.0f}', rate]
    lines.append('| ' + ' | '.join(cells) + ' |')
  totals = [sum(p.values()) * 1e3 for p in
            (profiles.get('vit_jax', {}), profiles.get('timm', {}))]
  lines.append(f'| {name} | total (sum of ops) | {totals[0]:.0f} | | '
               f'{totals[1]:.0f} | |')
  return '\n'.join(lines)
