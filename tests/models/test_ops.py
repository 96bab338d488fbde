"""lean_ops: values and gradients against numpy written from the equations
(gradients by central differences in float64), and a ViT training step that
keeps no (tokens x tokens) array and no extra copy per block."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from vit_jax.models import ops
from vit_jax.models import vit as models_vit


def _numeric_grad(f, x, eps=1e-5):
  """d sum(f(x) * w) / dx by central differences, float64."""
  x = np.asarray(x, np.float64)
  grad = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    up, down = x.copy(), x.copy()
    up[i] += eps
    down[i] -= eps
    grad[i] = (f(up) - f(down)) / (2 * eps)
  return grad


def _gelu_np(x, approximate):
  if approximate:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) *
                                  (x + 0.044715 * x**3)))
  erf = np.vectorize(math.erf)
  return 0.5 * x * (1 + erf(x / np.sqrt(2)))


@pytest.mark.parametrize('approximate', [True, False])
def test_gelu_value_and_gradient(approximate):
  x = np.linspace(-5, 5, 41).astype(np.float32)
  w = np.cos(np.arange(41)).astype(np.float32)
  np.testing.assert_allclose(ops.gelu(x, approximate),
                             _gelu_np(x, approximate), atol=1e-6)
  grad = jax.grad(lambda x: jnp.sum(ops.gelu(x, approximate) * w))(x)
  want = _numeric_grad(lambda x: np.sum(_gelu_np(x, approximate) * w), x)
  np.testing.assert_allclose(grad, want, atol=1e-5)


@pytest.mark.parametrize('approximate', [True, False])
def test_gelu_dot_general_value_and_gradients(approximate):
  rng = np.random.default_rng(3)
  h, kernel = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5))
  w = rng.normal(size=(2, 3, 5))
  dims = (((2,), (0,)), ((), ()))
  args = [a.astype(np.float32) for a in (h, kernel)]

  def want_np(h, kernel):
    return np.einsum('btm,mo->bto', _gelu_np(h, approximate), kernel)

  got = ops.gelu_dot_general(*args, dims, approximate=approximate)
  np.testing.assert_allclose(got, want_np(h, kernel), atol=1e-5)
  grads = jax.grad(lambda *a: jnp.sum(ops.gelu_dot_general(
      *a, dims, approximate=approximate) * w), (0, 1))(*args)
  np.testing.assert_allclose(grads[0], _numeric_grad(
      lambda h: np.sum(want_np(h, kernel) * w), h), atol=1e-4)
  np.testing.assert_allclose(grads[1], _numeric_grad(
      lambda k: np.sum(want_np(h, k) * w), kernel), atol=1e-4)


def test_mlp_block_is_dense_gelu_dense_with_and_without_dropout():
  """The MLP with GELU inside the second product, and the one with dropout
  between (GELU apart), compute Dense, GELU, Dense."""
  block = models_vit.MlpBlock(mlp_dim=6, dropout_rate=0.5,
                              gelu_approximate=False)
  x = np.random.default_rng(4).normal(size=(2, 3, 4)).astype(np.float32)
  params = block.init(jax.random.key(0), x, deterministic=True)['params']
  params = jax.tree.map(lambda a: a + 0.1, params)  # biases not zero
  dense = lambda name, x: x @ params[name]['kernel'] + params[name]['bias']
  want = dense('Dense_1', _gelu_np(dense('Dense_0', x), approximate=False))
  np.testing.assert_allclose(
      block.apply({'params': params}, x, deterministic=True), want, atol=1e-5)
  # With dropout, each kept unit of the hidden layer is scaled by 1 / 0.5.
  out, mask = block.apply(
      {'params': params}, x, deterministic=False,
      rngs={'dropout': jax.random.key(1)}, capture_intermediates=True,
      mutable=['intermediates'])
  hidden = mask['intermediates']['Dropout_0']['__call__'][0]
  kept = hidden != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(
      hidden[kept], 2 * _gelu_np(dense('Dense_0', x), False)[kept], atol=1e-5)


def _softmax_np(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_softmax_gradient():
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 3, 5))
  grad = jax.grad(lambda x: jnp.sum(jnp.sin(ops.softmax(x)) * w))(
      x.astype(np.float32))
  want = _numeric_grad(lambda x: np.sum(np.sin(_softmax_np(x)) * w), x)
  np.testing.assert_allclose(grad, want, atol=1e-5)


def _layer_norm_np(x, scale, bias, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_layer_norm_is_flax_layer_norm_with_its_gradients():
  rng = np.random.default_rng(1)
  x = (rng.normal(size=(2, 3, 8)) * 3 + 1).astype(np.float32)
  scale = rng.normal(size=8).astype(np.float32)
  bias = rng.normal(size=8).astype(np.float32)
  w = rng.normal(size=x.shape)
  params = {'params': {'scale': scale, 'bias': bias}}
  module = ops.LayerNorm()
  assert jax.tree.map(np.shape, module.init(jax.random.key(0), x)) == (
      jax.tree.map(np.shape, nn.LayerNorm().init(jax.random.key(0), x)))
  np.testing.assert_allclose(module.apply(params, x),
                             _layer_norm_np(x, scale, bias), atol=1e-5)

  def loss(params, x):
    return jnp.sum(module.apply(params, x) * w)

  grads, dx = jax.grad(loss, (0, 1))(params, x)
  x64, s64, b64 = (a.astype(np.float64) for a in (x, scale, bias))
  np.testing.assert_allclose(dx, _numeric_grad(
      lambda x: np.sum(_layer_norm_np(x, s64, b64) * w), x64), atol=1e-4)
  np.testing.assert_allclose(grads['params']['scale'], _numeric_grad(
      lambda s: np.sum(_layer_norm_np(x64, s, b64) * w), s64), atol=1e-4)
  np.testing.assert_allclose(grads['params']['bias'], _numeric_grad(
      lambda b: np.sum(_layer_norm_np(x64, s64, b) * w), b64), atol=1e-4)


def _attention_np(q, k, v):
  weights = _softmax_np(np.einsum('bhqd,bhkd->bhqk', q, k) /
                        np.sqrt(q.shape[-1]))
  return np.einsum('bhqk,bhkd->bhqd', weights, v)


def test_attention_value_and_gradients():
  rng = np.random.default_rng(2)
  q, k, v = (rng.normal(size=(2, 2, 5, 4)) for _ in range(3))
  w = rng.normal(size=q.shape)
  args = [a.astype(np.float32) for a in (q, k, v)]
  np.testing.assert_allclose(ops.attention(*args), _attention_np(q, k, v),
                             atol=1e-5)
  grads = jax.grad(lambda *a: jnp.sum(ops.attention(*a) * w),
                   (0, 1, 2))(*args)
  wants = [
      _numeric_grad(lambda q: np.sum(_attention_np(q, k, v) * w), q),
      _numeric_grad(lambda k: np.sum(_attention_np(q, k, v) * w), k),
      _numeric_grad(lambda v: np.sum(_attention_np(q, k, v) * w), v)]
  for grad, want in zip(grads, wants):
    np.testing.assert_allclose(grad, want, atol=1e-4)


def _step_temp_bytes(num_layers, batch, tokens_side, width, mlp, heads):
  """XLA's temporary bytes of a compiled training step of a small ViT."""
  model = models_vit.VisionTransformer(
      num_classes=10, patches={'size': (4, 4)}, hidden_size=width,
      classifier='token', transformer={
          'num_layers': num_layers, 'mlp_dim': mlp, 'num_heads': heads,
          'dropout_rate': 0., 'attention_dropout_rate': 0.})
  images = jnp.zeros((batch, 4 * tokens_side, 4 * tokens_side, 3))
  params = jax.eval_shape(lambda: model.init(
      jax.random.key(0), images[:1], train=False)['params'])

  def step(params, images):
    grads = jax.grad(lambda p: jnp.mean(model.apply(
        {'params': p}, images, train=True) ** 2))(params)
    return optax.apply_updates(params, jax.tree.map(lambda g: -0.1 * g, grads))

  compiled = jax.jit(step).lower(params, images).compile()
  return compiled.memory_analysis().temp_size_in_bytes


@pytest.mark.skipif(jax.default_backend() != 'cpu',
                    reason='the bound is measured for the CPU backend')
def test_a_block_keeps_only_what_its_backward_pass_needs():
  """Each block added to the model adds at most what its backward pass
  needs: x, x + attention, both LayerNorm outputs, q, k, v, the attention
  output (twice: heads first, and tokens first for the projection), the
  MLP's hidden layer before GELU (not after: ops.gelu_dot_general).
  No (tokens x tokens) weights.
  """
  batch, side, width, mlp, heads = 8, 14, 64, 256, 8
  tokens = side * side + 1
  per_block = batch * tokens * (8 * width + mlp) * 4
  attention_weights = batch * heads * tokens * tokens * 4
  assert attention_weights > 0.5 * per_block  # the bound below can see it
  grown = (_step_temp_bytes(4, batch, side, width, mlp, heads) -
           _step_temp_bytes(2, batch, side, width, mlp, heads)) / 2
  assert grown <= 1.2 * per_block, (grown, per_block)
