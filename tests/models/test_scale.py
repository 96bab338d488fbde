"""Pretraining at scale: bf16, fused attention, remat and scan of the ViT."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import eqns
from tests.helpers import random_params
from vit_jax.checkpoints import files
from vit_jax import checkpoint  # the original's helpers: load_pretrained
from vit_jax import models

IMAGE = (2, 32, 32, 3)


def _vit(name='ViT-Ti_16', num_layers=3, **transformer):
  """A short preset: `num_layers` blocks, other transformer fields given."""
  config = models.MODEL_CONFIGS[name]
  return lambda **kw: models.get_model(name, num_classes=5, transformer=dict(
      config.transformer, num_layers=num_layers, **transformer), **kw)


def _images(shape=IMAGE, seed=0):
  return jnp.asarray(np.random.default_rng(seed).uniform(-1, 1, shape),
                     jnp.float32)


def _dot_dtypes(fn, *args):
  """(lhs dtype, flops) of every dot_general in `fn`'s jaxpr, recursively."""
  dots = [[v.aval for v in e.invars] for e in eqns(jax.make_jaxpr(fn)(*args))
          if e.primitive.name == 'dot_general']
  return [(lhs.dtype, lhs.size * rhs.shape[-1]) for lhs, rhs in dots]


def test_bf16_params_stay_float32_and_logits_are_close():
  make = _vit()
  x = _images()
  params = random_params(make(), x, train=False, scale=0.05)
  bf16 = make(dtype='bfloat16')
  shapes = jax.eval_shape(lambda: bf16.init(jax.random.key(0), x,
                                            train=False))['params']
  assert {leaf.dtype for leaf in jax.tree.leaves(shapes)} == {np.dtype('float32')}
  want = make().apply({'params': params}, x, train=False)
  got = bf16.apply({'params': params}, x, train=False)
  assert got.dtype == jnp.float32 and want.dtype == jnp.float32
  # bf16 keeps 8 bits of mantissa (relative step 2**-8 = 0.4%); after 3
  # blocks the logits are within a few percent of their spread.
  scale = float(jnp.abs(want).max())
  assert scale > 0.1
  np.testing.assert_allclose(got, want, atol=0.03 * scale)
  assert not np.array_equal(got, want)  # it really ran in bf16


def test_bf16_computes_the_big_matmuls_in_bf16():
  make = _vit()
  x = _images()
  params = random_params(make(), x, train=False)
  dots = _dot_dtypes(lambda p, x: make(dtype=jnp.bfloat16).apply(
      {'params': p}, x, train=False), params, x)
  big = [dtype for dtype, flops in dots if flops >= 192 * 192]
  assert len(big) >= 3 * 6  # q, k, v, out, 2 MLP per block
  assert set(big) == {np.dtype(jnp.bfloat16)}
  # The float32 model has no bf16 matmul at all.
  dots32 = _dot_dtypes(lambda p, x: make().apply(
      {'params': p}, x, train=False), params, x)
  assert {dtype for dtype, _ in dots32} == {np.dtype('float32')}


def _attention_reference(x, p, heads):
  """Softmax(q k^T / sqrt(d)) of one block's MHA, in numpy (Eq. 5-7)."""
  mha = p['MultiHeadDotProductAttention_0']
  q, k = (np.einsum('btd,dhk->bhtk', x, mha[n]['kernel']) +
          mha[n]['bias'][None, :, None] for n in ('query', 'key'))
  logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_attention_weights_are_recorded_on_request():
  make = _vit(num_layers=2)
  model, x = make(), _images()
  params = random_params(model, x, train=False, scale=0.1)
  plain = model.apply({'params': params}, x, train=False)
  out, state = model.apply({'params': params}, x, train=False,
                           mutable=['intermediates'])
  np.testing.assert_allclose(out, plain, atol=1e-5)  # fused vs flax's path
  blocks = state['intermediates']['Transformer']
  weights = blocks['encoderblock_0']['MultiHeadDotProductAttention_0'][
      'attention_weights'][0]
  assert weights.shape == (2, 3, 5, 5)  # batch, heads, 1 + 2x2 tokens
  # Block 0 sees LN(patch embedding + position embedding) with the cls token.
  _, inter = model.apply(
      {'params': params}, x, train=False,
      capture_intermediates=lambda module, _: module.name == 'LayerNorm_0')
  ln = np.asarray(inter['intermediates']['Transformer']['encoderblock_0'][
      'LayerNorm_0']['__call__'][0], np.float64)
  want = _attention_reference(ln, jax.tree.map(
      lambda a: np.asarray(a, np.float64),
      params['Transformer']['encoderblock_0']), 3)
  np.testing.assert_allclose(weights, want, atol=1e-5)


def _loss_and_grads(model, params, x):
  return jax.value_and_grad(lambda p: jnp.sum(model.apply(
      {'params': p}, x, train=False)**2))(params)


@pytest.mark.parametrize('policy', ['full', 'dots', 'dots_no_batch'])
def test_remat_gives_the_same_gradients(policy):
  make = _vit(num_layers=2)
  x = _images()
  params = random_params(make(), x, train=False, scale=0.1)
  params['head']['kernel'] = params['head']['kernel'] * 0 + 0.1
  want = _loss_and_grads(make(), params, x)
  got = _loss_and_grads(_vit(num_layers=2, remat_policy=policy)(), params, x)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6), got, want)


def _temp_bytes(model, params, x):
  compiled = jax.jit(lambda p: _loss_and_grads(model, p, x)).lower(
      params).compile()
  return compiled.memory_analysis().temp_size_in_bytes


def test_remat_lowers_the_step_memory():
  """Measured on the scanned encoder: XLA's CPU scheduler may hoist the
  recomputation of unrolled blocks and so keep their activations anyway."""
  x = _images((16, 64, 64, 3))
  params = files.scan_like(
      random_params(_vit(num_layers=6)(), x, train=False),
      {'Transformer': {'encoderblock': {}}})
  none = _temp_bytes(_vit(num_layers=6, scan=True)(), params, x)
  full = _temp_bytes(_vit(num_layers=6, scan=True, remat_policy='full')(),
                     params, x)
  assert full < 0.7 * none, (full, none)


def test_scan_equals_unrolled_on_the_same_npz(tmp_path):
  x = _images()
  unrolled = _vit(num_layers=3)()
  params = random_params(unrolled, x, train=False, scale=0.1)
  path = tmp_path / 'ti.npz'
  files.save(params, path)
  scanned = _vit(num_layers=3, scan=True)()
  init = jax.eval_shape(lambda: scanned.init(jax.random.key(0), x,
                                             train=False))['params']
  assert init['Transformer']['encoderblock']['LayerNorm_0']['scale'].shape == (
      3, 192)
  fresh = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), init)
  fresh['head'] = params['head']  # the head load_pretrained keeps
  loaded = checkpoint.load_pretrained(
      pretrained_path=path, init_params=fresh,
      model_config={'classifier': 'token', 'posemb': 'learn'})
  np.testing.assert_allclose(
      scanned.apply({'params': loaded}, x, train=False),
      unrolled.apply({'params': params}, x, train=False), rtol=1e-5,
      atol=1e-6)
  # Saved again from the scanned model: the published per-block names.
  files.save(loaded, tmp_path / 'again.npz')
  again = np.load(tmp_path / 'again.npz')
  original = np.load(path)
  assert sorted(again.files) == sorted(original.files)
  assert ('Transformer/encoderblock_2/MultiHeadDotProductAttention_1/query/'
          'kernel' in again.files)
  for key in original.files:
    np.testing.assert_array_equal(again[key], original[key])


def test_scan_and_remat_train_like_unrolled():
  make = _vit(num_layers=2)
  x = _images()
  params = random_params(make(), x, train=False, scale=0.1)
  params['head']['kernel'] = params['head']['kernel'] * 0 + 0.1
  stacked = files.scan_like(params, {'Transformer': {'encoderblock': {}}})
  want, grads = _loss_and_grads(make(), params, x)
  got, scanned_grads = _loss_and_grads(
      _vit(num_layers=2, scan=True, remat_policy='full')(), stacked, x)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  np.testing.assert_allclose(
      scanned_grads['Transformer']['encoderblock']['MlpBlock_0']['Dense_0'][
          'kernel'][1],
      grads['Transformer']['encoderblock_1']['MlpBlock_0']['Dense_0'][
          'kernel'], rtol=1e-4, atol=1e-6)


def test_bad_memory_settings_fail_before_compiling():
  x = _images()
  with pytest.raises(ValueError, match="Unknown remat_policy 'some'"):
    _vit(remat_policy='some')().init(jax.random.key(0), x, train=False)
  with pytest.raises(ValueError, match='per-block stochastic_depth'):
    _vit(scan=True, stochastic_depth=0.1)().init(jax.random.key(0), x,
                                                 train=False)
