r"""Training input pipeline throughput per CPU core: how many cores feed a chip.

Synthetic ImageNet-like JPEGs (random sizes around 500x375, smooth noise,
quality 90: about 100 KB each, as ImageNet's) go through the project's
`pipeline.decode` and `preprocess_train` at 224 px with the paper's
inception crop (area 0.05..1) and flips, without and with the AugReg recipe's
RandAugment (configs/augreg.py). Mixup and CutMix run on the accelerator
inside the jitted step (vit_jax/data/mixing.py), so they cost the host nothing.

  python benchmarks/input_speed.py
  python benchmarks/input_speed.py --cores=2 --seconds=30

The process and its tf.data threads are pinned to `--cores` cores. Prints
per row the images per second per core of wall time, and per CPU-second of
the process: the latter holds when other work shares the cores.
"""

import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Before TensorFlow: its C++ start-up lines stay off the screen (tf_startup).
import vit_jax  # pylint: disable=g-import-not-at-top,unused-import

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf

from vit_jax.configs import augreg
from vit_jax.configs import common
from vit_jax.data import pipeline

flags.DEFINE_integer('cores', 1, 'CPU cores (0..N-1) the pipeline runs on.')
flags.DEFINE_float('seconds', 30., 'Timed seconds per row.')
flags.DEFINE_integer('warmup', 3, 'Batches before timing.')
flags.DEFINE_integer('batch', 64, 'Images per batch.')
flags.DEFINE_integer('images', 256, 'Distinct JPEG files, read repeatedly.')
flags.DEFINE_integer('size', 224, 'Crop side.')
flags.DEFINE_enum('level', 'medium2',
                  [k for k, (randaug, _) in augreg.LEVELS.items() if randaug],
                  'AugReg level whose RandAugment the second row uses '
                  '(configs/augreg.py LEVELS).')
FLAGS = flags.FLAGS


def cpu_model() -> str:
  with open('/proc/cpuinfo') as f:
    for line in f:
      if line.startswith('model name'):
        return line.split(':', 1)[1].strip()
  return 'unknown CPU'


def pin(cores: int):
  """Every thread of this process onto cores 0..cores-1.

  sched_setaffinity(0) moves only the calling thread; threads started
  before (TensorFlow's, at import) are moved one by one. New threads
  inherit their creator's mask.
  """
  mask = set(range(cores))
  for tid in os.listdir('/proc/self/task'):
    try:
      os.sched_setaffinity(int(tid), mask)
    except OSError:  # a thread that ended meanwhile
      pass


def write_jpegs(folder: str, n: int, seed: int = 0) -> list[str]:
  """`n` JPEGs of ImageNet's typical sizes and file sizes.

  Bicubic-upsampled coarse noise gives edges and gradients; fine noise on
  top stands in for texture, without which the files would be a few KB.
  """
  rng = np.random.default_rng(seed)
  paths = []
  for i in range(n):
    h, w = (int(375 * rng.uniform(0.8, 1.2)), int(500 * rng.uniform(0.8, 1.2)))
    if rng.uniform() < 0.25:  # portrait
      h, w = w, h
    coarse = rng.uniform(0, 255, (1, h // 8 + 1, w // 8 + 1, 3))
    image = tf.image.resize(coarse, [h, w], 'bicubic')[0].numpy()
    image += rng.normal(0, 14, image.shape)
    paths.append(os.path.join(folder, f'{i:05d}.jpg'))
    tf.io.write_file(paths[-1], tf.io.encode_jpeg(
        np.clip(image, 0, 255).astype(np.uint8), quality=90))
  return paths


def pipeline(paths, pp, cores: int) -> tf.data.Dataset:
  """The training pipeline's per-example work (`train_iterator`'s
  `process`), on `cores` threads, each op single-threaded."""
  seed = tf.constant([0, 0], tf.int64)

  def process(position, path):
    features = {'image': tf.io.read_file(path), 'label': 0}
    image, _ = pipeline.decode(features, channels=3)
    example_seed = tf.random.experimental.stateless_fold_in(seed, position)
    return pipeline.preprocess_train(image, example_seed, pp)

  ds = tf.data.Dataset.from_tensor_slices(paths).repeat().enumerate()
  ds = ds.map(process, num_parallel_calls=cores).batch(FLAGS.batch)
  options = tf.data.Options()
  options.threading.private_threadpool_size = cores
  options.threading.max_intra_op_parallelism = 1
  return ds.with_options(options)


def measure(ds) -> tuple[float, float, int]:
  """(img/s of wall time, img per CPU-second of the process, batches).

  Each batch is timed; the median counts, so that a burst of other work on
  the machine does not skew the result.
  """
  it = iter(ds)
  for _ in range(FLAGS.warmup):
    next(it)
  walls, cpus = [], []
  start = time.perf_counter()
  while time.perf_counter() - start < FLAGS.seconds:
    wall, cpu = time.perf_counter(), time.process_time()
    next(it)
    walls.append(time.perf_counter() - wall)
    cpus.append(time.process_time() - cpu)
  return (FLAGS.batch / statistics.median(walls),
          FLAGS.batch / statistics.median(cpus), len(walls))


def rows():
  """[(name, pp)]: the paper's inception crop and flip, then AugReg's
  RandAugment on top."""
  pp = common.get_config().pp
  pp.crop, pp.area_min, pp.flip = FLAGS.size, 0.05, True
  randaug = augreg.LEVELS[FLAGS.level][0]
  with_randaug = pp.copy_and_resolve_references()
  with_randaug.randaug = randaug
  return [('decode + inception crop + flip', pp),
          (f'+ RandAugment {randaug} (AugReg {FLAGS.level})', with_randaug)]


def main(argv):
  del argv
  tf.config.set_visible_devices([], 'GPU')  # the host pipeline only
  pin(FLAGS.cores)
  with tempfile.TemporaryDirectory() as folder:
    paths = write_jpegs(folder, FLAGS.images)
    kb = np.mean([os.path.getsize(p) for p in paths]) / 1e3
    print(f'{cpu_model()}, {os.cpu_count()} cores, pipeline on '
          f'{FLAGS.cores}; {FLAGS.images} JPEGs of {kb:.0f} KB on average, '
          f'{FLAGS.size} px, batch {FLAGS.batch}.')
    print('| preprocessing | img/s/core (wall) | img/CPU-s | batches |')
    print('|---' * 4 + '|')
    for name, pp in rows():
      wall, cpu, batches = measure(pipeline(paths, pp, FLAGS.cores))
      print(f'| {name} | {wall / FLAGS.cores:.0f} | {cpu:.0f} | {batches} |',
            flush=True)
  print(f'+ Mixup (AugReg {FLAGS.level}: p={augreg.LEVELS[FLAGS.level][1]}) '
        'runs on the accelerator in the jitted step (vit_jax/data/mixing.py): '
        'the host cost is the row above.')


if __name__ == '__main__':
  app.run(main)
