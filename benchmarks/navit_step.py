r"""NaViT's training step on a packed batch against the same images padded
to the largest, side by side in one run: img/s, tokens/s, their ratio and
each layout's packing efficiency (real tokens / all tokens).

  python benchmarks/navit_step.py --sequences=16 --max_tokens=256

The images are those of configs/navit_fmnist.py's first training batch:
their grids from the packer's recipes (a longer side of 14..56 px, aspect
ratio 1:2..2:1, patch 7), their pixels random. Packed: greedily into
`sequences` rows of `max_tokens`, as training does. Padded: each image alone
in its own row, padded to the largest image's token count; the same model
and parameters, the same segment mask (padding is segment 0), one image a
row. Both steps are tasks/navit.py's loss (cross-entropy over real images)
with the config's AdamW, jitted, warmed up, then timed `repeats` times in
turn (so that a busy machine slows them alike); each figure is a median.
"""

import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import flags  # pylint: disable=g-import-not-at-top
from flax.training import train_state
import jax
import numpy as np

from vit_jax import cli
from vit_jax.configs import navit_fmnist
from vit_jax.data import navit as navit_data
from vit_jax.data import packing
from vit_jax.models import navit as models_navit
from vit_jax.run import optim
from vit_jax.tasks import navit

flags.DEFINE_integer('sequences', 0, "Packed rows (0: the config's batch).")
flags.DEFINE_integer('max_tokens', 0,
                     "Tokens a packed row (0: the config's).")
flags.DEFINE_string('posemb', '', "NaViT's posemb ('': the config's).")
flags.DEFINE_integer('seed', 0, 'Seed of the recipes.')
flags.DEFINE_integer('steps', 3, 'Steps per timed repeat.')
flags.DEFINE_integer('repeats', 5, 'Timed repeats; the median is reported.')
FLAGS = flags.FLAGS
NUM_CLASSES = 10


def get_config():
  config = navit_fmnist.get_config('navit').unlock()
  config.batch = FLAGS.sequences or config.batch
  config.navit.max_tokens = FLAGS.max_tokens or config.navit.max_tokens
  config.model.posemb = FLAGS.posemb or config.model.posemb
  config.navit.drop_rate = (0.0, 0.0)
  return config.lock()


def first_batch_images(config):
  """The examples of the config's first packed batch, as lists per row:
  grids from the recipes, random pixels."""
  sizes = navit_data.sampling(config)
  recipes = packing.Recipes(FLAGS.seed, sizes)
  packer = packing.Packer(recipes.token_counts(), config.navit.max_tokens,
                          config.model.max_images, config.navit.window)
  rng = np.random.default_rng(FLAGS.seed)
  p = sizes.patch

  def example(position):
    h, w = int(recipes[position]['height']), int(recipes[position]['width'])
    image = rng.integers(0, 256, (h * p, w * p, 3), np.uint8)
    return packing.example(image, rng.integers(NUM_CLASSES), h, w, p)

  return [[example(k) for k in packer.next_sequence()]
          for _ in range(config.batch)]


def layouts(config, plan):
  """{'packed': batch, 'padded': batch} of the same examples."""
  dim = config.model.patches.size[0]**2 * 3
  alone = [[ex] for row in plan for ex in row]
  largest = max(len(ex['rows']) for ex, in alone)
  return {'packed': packing.pack(plan, config.navit.max_tokens,
                                 config.model.max_images, dim),
          'padded': packing.pack(alone, largest, 1, dim)}


def make_step(config, model, params, batch):
  """A function running n steps of `model` on `batch` in place."""
  state = train_state.TrainState.create(
      apply_fn=model.apply, tx=optim.make_optimizer(config),
      params=jax.tree.map(np.copy, params))
  batch = jax.device_put(batch)  # an argument, not a constant of the step

  def step(state, batch):
    def loss_fn(p):
      logits = state.apply_fn({'params': p},
                              {k: batch[k] for k in packing.KEYS},
                              train=True, rngs={'dropout': jax.random.key(0)})
      return navit.image_loss(logits, batch['labels'])
    value, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), value

  step = jax.jit(step, donate_argnums=0)
  holder = [state]

  def run(n):
    for _ in range(n):
      holder[0], loss = step(holder[0], batch)
    jax.block_until_ready(loss)

  return run


def main(argv):
  del argv
  config = get_config()
  model_args = {k: v for k, v in config.model.to_dict().items()
                if k != 'model_name'}
  packed_model = models_navit.NaViT(num_classes=NUM_CLASSES, **model_args)
  batches = layouts(config, first_batch_images(config))
  models = {'packed': packed_model,
            'padded': packed_model.clone(max_images=1)}
  params = packed_model.init(jax.random.key(0), {
      k: v[:1] for k, v in batches['packed'].items()}, train=False)['params']
  steps = {name: make_step(config, models[name], params, batches[name])
           for name in batches}
  for run in steps.values():
    run(2)  # compile, warm up
  seconds = {name: [] for name in steps}
  for _ in range(FLAGS.repeats):
    for name, run in steps.items():
      start = time.perf_counter()
      run(FLAGS.steps)
      seconds[name].append((time.perf_counter() - start) / FLAGS.steps)
  report(config, batches, seconds)


def report(config, batches, seconds):
  num_images = int(np.sum(batches['packed']['labels'] >= 0))
  real = int(np.sum(batches['packed']['segment_ids'] > 0))
  print(f"configs/navit_fmnist.py's model (posemb {config.model.posemb!r}, "
        f'pool {config.model.pool!r}); {num_images} images of 14..56 px, '
        f'{real} real tokens; {jax.devices()[0].device_kind}; median of '
        f'{FLAGS.repeats} x {FLAGS.steps} steps')
  print('| layout | rows x tokens | packing efficiency | ms/step | img/s | '
        'real tokens/s | vs padded |')
  print('|---|---|---|---|---|---|---|')
  base = statistics.median(seconds['padded'])
  for name in ('packed', 'padded'):
    t = statistics.median(seconds[name])
    seg = batches[name]['segment_ids']
    print(f'| {name} | {seg.shape[0]} x {seg.shape[1]} | '
          f'{packing.efficiency(seg):.3f} | {1e3 * t:.1f} | '
          f'{num_images / t:.0f} | {real / t:.0f} | {base / t:.2f}x |')


if __name__ == '__main__':
  cli.run(main)
