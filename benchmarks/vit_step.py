"""A preset's jitted training step and forward pass on random images, and
their img/s: what `speed.py` and `gpu.py` time. Only the model package,
flax and optax are imported: no TensorFlow, no torch."""

import time

from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import optax

from vit_jax import models

NUM_CLASSES = 1000


def analytic_flops(name: str, size: int) -> float:
  """Forward FLOPs per image of a plain ViT: matmuls only (2 per MAC)."""
  config = models.MODEL_CONFIGS[name]
  d, t = config.hidden_size, config.transformer
  patch = config.patches.size[0]
  patches = (size // patch)**2
  n = patches + 1  # the class token
  per_layer = 4 * n * d * d + 2 * n * n * d + 2 * n * d * t.mlp_dim
  return 2. * (patches * patch * patch * 3 * d + t.num_layers * per_layer +
               d * NUM_CLASSES)


def train_step(state, batch):
  """A training step as tasks/classification.py's: dropout on, softmax
  cross-entropy."""
  rng = jax.random.fold_in(jax.random.key(0), state.step)

  def loss_fn(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': rng})
    return optax.softmax_cross_entropy(logits, batch['label']).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  return state.apply_gradients(grads=grads), {'loss': loss}


class JaxRunner:
  """vit_jax's model: a jitted SGD step (state donated) and forward pass,
  compiled at construction (`compile_s`)."""

  def __init__(self, name, *, batch, size, dtype, remat_policy='none',
               scan=False):
    transformer = dict(models.MODEL_CONFIGS[name].transformer,
                       remat_policy=remat_policy, scan=scan)
    self.model = models.get_model(name, num_classes=NUM_CLASSES,
                                  dtype=dtype, transformer=transformer)
    self.batch_size = batch
    rng = np.random.default_rng(0)
    self.images = jnp.asarray(rng.uniform(-1, 1, (batch, size, size, 3)),
                              jnp.float32)
    self.labels = jax.nn.one_hot(rng.integers(0, NUM_CLASSES, batch),
                                 NUM_CLASSES)
    params = jax.jit(lambda x: self.model.init(
        jax.random.key(0), x[:1], train=False)['params'])(self.images)
    self.state = train_state.TrainState.create(
        apply_fn=self.model.apply, params=params,
        tx=optax.sgd(0.01, momentum=0.9))
    step = jax.jit(train_step, donate_argnums=0)
    forward = jax.jit(lambda p, x: self.model.apply({'params': p}, x,
                                                    train=False))
    batch = {'image': self.images, 'label': self.labels}
    start = time.perf_counter()
    self.step = step.lower(self.state, batch).compile()
    self.forward = forward.lower(params, self.images).compile()
    self.compile_s = time.perf_counter() - start
    self.batch = batch
    # XLA counts a scanned loop's body once: no whole-model figure then.
    self.flops = {} if scan else {
        'train': self.step.cost_analysis()['flops'] / self.batch_size,
        'infer': self.forward.cost_analysis()['flops'] / self.batch_size}

  def train(self, steps):
    for _ in range(steps):
      self.state, metrics = self.step(self.state, self.batch)
    jax.block_until_ready(metrics)

  def infer(self, steps):
    for _ in range(steps):
      out = self.forward(self.state.params, self.images)
    jax.block_until_ready(out)


def img_s(runner, what: str, steps: int, batch: int) -> float:
  """Images per second of `steps` calls of `runner.train` or `.infer`,
  after one to warm up."""
  getattr(runner, what)(1)
  start = time.perf_counter()
  getattr(runner, what)(steps)
  return steps * batch / (time.perf_counter() - start)
