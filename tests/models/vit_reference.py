"""The ViT's numpy reference, written from the paper's equations (1)-(4),
and a jitted apply: shared by test_vit.py, test_posemb.py and test_deit.py."""

import jax
import numpy as np

from tests.helpers import layernorm
from tests.helpers import mlp


def _msa(x, p, kv=None, bias_fn=None, rope=None):
  """Multi-head attention: softmax(q k^T / sqrt(d) + bias) v per head.

  Self-attention unless `kv` is given; `bias_fn` maps the scaled queries
  (batch, heads, tokens, depth) to a (batch, heads, tokens, tokens) bias;
  `rope`, (tokens, depth / 2) angles, rotates q and k first.
  """
  kv = x if kv is None else kv
  q, k, v = (np.einsum('btd,dhk->bhtk', y, p[n]['kernel']) +
             p[n]['bias'].transpose(0, 1)[None, :, None, :]
             for y, n in ((x, 'query'), (kv, 'key'), (kv, 'value')))
  if rope is not None:
    q, k = (_rotate(y, rope) for y in (q, k))
  q = q / np.sqrt(q.shape[-1])
  logits = np.einsum('bhtk,bhsk->bhts', q, k)
  if bias_fn is not None:
    logits = logits + bias_fn(q)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  heads = np.einsum('bhts,bhsk->bthk', w, v)
  return np.einsum('bthk,hkd->btd', heads, p['out']['kernel']) + p['out']['bias']


def _rotate(y, angles):
  """(..., tokens, depth) `y`, pairs (y[2j], y[2j+1]) as complex numbers
  times exp(i angles[token, j])."""
  z = (y[..., 0::2] + 1j * y[..., 1::2]) * np.exp(1j * angles)
  return np.stack([z.real, z.imag], -1).reshape(y.shape)


def _block(x, p, bias_fn=None, rope=None):
  x = x + _msa(layernorm(x, p['LayerNorm_0']),
               p['MultiHeadDotProductAttention_0'], bias_fn=bias_fn,
               rope=rope)
  return x + mlp(layernorm(x, p['LayerNorm_1']), p['MlpBlock_0'])


def _apply(model, params, x, **kw):
  return jax.jit(lambda p, x: model.apply({'params': p}, x, **kw))(params, x)
