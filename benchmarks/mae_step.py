r"""The MAE training step against the supervised step of the same encoder, on
the same batch, side by side in one run: img/s and their ratio per mask
ratio (the encoder sees only the kept patches, so its cost falls).

  python benchmarks/mae_step.py --model=ViT-Ti_16 --size=224 --batch=32

Both steps are jitted, warmed up, then timed `repeats` times in turn (so
that a busy machine slows them alike); each figure is the median. The
supervised step is tasks/classification.py's without Mixup: softmax
cross-entropy on a 1000-class head. The MAE step is tasks/mae.py's.
`--model=fmnist` is the default job's ViT (configs/default.py).
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
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax import cli
from vit_jax import models
from vit_jax.configs import default
from vit_jax.models import mae as models_mae
from vit_jax.run import optim
from vit_jax.tasks import mae

flags.DEFINE_string('model', 'ViT-Ti_16', "A ViT preset, or 'fmnist'.")
flags.DEFINE_integer('size', 224, 'Image side (28 for fmnist).')
flags.DEFINE_integer('batch', 32, 'Images per step.')
flags.DEFINE_list('ratios', ['0', '0.5', '0.75'], 'Mask ratios.')
flags.DEFINE_list('decoder', ['128', '2', '4', '512'],
                  'MAE decoder: hidden_size, num_layers, num_heads, mlp_dim.')
flags.DEFINE_integer('steps', 3, 'Steps per timed repeat.')
flags.DEFINE_integer('repeats', 5, 'Timed repeats; the median is reported.')
FLAGS = flags.FLAGS
NUM_CLASSES = 1000


def encoder_config(name):
  if name == 'fmnist':
    return default.get_config().model.to_dict()
  return models.MODEL_CONFIGS[name].to_dict()


def supervised_step(state, batch):
  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': jax.random.key(0)})
    return optax.softmax_cross_entropy(logits, batch['label']).mean()

  value, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


def make_steps(config, images, labels):
  """{name: a function running one step in place}: supervised, then MAE at
  each ratio, each with its own state."""
  tx = optim.make_optimizer(ml_collections.ConfigDict(dict(
      optimizer='adamw', base_lr=1e-4, weight_decay=0.05, total_steps=100,
      warmup_steps=10, decay_type='cosine', grad_norm_clip=1.0,
      momentum_dtype='float32', accum_steps=1)))
  encoder = models_mae.encoder_config(config)
  classifier = models.VisionTransformer(num_classes=NUM_CLASSES, **encoder)
  hidden, layers, heads, mlp = map(int, FLAGS.decoder)
  autoencoder = models_mae.MaskedAutoencoder(encoder=encoder, decoder=dict(
      hidden_size=hidden, num_layers=layers, num_heads=heads, mlp_dim=mlp))
  steps = {}
  params = classifier.init(jax.random.key(0), images[:1], train=False)
  states = {'supervised': train_state.TrainState.create(
      apply_fn=classifier.apply, params=params['params'], tx=tx)}
  fns = {'supervised': jax.jit(lambda s: supervised_step(
      s, {'image': images, 'label': labels}), donate_argnums=0)}
  num_patches = models_mae.patchify(images[:1], autoencoder.patch).shape[1]
  params = autoencoder.init(jax.random.key(0), images[:1],
                            jnp.arange(num_patches)[None], train=False)
  for ratio in map(float, FLAGS.ratios):
    name = f'mae {ratio:g}'
    states[name] = train_state.TrainState.create(
        apply_fn=autoencoder.apply, tx=tx,  # a copy each: states are donated
        params=jax.tree.map(jnp.copy, params['params']))
    fns[name] = jax.jit(lambda s, r=ratio: mae.train_step(
        s, images, jax.random.fold_in(jax.random.key(1), s.step),
        patch=autoencoder.patch, ratio=r, norm_pix=True), donate_argnums=0)

  for name, fn in fns.items():
    def run(n, name=name, fn=fn):
      for _ in range(n):
        states[name], metrics = fn(states[name])
      jax.block_until_ready(metrics)
    steps[name] = run
  return steps


def main(argv):
  del argv
  shape = (FLAGS.batch, FLAGS.size, FLAGS.size, 3)
  rng = np.random.default_rng(0)
  images = jnp.asarray(rng.uniform(-1, 1, shape), jnp.float32)
  labels = jax.nn.one_hot(rng.integers(0, NUM_CLASSES, FLAGS.batch),
                          NUM_CLASSES)
  steps = make_steps(encoder_config(FLAGS.model), images, labels)
  for run in steps.values():
    run(2)  # compile, warm up
  seconds = {name: [] for name in steps}
  for _ in range(FLAGS.repeats):
    for name, run in steps.items():
      start = time.perf_counter()
      run(FLAGS.steps)
      seconds[name].append((time.perf_counter() - start) / FLAGS.steps)
  hidden, layers, heads, mlp = FLAGS.decoder
  print(f'{FLAGS.model} at {FLAGS.size} px, batch {FLAGS.batch}; MAE decoder '
        f'{layers} blocks of width {hidden} ({heads} heads, MLP {mlp}); '
        f'{jax.devices()[0].device_kind}; median of '
        f'{FLAGS.repeats} x {FLAGS.steps} steps')
  print('| step | ms/step | img/s | vs supervised |')
  print('|---|---|---|---|')
  base = statistics.median(seconds['supervised'])
  for name, times in seconds.items():
    t = statistics.median(times)
    print(f'| {name} | {1e3 * t:.1f} | {FLAGS.batch / t:.0f} | '
          f'{base / t:.2f}x |')


if __name__ == '__main__':
  cli.run(main)
