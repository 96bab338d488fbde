"""Splash attention (Pallas' TPU kernel, run here by its interpreter)
against the plain path: values and gradients with respect to the query, key
and value, for token counts off the kernel's tiles, packed sequences with
padding, and RoPE; and NaViT through it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.test_navit import _apply
from tests.models.test_navit import _images
from tests.models.test_navit import _navit
from tests.models.test_navit import _pack
from tests.models.test_navit import _params
from vit_jax.models import attention
from vit_jax.models import posemb
from vit_jax.platform import target


def _inputs(batch, tokens, heads=2, depth=16, seed=0):
  keys = jax.random.split(jax.random.key(seed), 4)
  q, k, v = (jax.random.normal(keys[i], (batch, tokens, heads, depth))
             for i in range(3))
  cotangent = jax.random.normal(keys[3], (batch, tokens, heads, depth))
  return (q, k, v), cotangent


def _value_and_grads(implementation, inputs, cotangent, **kwargs):
  """attention's output and the gradients of <output, cotangent> with
  respect to q, k and v, traced with `implementation`'s attention."""
  def loss(q, k, v):
    out = attention.attention(q, k, v, **kwargs)
    return jnp.sum(out * cotangent), out

  with target.using_attention(implementation):
    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(
        *inputs)
  return out, grads


def _numpy_attention(q, k, v, mask=None):
  """softmax(q k^T / sqrt(d)) v in float64, `mask` (batch, q, k) True where
  a query may attend."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(mask[:, None], logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  return np.einsum('bhqk,bkhd->bqhd', weights, v)


def _check(kernel, plain, expected):
  (out, grads), (plain_out, plain_grads) = kernel, plain
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(plain_out, expected, rtol=1e-4, atol=1e-5)
  for got, want in zip(grads, plain_grads):
    assert np.abs(want).max() > 1e-2  # gradients that say something
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('tokens', [130, 257])
def test_tokens_off_the_tiles(tokens):
  """Tokens padded to the tile (130 -> 256; 257 -> 384), the padding
  masked out and sliced off."""
  assert tokens % attention.splash_block(tokens)
  inputs, cotangent = _inputs(2, tokens)
  _check(_value_and_grads('splash', inputs, cotangent),
         _value_and_grads('heads_first', inputs, cotangent),
         _numpy_attention(*inputs))


def test_packed_sequences_with_padding():
  """Segment ids, 0 on a packed sequence's padding (which attends to its
  own), as NaViT's: the kernel takes the ids, the plain path their mask."""
  segment_ids = np.zeros((2, 140), np.int32)
  segment_ids[0, :60], segment_ids[0, 60:110] = 1, 2  # 30 padding
  segment_ids[1, :70], segment_ids[1, 70:135] = 2, 1  # 5 padding
  segment_ids = jnp.asarray(segment_ids)
  inputs, cotangent = _inputs(2, 140, seed=1)
  mask = np.asarray(segment_ids)[:, :, None] == np.asarray(segment_ids)[
      :, None, :]
  _check(_value_and_grads('splash', inputs, cotangent,
                          segment_ids=segment_ids),
         _value_and_grads('heads_first', inputs, cotangent,
                          segment_ids=segment_ids),
         _numpy_attention(*inputs, mask))


@pytest.mark.parametrize('half', [False, True])
def test_rope(half):
  """Queries and keys rotated before the kernel, as before the product."""
  tokens, depth = 130, 16
  inputs, cotangent = _inputs(1, tokens, depth=depth, seed=2)
  rows, cols = np.divmod(np.arange(tokens - 1), 16)
  angles = posemb.pad_prefix(posemb.rope2d_angles(
      jnp.asarray(rows)[None], jnp.asarray(cols)[None], depth), 1)
  rotated = [posemb.apply_rope(x, angles, half) for x in inputs[:2]]
  _check(_value_and_grads('splash', inputs, cotangent, rope=angles,
                          rope_half=half),
         _value_and_grads('heads_first', inputs, cotangent, rope=angles,
                          rope_half=half),
         _numpy_attention(*rotated, inputs[2]))


def test_a_bias_or_mask_keeps_the_plain_path():
  """Forced, the kernel still does not take what it cannot: a dense mask
  reaches the plain path and is applied."""
  inputs, _ = _inputs(1, 12)
  mask = np.tril(np.ones((12, 12), bool))[None]
  with target.using_attention('splash'):
    assert target.attention_implementation(jnp.float32, 16, True) != 'splash'
    out = attention.attention(*inputs, mask=jnp.asarray(mask)[:, None])
  np.testing.assert_allclose(out, _numpy_attention(*inputs, mask),
                             rtol=1e-4, atol=1e-5)


def test_cross_attention_keeps_the_plain_path():
  """Queries fewer than the keys (a MAP probe, a decoder's cross-attention)
  are not the kernel's self-attention."""
  (q, _, _), _ = _inputs(1, 3, seed=3)
  (_, k, v), _ = _inputs(1, 140, seed=4)
  with target.using_attention('splash'):
    out = attention.attention(q, k, v)
  np.testing.assert_allclose(out, _numpy_attention(q, k, v), rtol=1e-4,
                             atol=1e-5)


def test_navit_through_the_kernel():
  """NaViT's segment ids reach the kernel: the same logits as the plain
  path's dense mask (2 blocks, rope2d, padding in both sequences)."""
  a, b, c, d = _images()
  packed = _pack([[a, b, c], [d, c, b]], tokens=40)
  model = _navit('rope2d', 'map')
  params = _params(model, packed)
  plain = np.asarray(_apply(model, params, packed))
  with target.using_attention('splash'):
    kernel = np.asarray(jax.jit(lambda p, x: model.apply(
        {'params': p}, x, train=False))(params, packed))
  np.testing.assert_allclose(kernel, plain, rtol=1e-4, atol=1e-5)
  assert np.abs(plain).max() > 1e-2
