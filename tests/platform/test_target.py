"""`target`: the implementations chosen by the devices a step is traced for,
the TPU's computing the same model as the CPU's, and the computation dtype
that `dtype='auto'` gives on each kind of device (devices faked)."""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax import launch
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.configs import default
from vit_jax.models import ops
from vit_jax.platform import sharding
from vit_jax.platform import target


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


def _device(platform, capability=None):
  device = types.SimpleNamespace(platform=platform)
  if capability is not None:
    device.compute_capability = capability
  return device


# (device, dtype for training, dtype for inference)
DTYPES = {
    'TPU': (_device('tpu'), 'bfloat16', 'bfloat16'),
    'H100': (_device('gpu', '9.0'), 'bfloat16', 'bfloat16'),
    'A100': (_device('gpu', '8.0'), 'bfloat16', 'bfloat16'),
    'T4: no bf16, no loss scaling': (_device('gpu', '7.5'), 'float32',
                                     'float16'),
    'V100': (_device('gpu', '7.0'), 'float32', 'float16'),
    'P100: no fp16 tensor cores': (_device('gpu', '6.0'), 'float32',
                                   'float32'),
    'GPU of unknown capability': (_device('gpu'), 'float32', 'float32'),
    'CPU': (_device('cpu'), 'float32', 'float32'),
}


@pytest.mark.parametrize('case', DTYPES.values(), ids=DTYPES.keys())
def test_compute_dtype(case):
  device, training, inference = case
  assert target.compute_dtype([device]) == training
  assert target.compute_dtype([device], training=False) == inference


def test_auto_dtype_on_the_cpu_is_float32():
  assert target.compute_dtype() == 'float32'
  model = models.get_model('testing', num_classes=3, dtype='auto')
  assert model.dtype == 'float32'
  x = jnp.zeros((1, 32, 32, 3))
  variables = model.init(jax.random.key(0), x, train=False)
  assert model.apply(variables, x, train=False).dtype == jnp.float32


def test_a_run_settles_auto_for_its_mesh(monkeypatch):
  config = default.get_config()
  with config.unlocked():
    config.model.dtype = 'auto'
  mesh = sharding.make_mesh(config.mesh)
  settle = launch._settled_dtype  # pylint: disable=protected-access
  settled = settle(config, mesh, training=True)
  assert settled.model.dtype == 'float32' and config.model.dtype == 'auto'
  assert settle(settled, mesh, training=True) is settled
  asked = []  # an evaluation asks for its mesh's inference dtype
  monkeypatch.setattr(target, 'compute_dtype', lambda devices, training: (
      asked.append((devices, training)) or 'float16'))
  assert settle(config, mesh, training=False).model.dtype == 'float16'
  assert asked == [(mesh, False)]


def test_loaded_checkpoints_take_the_inference_dtype(monkeypatch, tmp_path):
  """predict, analysis and `from_pretrained` load through `load_model`:
  `dtype='auto'` is asked for inference there (a T4's float16)."""
  model = models.get_model('testing', num_classes=3)
  params = model.init(jax.random.key(0), jnp.zeros((1, 32, 32, 3)),
                      train=False)['params']
  files.save(params, tmp_path / 'testing.npz')
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  monkeypatch.setattr(jax, 'devices', lambda *a: [_device('gpu', '7.5')])
  config = dict(models.MODEL_CONFIGS['testing'].to_dict(), dtype='auto')
  loaded, _, size = loading.load_model(config, str(tmp_path / 'testing.npz'))
  assert loaded.dtype == 'float16' and size == 32
  assert models.get_model('testing', num_classes=3,
                          dtype='auto').dtype == 'float32'  # training
