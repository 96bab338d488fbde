"""`target`: the implementations chosen by the devices a step is traced for,
and the TPU's computing the same model as the CPU's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import models
from vit_jax.platform import target
from vit_jax.models import ops


def _grad_program(platform):
  model = models.get_model('testing', num_classes=3)
  params = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 32, 32, 3)), train=False))["params"]
  loss = lambda p, x: model.apply({'params': p}, x, train=True, rngs={
      'dropout': jax.random.key(0)}).sum()
  with target.compiling_for(platform):
    return jax.jit(jax.grad(loss)).lower(
        params, jax.ShapeDtypeStruct((2, 32, 32, 3), jnp.float32)).as_text()


def test_cpu_tricks_stay_on_the_cpu(monkeypatch):
  """lean_ops' barriers are in the CPU's program only; a TPU process's own
  jit (jax.default_backend() == 'tpu') gets the TPU's."""
  assert 'optimization_barrier' in _grad_program('cpu')
  assert 'optimization_barrier' not in _grad_program('tpu')
  assert target.platform() == jax.default_backend() == 'cpu'
  monkeypatch.setattr(jax, 'default_backend', lambda: 'tpu')
  assert target.platform() == 'tpu'
  with target.compiling_for(jax.devices('cpu')):
    assert target.platform() == 'cpu'
  assert target.platform() == 'tpu'


@pytest.mark.parametrize('dtype,tol', [('float32', 1e-4), ('bfloat16', 0.1)])
def test_tpu_path_computes_the_same_model(dtype, tol):
  """The TPU's implementations, run here, against the CPU's (which the
  timm and numpy tests check): outputs and gradients agree."""
  model = models.get_model('testing', num_classes=5, dtype=dtype,
                           transformer=dict(
                               models.MODEL_CONFIGS['testing'].transformer,
                               dropout_rate=0.0, attention_dropout_rate=0.0))
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  params = model.init(jax.random.key(0), x, train=False)['params']
  params = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(
      jax.random.key(2), p.shape), params)  # a non-zero head

  def value_and_grad(platform):
    loss = lambda p: jnp.sum(model.apply({'params': p}, x, train=True) ** 2)
    with target.compiling_for(platform):
      return jax.jit(jax.value_and_grad(loss))(params)

  (v_cpu, g_cpu), (v_tpu, g_tpu) = value_and_grad('cpu'), value_and_grad('tpu')
  assert float(v_tpu) == pytest.approx(float(v_cpu), rel=tol)
  overall = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g_cpu))
  for a, b in zip(jax.tree.leaves(g_cpu), jax.tree.leaves(g_tpu)):
    scale = float(jnp.max(jnp.abs(a))) + 1e-3 * overall
    assert float(jnp.max(jnp.abs(a - b))) <= 4 * tol * scale


def test_layer_norm_on_tpu_is_float32_flax_arithmetic():
  x = jax.random.normal(jax.random.key(0), (3, 7, 16)).astype(jnp.bfloat16)
  ours = ops.LayerNorm(dtype=jnp.bfloat16)
  params = ours.init(jax.random.key(1), x)
  with target.compiling_for('tpu'):
    y = ours.apply(params, x)
  assert y.dtype == jnp.float32
  reference = nn.LayerNorm(epsilon=1e-6).apply(params, x)
  np.testing.assert_allclose(y, reference, atol=1e-5)
