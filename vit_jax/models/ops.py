"""GELU, softmax and LayerNorm whose backward passes keep only what they need.

Differentiated as written, `jax.nn.gelu` keeps five activation-sized arrays
for the backward pass (x, x**3, tanh, ...), the softmax its exponentials and
its output, and flax's `LayerNorm` four arrays of its input's size. Each op
here has a `jax.custom_vjp` whose residuals are what the closed-form
derivative needs: GELU its input, the softmax its output, LayerNorm its
input and two numbers per row. The forward values are those of jax's and
flax's ops; a ViT-B/16 training step at batch 32 holds 3.1 GB fewer
temporary bytes on the CPU (docs/performance.md).
"""

import functools
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.platform import target

_SQRT_2_OVER_PI = np.sqrt(2 / np.pi).astype(np.float32)
_INV_SQRT_2PI = np.float32(1 / np.sqrt(2 * np.pi))


def _after_forward(*values):
  """`values` (the residuals, then the gradient), made to wait for the
  gradient.

  Without this XLA would find the backward pass's recomputation (tanh(...),
  x - mean, q k^T) equal to the forward pass's, compute it once and keep it
  from the forward pass to the backward: the memory this module saves. The
  barrier stops that merge; XLA's CPU pipeline drops it before scheduling,
  though, so work that reads only saved values could still run in the
  forward pass and keep its output. A zero computed from the gradient
  stops that (0 * g is not folded: it is NaN where g is, and a NaN
  gradient is lost anyway).
  """
  *saved, g = jax.lax.optimization_barrier(values)
  return (*(_plus_zero_of(v, g) for v in saved), g)


def _plus_zero_of(value, g):
  """`value` + 0 * (g, or g's first feature for per-row statistics): the
  same value, one that XLA computes only once `g` exists. Elementwise where
  the shapes agree, so nothing crosses devices when `g` is sharded."""
  if value.shape == g.shape:
    return value + (0 * g).astype(value.dtype)
  if value.ndim == g.ndim and value.shape[:-1] == g.shape[:-1]:
    return value + (0 * g[..., :1]).astype(value.dtype)
  return value  # a parameter: small, and read by the gradient anyway


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def gelu(x, approximate: bool = True):
  """`jax.nn.gelu(x, approximate)`; its backward pass keeps only `x`."""
  return jax.nn.gelu(x, approximate=approximate)


def _gelu_fwd(x, approximate):
  return gelu(x, approximate), x


def _gelu_bwd(approximate, x, g):
  """d GELU / dx from the equations, in float32."""
  x, g = _after_forward(x, g)
  x32 = x.astype(jnp.float32)
  if approximate:  # 0.5 x (1 + tanh(c (x + 0.044715 x^3)))
    t = jnp.tanh(_SQRT_2_OVER_PI * (x32 + 0.044715 * x32**3))
    slope = 0.5 * (1 + t) + 0.5 * x32 * (1 - t * t) * _SQRT_2_OVER_PI * (
        1 + 3 * 0.044715 * x32 * x32)
  else:  # x Phi(x): Phi(x) + x phi(x)
    slope = 0.5 * (1 + jax.lax.erf(x32 / np.float32(np.sqrt(2)))) + (
        x32 * _INV_SQRT_2PI * jnp.exp(-0.5 * x32 * x32))
  return ((g.astype(jnp.float32) * slope).astype(x.dtype),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def gelu_dot_general(lhs, rhs, dimension_numbers, precision=None,
                     preferred_element_type=None, *, approximate=True):
  """`jax.lax.dot_general(gelu(lhs), rhs, ...)`, a `dot_general` for the
  MLP's second `nn.Dense`, fed the hidden layer before GELU.

  Its backward pass keeps `lhs` alone and computes GELU again: the
  product's weight gradient needs gelu(lhs), which plain autodiff keeps
  next to `lhs` (one (tokens x mlp_dim) array a block: 0.9 GB of a
  ViT-B/16 training step at batch 32, for one GELU more a block).
  """
  return _gelu_dot(lhs, rhs, dimension_numbers, precision,
                   preferred_element_type, approximate)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def _gelu_dot(lhs, rhs, dimension_numbers, precision, preferred_element_type,
              approximate):
  return jax.lax.dot_general(jax.nn.gelu(lhs, approximate=approximate), rhs,
                             dimension_numbers, precision,
                             preferred_element_type)


def _gelu_dot_fwd(lhs, rhs, *static):
  return _gelu_dot(lhs, rhs, *static), (lhs, rhs)


def _gelu_dot_bwd(dimension_numbers, precision, preferred_element_type,
                  approximate, residuals, g):
  lhs, rhs, g = _after_forward(*residuals, g)
  _, product_vjp = jax.vjp(
      lambda a, w: jax.lax.dot_general(a, w, dimension_numbers, precision,
                                       preferred_element_type),
      jax.nn.gelu(lhs, approximate=approximate), rhs)
  d_act, d_rhs = product_vjp(g)
  return _gelu_bwd(approximate, lhs, d_act)[0], d_rhs


_gelu_dot.defvjp(_gelu_dot_fwd, _gelu_dot_bwd)


@jax.custom_vjp
def softmax(x):
  """`jax.nn.softmax(x, axis=-1)`; its backward pass keeps only the output."""
  return jax.nn.softmax(x, axis=-1)


def _softmax_fwd(x):
  y = softmax(x)
  return y, y


def _softmax_bwd(y, g):
  y, g = _after_forward(y, g)
  return (y * (g - jnp.sum(y * g, axis=-1, keepdims=True)),)


softmax.defvjp(_softmax_fwd, _softmax_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x, scale, bias, epsilon: float):
  """Flax's LayerNorm over the last axis, statistics in float32 (flax's
  fast variance, E[x^2] - E[x]^2); returns float32."""
  return _layer_norm_fwd(x, scale, bias, epsilon)[0]


def _stats(x, epsilon):
  """Mean and 1 / std of each row, float32."""
  x = x.astype(jnp.float32)
  mean = jnp.mean(x, axis=-1, keepdims=True)
  var = jnp.maximum(jnp.mean(x * x, axis=-1, keepdims=True) - mean * mean, 0)
  return mean, jax.lax.rsqrt(var + epsilon)


def _normalize(x, mean, rstd):
  return (x.astype(jnp.float32) - mean) * rstd


def _layer_norm_fwd(x, scale, bias, epsilon):
  mean, rstd = _stats(x, epsilon)
  y = (x.astype(jnp.float32) - mean) * (rstd * scale) + bias  # flax's order
  return y, (x, mean, rstd, scale)


def _layer_norm_bwd(epsilon, residuals, g):
  """The gradients from the input and the row statistics alone."""
  del epsilon
  x, mean, rstd, scale, g = _after_forward(*residuals, g)
  g = g.astype(jnp.float32)
  xhat = _normalize(x, mean, rstd)
  rows = tuple(range(g.ndim - 1))
  dxhat = g * scale
  dx = rstd * (dxhat - jnp.mean(dxhat, axis=-1, keepdims=True) -
               xhat * jnp.mean(dxhat * xhat, axis=-1, keepdims=True))
  return (dx.astype(x.dtype), jnp.sum(g * xhat, axis=rows).astype(scale.dtype),
          jnp.sum(g, axis=rows).astype(scale.dtype))


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def _plain_layer_norm(x, scale, bias, epsilon):
  """`layer_norm`'s arithmetic, differentiated as written."""
  mean, rstd = _stats(x, epsilon)
  return (x.astype(jnp.float32) - mean) * (rstd * scale) + bias


class LayerNorm(nn.Module):
  """Flax's `nn.LayerNorm` (same `scale` and `bias`, epsilon 1e-6, float32
  statistics) on `layer_norm`; the output in `dtype` (default: the
  input's, promoted to at least float32 as flax does).

  Traced for a TPU or GPU (`target`), it is differentiated as written and
  returns float32 whatever `dtype`, as flax's does with float32 parameters:
  the products that read it cast it in their own fusions, which a bf16
  ViT-B/16 step on a TPU reads and writes 1% fewer HBM bytes for than a
  bf16 output (docs/performance.md).
  """
  epsilon: float = 1e-6
  dtype: Optional[Any] = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    features = x.shape[-1]
    scale = self.param('scale', nn.initializers.ones, (features,),
                       self.param_dtype)
    bias = self.param('bias', nn.initializers.zeros, (features,),
                      self.param_dtype)
    if target.platform() != 'cpu':  # autodiff of the same arithmetic
      return _plain_layer_norm(x, scale, bias, self.epsilon)
    dtype = self.dtype or jnp.promote_types(x.dtype, jnp.float32)
    return layer_norm(x, scale.astype(jnp.float32), bias.astype(jnp.float32),
                      self.epsilon).astype(dtype)


@jax.custom_vjp
def attention(query, key, value):
  """softmax(q k^T / sqrt(d)) v over heads-first (batch, heads, tokens,
  depth) arrays, logits and softmax in float32. Its backward pass keeps
  the inputs, the output and each query's log-sum-exp, and computes the
  attention weights again (as flash attention does): no (tokens, tokens)
  array outlives the forward pass."""
  return _attention_fwd(query, key, value)[0]


def _scaled_logits(query, key, spec):
  logits = jnp.einsum(spec, query, key, preferred_element_type=jnp.float32)
  return logits / np.sqrt(query.shape[-1]).astype(np.float32)


def _attention_fwd(query, key, value):
  logits = _scaled_logits(query, key, 'bhqd,bhkd->bhqk')
  top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  unnormalized = jnp.exp(logits - top)
  total = jnp.sum(unnormalized, axis=-1, keepdims=True)
  out = jnp.einsum('bhqk,bhkd->bhqd', (unnormalized / total).astype(
      value.dtype), value)
  lse = top + jnp.log(total)  # what the backward pass normalizes by
  return out, (query, key, value, out, lse)


def _attention_bwd(residuals, g):
  """The weights again, keys first: (batch, heads, keys, queries). The
  transposed product is also one XLA cannot merge with the forward pass's
  (it would keep that one alive instead)."""
  query, key, value, out, lse, g = _after_forward(*residuals, g)
  weights = jnp.exp(_scaled_logits(query, key, 'bhqd,bhkd->bhkq') -
                    jnp.swapaxes(lse, -1, -2))
  d_value = jnp.einsum('bhkq,bhqd->bhkd', weights.astype(g.dtype), g)
  d_weights = jnp.einsum('bhkd,bhqd->bhkq', value, g,
                         preferred_element_type=jnp.float32)
  # The softmax's backward: w * (dw - sum_k w dw), and sum_k w dw = o . do.
  rows = jnp.sum(out.astype(jnp.float32) * g.astype(jnp.float32), axis=-1)
  d_logits = (weights * (d_weights - rows[:, :, None, :]) /
              np.sqrt(query.shape[-1]).astype(np.float32)).astype(query.dtype)
  d_query = jnp.einsum('bhkq,bhkd->bhqd', d_logits, key)
  d_key = jnp.einsum('bhkq,bhqd->bhkd', d_logits, query)
  return d_query, d_key, d_value


attention.defvjp(_attention_fwd, _attention_bwd)
