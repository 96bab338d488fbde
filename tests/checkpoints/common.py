"""What the checkpoint tests share: small models of each family, their
parameters as random draws, and comparisons of parameter trees."""

import jax
import jax.numpy as jnp
import numpy as np

from tests.helpers import param_shapes
from tests.helpers import random_params
from vit_jax import models


def _model(**kw):
  kw.setdefault('num_classes', 3)
  return models.get_model('testing', **kw)


def _random_params(model, size=(32, 32), seed=0):
  """Non-zero float32 parameters shaped like `model`'s on `size` images."""
  return random_params(model, jnp.zeros((1, *size, 3)), train=False,
                       seed=seed, scale=0.3)


def _init(model, size):
  """Stands in for `model.init`, whose jitted RNG is slow to compile on CPU.

  Random non-head parameters, and the head `model.init` makes: a zero kernel
  and a `head_bias_init` bias.
  """
  params = _random_params(model, size, seed=1)
  params['head'] = {
      'kernel': np.zeros_like(params['head']['kernel']),
      'bias': np.full_like(params['head']['bias'],
                           getattr(model, 'head_bias_init', 0.))}
  return params


def _apply(model, params, size, seed=0):
  x = np.random.default_rng(seed).uniform(-1, 1, (2, *size, 3))
  return np.asarray(jax.jit(lambda p, x: model.apply(
      {'params': p}, x, train=False))(params, jnp.asarray(x, jnp.float32)))


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(x, y)


def _transformer(**kw):
  return dict(dict(num_layers=1, mlp_dim=10, num_heads=2), **kw)


def _hybrid(**kw):
  """A tiny R26-style hybrid: root and 2 stages (8x down), 2x2 patches."""
  kw.setdefault('num_classes', 3)
  return models.get_model(
      'R26+ViT-S_32', hidden_size=12, patches=dict(size=(2, 2)),
      transformer=_transformer(num_layers=2, stochastic_depth=0.1),
      resnet=dict(num_layers=(1, 1), width_factor=0.5), **kw)


def _mixer(**kw):
  kw.setdefault('num_classes', 3)
  return models.get_model('Mixer-testing', **kw)


def _outputs(model, size, *trees):
  """`model`'s outputs for each parameter tree, on the same inputs."""
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, *size, 3)),
                  jnp.float32)
  fn = jax.jit(lambda p: model.apply({'params': p}, x, train=False))
  return [np.asarray(fn(p)) for p in trees]


def _without(tree, *keys):
  return {k: v for k, v in tree.items() if k not in keys}


def _shapes(model, size=(32, 32)):
  return param_shapes(model, jnp.zeros((1, *size, 3)), train=False)


def _notes(capsys):
  return capsys.readouterr().err.splitlines()
