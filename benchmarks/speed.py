r"""Training and inference speed of a ViT preset, side by side with timm's.

For each preset: img/s of inference and of a training step (forward,
backward, SGD with momentum, state donated), FLOPs per image from XLA's
`cost_analysis` against the analytic count, MFU against a matmul peak
measured in the same run, compile time and peak memory. With torch and timm
installed (`pip install -e '.[bench]'`), timm's same model runs under the
same settings, alternating with vit_jax round by round, and the table gives
the ratios.

  python benchmarks/speed.py --models=ViT-Ti_16,ViT-S_16,ViT-B_16 \
      --size=224 --batch=32

On one GPU (an H200, ~139 GiB), bf16 computation, without timm:

  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 python benchmarks/speed.py \
      --dtype=bfloat16 --models=ViT-B_16,ViT-L_16 --size=224 --batch=128 \
      --timm=no --nomemory

A training step of ViT-L/16 in bf16 holds about 0.9 GB per image (XLA's
buffer estimate, measured on a CPU), so 128 images fill most of the GPU
(ViT-B/16 takes about 0.25 GB each). `--nomemory`: the peak memory is the
host's, and its child processes would not find the GPU free. It prints the
device and its measured float32 matmul peak, then per model and task (train,
infer) the img/s, GFLOP per image (XLA's count / the analytic one), MFU
against that peak (bf16 can pass 100% of a float32 peak) and compile
seconds. Only the model package, flax and optax are needed: no TensorFlow
or data stack.
"""

import json
import os
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

try:  # before anything that may import TensorFlow: their LLVMs clash
  import timm  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
except ImportError:
  timm = torch = None

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import jax
import numpy as np

from vit_jax import models

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import op_profile  # pylint: disable=g-import-not-at-top,wrong-import-position
import vit_step  # pylint: disable=g-import-not-at-top,wrong-import-position

flags.DEFINE_list('models', ['ViT-Ti_16', 'ViT-S_16', 'ViT-B_16'], 'Presets.')
flags.DEFINE_integer('size', 224, 'Image side.')
flags.DEFINE_integer('batch', 32, 'Images per step.')
flags.DEFINE_string('dtype', 'float32', 'Computation dtype of vit_jax.')
flags.DEFINE_string('remat_policy', 'none', 'vit_jax transformer.remat_policy.')
flags.DEFINE_bool('scan', False, 'vit_jax transformer.scan.')
flags.DEFINE_integer('steps', 5, 'Timed steps per round.')
flags.DEFINE_integer('rounds', 3, 'Alternating rounds; the best one counts.')
flags.DEFINE_enum('timm', 'auto', ['auto', 'yes', 'no'],
                  'Also run timm (auto: if it is installed).')
flags.DEFINE_bool('memory', True, 'Measure peak memory (child processes).')
flags.DEFINE_bool('profile', False, 'Also print where one training step\'s '
                  'time goes, op by op, in both frameworks (op_profile.py).')
flags.DEFINE_string('child', None, 'Internal: `jax:MODEL` or `timm:MODEL`, '
                    'run training steps and print the peak RSS.')
FLAGS = flags.FLAGS

TIMM_NAMES = {'ViT-Ti_16': 'vit_tiny_patch16_224',
              'ViT-S_16': 'vit_small_patch16_224',
              'ViT-B_16': 'vit_base_patch16_224',
              'ViT-B_32': 'vit_base_patch32_224',
              'ViT-L_16': 'vit_large_patch16_224'}


def row_flops(name: str, size: int) -> dict:
  """FLOPs of one training step per op_profile row (analytic, 2 per MAC):
  the attention core's products forward and backward, the other products
  in each of their three passes."""
  config = models.MODEL_CONFIGS[name]
  d, layers = config.hidden_size, config.transformer.num_layers
  patch = config.patches.size[0]
  n = (size // patch)**2 + 1
  attention = 2. * 2 * n * n * d * layers * FLAGS.batch  # q k^T, w v
  products = vit_step.analytic_flops(name, size) * FLAGS.batch - attention
  embedding = 2. * (n - 1) * patch * patch * 3 * d * FLAGS.batch
  return {'products, forward': products,
          'products, input gradient': products - embedding,
          'products, weight gradient': products,
          'attention core': 3 * attention}  # forward, 2x backward


def matmul_peak(n: int = 2048, repeats: int = 10) -> float:
  """Best FLOP/s of a float32 n x n matmul: the machine's practical peak.

  The best of many repeats, since other work on the machine only slows it.
  """
  a = jax.random.normal(jax.random.key(0), (n, n))
  matmul = jax.jit(lambda x: x @ x)
  jax.block_until_ready(matmul(a))
  best = float('inf')
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(matmul(a))
    best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def jax_runner(name):
  """vit_jax's runner (`vit_step.JaxRunner`) under this run's flags."""
  return vit_step.JaxRunner(name, batch=FLAGS.batch, size=FLAGS.size,
                            dtype=FLAGS.dtype,
                            remat_policy=FLAGS.remat_policy, scan=FLAGS.scan)


class TimmRunner:
  """timm's same model, SGD with momentum, on the CPU with all cores."""

  def __init__(self, name):
    torch.set_num_threads(os.cpu_count())
    self.model = timm.create_model(TIMM_NAMES[name], pretrained=False,
                                   num_classes=vit_step.NUM_CLASSES)
    rng = np.random.default_rng(0)
    shape = (FLAGS.batch, 3, FLAGS.size, FLAGS.size)
    self.images = torch.from_numpy(rng.uniform(-1, 1, shape).astype(
        np.float32))
    self.labels = torch.from_numpy(
        rng.integers(0, vit_step.NUM_CLASSES, FLAGS.batch))
    self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01,
                                     momentum=0.9)
    self.compile_s = 0.

  def train(self, steps):
    self.model.train()
    for _ in range(steps):
      self.optimizer.zero_grad(set_to_none=True)
      loss = torch.nn.functional.cross_entropy(
          self.model(self.images), self.labels)
      loss.backward()
      self.optimizer.step()

  def infer(self, steps):
    self.model.eval()
    with torch.inference_mode():
      for _ in range(steps):
        self.model(self.images)


def _timm_available():
  if FLAGS.timm == 'yes' and timm is None:
    raise ImportError("--timm=yes needs torch and timm: pip install -e "
                      "'.[bench]'")
  return FLAGS.timm != 'no' and timm is not None


def _img_s(runner, what):
  return vit_step.img_s(runner, what, FLAGS.steps, FLAGS.batch)


def _rss_gb(field):
  """'VmRSS' (now) or 'VmHWM' (peak) of this process, from /proc (Linux)."""
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024 / 1e9
  raise OSError(f'No {field} in /proc/self/status.')


def peak_memory_gb(framework, name):
  """Peak memory of training `name`, in a child process of its own."""
  result = subprocess.run(
      [sys.executable, __file__, f'--child={framework}:{name}',
       f'--size={FLAGS.size}', f'--batch={FLAGS.batch}',
       f'--dtype={FLAGS.dtype}', f'--remat_policy={FLAGS.remat_policy}',
       f'--scan={FLAGS.scan}', '--steps=2'],
      capture_output=True, text=True, check=True)
  return json.loads(result.stdout.strip().splitlines()[-1])['peak_gb']


def _child(spec):
  """Peak RSS while training, above the RSS after the imports.

  Both frameworks are imported in both children, so the difference is what
  the model, its optimizer state and its steps take. The peak is measured
  after a first step, so that XLA's compilation does not count.
  """
  framework, name = spec.split(':')
  imports = _rss_gb('VmRSS')
  runner = (jax_runner if framework == 'jax' else TimmRunner)(name)
  runner.train(1)
  with open('/proc/self/clear_refs', 'w') as f:
    f.write('5')  # resets VmHWM to the current RSS
  runner.train(FLAGS.steps)
  print(json.dumps({'peak_gb': _rss_gb('VmHWM') - imports}))


def _profile(name, jax_runner, with_timm):
  """({framework: {row: seconds}}, {framework: {row: FLOPs}}) of one
  training step, after a warm-up step."""
  flops = row_flops(name, FLAGS.size)
  jax_runner.train(1)
  found = {'vit_jax': op_profile.profile_xla(
      jax_runner.step, lambda: jax_runner.train(1), jax_runner.state.params)}
  if with_timm:
    runner = TimmRunner(name)
    runner.train(1)
    patch = models.MODEL_CONFIGS[name].patches.size[0]
    tokens = FLAGS.batch * ((FLAGS.size // patch)**2 + 1)
    found['timm'] = op_profile.profile_torch(lambda: runner.train(1), tokens)
  return found, {'vit_jax': flops, 'timm': flops}


def _measure(name, with_timm):
  """Best img/s over alternating rounds, per framework and task."""
  runners = {'vit_jax': jax_runner(name)}
  if with_timm:
    runners['timm'] = TimmRunner(name)
  best = {(f, w): 0. for f in runners for w in ('train', 'infer')}
  for _ in range(FLAGS.rounds):
    for framework, runner in runners.items():
      for what in ('train', 'infer'):
        best[framework, what] = max(best[framework, what],
                                    _img_s(runner, what))
  return runners['vit_jax'], best


def main(argv):
  del argv
  if FLAGS.child:
    return _child(FLAGS.child)
  with_timm = _timm_available()
  peak = max(matmul_peak(), matmul_peak(3072))
  print(f'{jax.devices()[0].device_kind}, {os.cpu_count()} cores; float32 '
        f'matmul peak {peak / 1e9:.1f} GFLOP/s; {FLAGS.size} px, batch '
        f'{FLAGS.batch}, vit_jax in {FLAGS.dtype}, remat '
        f'{FLAGS.remat_policy}, scan {FLAGS.scan}.')
  print('| model | task | vit_jax img/s | timm img/s | ratio | GFLOP/img '
        '(XLA / analytic) | MFU vit_jax | MFU timm | peak GB vit_jax | '
        'peak GB timm | compile s |')
  print('|---' * 11 + '|')
  profiles = {}
  for name in FLAGS.models:
    jax_runner, best = _measure(name, with_timm)
    forward = vit_step.analytic_flops(name, FLAGS.size)
    memory = {f: peak_memory_gb(f, name) if FLAGS.memory else float('nan')
              for f in (['jax', 'timm'] if with_timm else ['jax'])}
    if FLAGS.profile:
      profiles[name] = _profile(name, jax_runner, with_timm)
    for what, analytic in (('train', 3 * forward), ('infer', forward)):
      ours, theirs = best['vit_jax', what], best.get(('timm', what))
      row = [name, what, f'{ours:.1f}',
             f'{theirs:.1f}' if theirs else '-',
             f'{ours / theirs:.2f}' if theirs else '-',
             f'{jax_runner.flops.get(what, float("nan")) / 1e9:.2f} / '
             f'{analytic / 1e9:.2f}',
             f'{ours * analytic / peak:.0%}',
             f'{theirs * analytic / peak:.0%}' if theirs else '-',
             f'{memory["jax"]:.2f}' if what == 'train' else '',
             f'{memory.get("timm", float("nan")):.2f}'
             if what == 'train' and with_timm else '',
             f'{jax_runner.compile_s:.1f}' if what == 'train' else '']
      print('| ' + ' | '.join(row) + ' |', flush=True)
  if profiles:
    print('\nOne training step, op by op (ms; GFLOP/s where counted):\n')
    print('| model | ops | vit_jax ms | vit_jax GFLOP/s | timm ms | '
          'timm GFLOP/s |')
    print('|---' * 6 + '|')
    for name, (found, flops) in profiles.items():
      print(op_profile.table(name, found, flops))


if __name__ == '__main__':
  app.run(main)
