"""vit_jax.nnx: the Linen models as NNX modules, their parameters back, the
package's optimizer through `nnx.Optimizer`, shardings kept."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

from vit_jax.checkpoints import files
from vit_jax.checkpoints import record
from vit_jax import models
from vit_jax import nnx as vit_nnx
from vit_jax.platform import sharding
from vit_jax.run import optim

# preset: (image side, text length or None for an image model)
PRESETS = {'testing': (32, None), 'Swin-testing': (32, None),
           'Mixer-testing': (32, None), 'MAE-testing': (32, None),
           'SigLIP-testing-towers': (32, 64)}


def _inputs(preset):
  side, length = PRESETS[preset]
  rng = np.random.RandomState(0)
  images = rng.randn(2, side, side, 3).astype(np.float32)
  if length is None:
    return {'x': images}
  return {'images': images,
          'tokens': rng.randint(1, 100, (2, length)).astype(np.int32)}


def _call(fn, inputs, **kw):
  """`fn(x, **kw)` of an image model, `fn(images=, tokens=)` of two towers."""
  if 'x' in inputs:
    return fn(inputs['x'], train=False, **kw)
  return fn(images=inputs['images'], tokens=inputs['tokens'], **kw)


@functools.lru_cache(maxsize=None)
def _linen(preset):
  """(model, random parameters of its shapes, inputs): no initializer's
  zeros (a head's) to hide a wrong forward pass, and no init to run."""
  kw = {} if PRESETS[preset][1] else {'num_classes': 3}
  model = models.get_model(preset, **kw)
  inputs = _inputs(preset)
  shapes = jax.eval_shape(lambda: _call(
      lambda *a, **k: model.init(jax.random.key(0), *a, **k), inputs))
  return model, _random(shapes['params']), inputs


def _random(shapes):
  """Normal draws of `shapes`' leaves (ones, give or take, for scales)."""
  leaves, tree = jax.tree.flatten_with_path(shapes)
  rng = np.random.RandomState(1)
  return jax.tree.unflatten(tree, [
      jnp.asarray(('scale' in jax.tree_util.keystr(path)) +
                  0.2 * rng.randn(*s.shape), s.dtype)
      for path, s in leaves])


@pytest.mark.parametrize('preset', list(PRESETS))
def test_module_is_the_linen_model_and_gives_its_parameters_back(preset):
  model, params, inputs = _linen(preset)
  module = vit_nnx.to_nnx(model, params)
  assert isinstance(module, nnx.Module)
  want = _call(lambda *a, **k: model.apply({'params': params}, *a, **k),
               inputs)
  got = _call(module, inputs)
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6,
                                                       rtol=0), got, want)
  back = vit_nnx.params_of(module)
  assert jax.tree.structure(back) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, back, params)


def _vit(**transformer):
  """'testing' with two blocks (stochastic depth is 0 on a first block)."""
  config = models.MODEL_CONFIGS['testing'].to_dict()
  config['transformer'].update(num_layers=2, **transformer)
  config.pop('model_name')
  model = models.VisionTransformer(**dict(config, num_classes=3))
  x = np.random.RandomState(0).randn(2, 32, 32, 3).astype(np.float32)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x,
                                             train=False))['params']
  return model, _random(shapes), x


def test_dropout_and_stochastic_depth_draw_from_nnx_rngs():
  model, params, x = _vit(dropout_rate=0.0, stochastic_depth=0.5)
  module = vit_nnx.to_nnx(model, params, rngs=nnx.Rngs(dropout=1))
  key = nnx.Rngs(dropout=5).dropout()  # the key a fresh stream gives first
  want = model.apply({'params': params}, x, train=True,
                     rngs={'dropout': key})
  np.testing.assert_allclose(
      module(x, train=True, rngs=nnx.Rngs(dropout=5)), want, atol=1e-6)
  evaluated = module(x, train=False)
  assert np.abs(want - evaluated).max() > 1e-3  # a path was dropped
  # The module's own stream moves on from call to call.
  assert np.abs(module(x, train=True) - module(x, train=True)).max() > 1e-3


def _loss(module, x, labels):
  logits = module(x, train=False)
  return optax.softmax_cross_entropy_with_integer_labels(logits,
                                                         labels).mean()


@nnx.jit
def _step(module, opt, x, labels):
  loss, grads = nnx.value_and_grad(_loss)(module, x, labels)
  vit_nnx.update(opt, module, grads)
  return loss


def test_one_adamw_step_lowers_the_loss():
  model, params, x = _vit()
  module = vit_nnx.to_nnx(model, params)
  opt = vit_nnx.optimizer(module, optax.adamw(1e-2))
  labels = np.array([0, 2])
  before = _step(module, opt, x, labels)
  assert _loss(module, x, labels) < before - 1e-3


def test_the_packages_optimizer_with_layer_decay_steps_as_on_linen():
  """make_optimizer's chain (clip, AdamW, layer decay, a frozen label) on
  the NNX module moves each parameter as optax moves the Linen tree."""
  model, params, x = _vit()
  config = ml_collections.ConfigDict(dict(
      optimizer='adam', base_lr=1e-2, warmup_steps=0, total_steps=10,
      decay_type='cosine', momentum_dtype='float32', weight_decay=1e-4,
      grad_norm_clip=1.0, layer_decay=0.5, accum_steps=1))
  # Labeled as a task labels them: by the Linen tree's keys.
  tx = optim.make_optimizer(config, lambda p: {
      k: optim.FROZEN if k == 'cls' else optim.TRAINED for k in p})
  labels = np.array([0, 2])
  linen_loss = lambda p: _loss(
      lambda x, train: model.apply({'params': p}, x, train=train), x, labels)
  grads = jax.grad(linen_loss)(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  want = optax.apply_updates(params, updates)
  module = vit_nnx.to_nnx(model, params)
  _step(module, vit_nnx.optimizer(module, tx), x, labels)
  got = vit_nnx.params_of(module)
  for (path, g), w in zip(jax.tree.leaves_with_path(got),
                          jax.tree.leaves(want)):
    # A key's bias has no gradient (each query's softmax is shift
    # invariant) but rounding's, which Adam scales up to the step size.
    if "['key']['bias']" not in jax.tree_util.keystr(path):
      np.testing.assert_allclose(g, w, atol=1e-6, err_msg=str(path))
  np.testing.assert_array_equal(got['cls'], params['cls'])
  # Layer decay took part: the embedding moved less than the head.
  moved = lambda p: np.abs(np.asarray(p[0]) - p[1]).max()
  assert moved((got['embedding']['kernel'], params['embedding']['kernel'])) < (
      moved((got['head']['kernel'], params['head']['kernel'])))


def test_sharded_parameters_keep_their_shardings():
  model, params, inputs = _linen('MAE-testing')  # has FSDP-split leaves
  mesh = sharding.make_mesh([('data', -1)])
  shardings = sharding.tree_shardings(params, mesh, strategy='fsdp')
  params = jax.device_put(params, shardings)
  split = [s for s in jax.tree.leaves(shardings) if s.spec != ()]
  assert split, 'no leaf of MAE-testing is split: the check would be empty'
  module = vit_nnx.to_nnx(model, params)
  same = lambda p, s: p.sharding.is_equivalent_to(s, p.ndim)
  assert all(jax.tree.leaves(jax.tree.map(
      same, vit_nnx.params_of(module), shardings)))
  # A jitted training step leaves them where they were.
  opt = vit_nnx.optimizer(module, optax.adamw(1e-3))
  data = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  x = jax.device_put(np.tile(inputs['x'], (4, 1, 1, 1)), data)

  @nnx.jit
  def step(module, opt, x):
    loss = lambda m: jnp.mean(m(x, train=False) ** 2)
    vit_nnx.update(opt, module, nnx.grad(loss)(module))

  step(module, opt, x)
  assert all(jax.tree.leaves(jax.tree.map(
      same, vit_nnx.params_of(module), shardings)))


def test_from_pretrained_gives_the_checkpoints_module(tmp_path):
  """An .npz and its record, as a run exports them, by its path alone."""
  model, params, inputs = _linen('testing')
  path = tmp_path / 'testing.npz'
  files.save(params, path)
  record.write(path, record.model_record('testing', model))
  module, transform = vit_nnx.from_pretrained(str(path))
  assert transform.size == 32
  np.testing.assert_allclose(
      module(inputs['x'], train=False),
      model.apply({'params': params}, inputs['x'], train=False), atol=1e-6)
  jax.tree.map(np.testing.assert_array_equal, vit_nnx.params_of(module),
               params)


def test_a_parameter_named_as_an_nnx_attribute_is_refused():
  class Clash(nn.Module):
    @nn.compact
    def __call__(self, x):
      return x * self.param('lazy_init', nn.initializers.ones, ())

  with pytest.raises(ValueError, match="Clash: the parameter 'lazy_init'"):
    vit_nnx.to_nnx(Clash(), {'lazy_init': jnp.ones(())})
