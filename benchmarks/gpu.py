r"""One command for a lent GPU: ViT-B/16 training and inference img/s, MFU
and peak memory, appended as a dated row to docs/performance.md.

  python benchmarks/gpu.py
  benchmarks/gpu.sh       # the same, on an image without ml_collections

bf16 at 224 px, batch 256; after compiling both steps, `--rounds` rounds of
`--steps` steps each, the best round counted: sized for about 3 minutes on
an H200 with jax's start (not yet timed there). MFU: the analytic FLOPs
(matmuls; a training step 3x the forward) x img/s over the chip's
published dense peak (`PEAK_TFLOPS`; omitted for other chips). Peak
memory: the GPU allocator's `peak_bytes_in_use` after the training rounds,
the process's peak so far (with several models, put the largest last).
Only vit_jax's models, flax and optax are imported (`vit_step.py`): no
TensorFlow, no torch; a GPU image without ml_collections needs its wheel
installed first.

On the CPU, the whole path in seconds, into a copy of the doc:

  python benchmarks/gpu.py --models=testing --size=32 --batch=4 \
      --dtype=float32 --doc=/tmp/performance.md
"""

import datetime
import os
import re
import sys

from absl import app
from absl import flags
import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vit_step  # pylint: disable=g-import-not-at-top,wrong-import-position

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'docs', 'performance.md')

flags.DEFINE_list('models', ['ViT-B_16'], 'Presets.')
flags.DEFINE_integer('size', 224, 'Image side.')
flags.DEFINE_integer('batch', 256, 'Images per step.')
flags.DEFINE_string('dtype', 'bfloat16', 'Computation dtype (or auto).')
flags.DEFINE_integer('steps', 10, 'Timed steps per round.')
flags.DEFINE_integer('rounds', 3, 'Rounds; the best one counts.')
flags.DEFINE_string('doc', DOC, 'Markdown file to append the rows to; off a '
                    'GPU only when given.')
FLAGS = flags.FLAGS

# NVIDIA's published dense (no sparsity) tensor-core peaks, TFLOP/s: bf16,
# fp16 for the chips without bf16 (T4, V100). By jax's `device_kind`, in
# full; the A10G, an AWS part, has no NVIDIA datasheet: its figure is the
# one AWS's users quote.
PEAK_TFLOPS = {
    r'NVIDIA H200': 989, r'NVIDIA H100 80GB HBM3': 989,  # SXM
    r'NVIDIA H100 PCIe': 756, r'NVIDIA A100.*': 312, r'NVIDIA L4': 121,
    r'NVIDIA A10G': 70, r'Tesla T4': 65, r'Tesla V100-SXM2.*': 125,
    r'Tesla V100-PCIE.*': 112}

SECTION = '## One GPU (`benchmarks/gpu.py`)'
COLUMNS = ('date', 'device', 'jax', 'model', 'dtype', 'px', 'batch',
           'train img/s', 'train MFU', 'infer img/s', 'infer MFU', 'peak GB',
           'compile s')
INTRO = f"""{SECTION}

`python benchmarks/gpu.py` on one GPU: training (SGD with momentum, state
donated) and inference img/s of random images, the best of a few rounds;
MFU against the chip's published dense bf16 peak (fp16 for T4 and V100; `-`
for a chip not in the script's table); peak GB: the allocator's
`peak_bytes_in_use` after training. Each run appends a row.

| {' | '.join(COLUMNS)} |
{'|---' * len(COLUMNS)}|
"""


def peak_flops(device_kind: str):
  """The published dense peak of `device_kind` in FLOP/s, or None."""
  return next((tflops * 1e12 for kind, tflops in PEAK_TFLOPS.items()
               if re.fullmatch(kind, device_kind)), None)


def with_row(text: str, row: str) -> str:
  """`text` with `row` after the last row of SECTION's table (the section
  added at the end first, if absent)."""
  if SECTION not in text:
    text = (text.rstrip('\n') + '\n\n' if text.strip() else '') + INTRO
  lines = text.split('\n')
  end = next(i for i in range(lines.index(SECTION), len(lines))
             if lines[i].startswith('|'))
  while end < len(lines) and lines[end].startswith('|'):
    end += 1
  return '\n'.join(lines[:end] + [row] + lines[end:])


def measure(name: str) -> dict:
  """img/s of training and inference, compile seconds, peak bytes and the
  dtype (`--dtype=auto`: the device's)."""
  runner = vit_step.JaxRunner(name, batch=FLAGS.batch, size=FLAGS.size,
                              dtype=FLAGS.dtype)
  found = {'compile_s': runner.compile_s, 'dtype': runner.model.dtype}
  for what in ('train', 'infer'):
    found[what] = max(vit_step.img_s(runner, what, FLAGS.steps, FLAGS.batch)
                      for _ in range(FLAGS.rounds))
    if what == 'train':  # None on the CPU
      found['peak'] = (jax.devices()[0].memory_stats() or {}).get(
          'peak_bytes_in_use')
  return found


def row(name: str, found: dict) -> str:
  """The table row of one model's figures."""
  device = jax.devices()[0]
  peak = peak_flops(device.device_kind)
  forward = vit_step.analytic_flops(name, FLAGS.size)
  mfu = {what: f'{found[what] * flops / peak:.0%}' if peak else '-'
         for what, flops in (('train', 3 * forward), ('infer', forward))}
  peak_gb = f'{found["peak"] / 1e9:.1f}' if found['peak'] else '-'
  cells = [datetime.date.today().isoformat(), device.device_kind,
           jax.__version__, name, found['dtype'], FLAGS.size, FLAGS.batch,
           f'{found["train"]:.0f}', mfu['train'], f'{found["infer"]:.0f}',
           mfu['infer'], peak_gb, f'{found["compile_s"]:.0f}']
  return '| ' + ' | '.join(str(c) for c in cells) + ' |'


def main(argv):
  del argv
  rows = [row(name, measure(name)) for name in FLAGS.models]
  print('\n'.join(rows), flush=True)
  if jax.default_backend() != 'gpu' and not FLAGS['doc'].present:
    print(f'Not a GPU: {FLAGS.doc} is left as it is (--doc=PATH writes).')
    return
  text = ''
  if os.path.exists(FLAGS.doc):
    with open(FLAGS.doc) as f:
      text = f.read()
  for line in rows:
    text = with_row(text, line)
  with open(FLAGS.doc, 'w') as f:
    f.write(text)
  print(f'Appended to {FLAGS.doc}.')


if __name__ == '__main__':
  app.run(main)
