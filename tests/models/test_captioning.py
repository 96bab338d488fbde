"""Captioners and decoding, against numpy and brute force."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import captioning
from vit_jax.models import decoding
from vit_jax.models import vit

BOS, EOS, VOCAB = 1, 2, 5
# The decoder reads the image one of two ways: cross-attention, or as the
# prefix of its sequence. The projecting connectors (pixel_shuffle_mlp,
# fused_mlp) decode as 'prefix' does (tests/models/test_connectors.py
# checks their projections): masks, cache and search are checked per way.
DECODINGS = ('cross_attention', 'prefix')


def _encoder():
  return vit.VisionTransformer(
      num_classes=0, patches={'size': (7, 7)}, hidden_size=16,
      transformer=dict(mlp_dim=32, num_heads=2, num_layers=2,
                       dropout_rate=0., attention_dropout_rate=0.),
      classifier='token', representation_size=None)


def _captioner(connector, vocab=VOCAB, max_len=4):
  return captioning.Captioner(
      encoder=_encoder(), connector=connector,
      block=-1 if connector == 'cross_attention' else -2,
      norm=connector == 'cross_attention',
      decoder=dict(vocab_size=vocab, width=16, num_layers=2, num_heads=2,
                   mlp_dim=32, max_len=max_len))


def _init(model, seed=0, max_len=4):
  images = jax.random.normal(jax.random.key(seed + 100), (3, 28, 28, 3))
  params = model.init(jax.random.key(seed), images,
                      jnp.zeros((3, max_len), jnp.int32))['params']
  # The head starts at zero (uniform logits): random, so that tokens differ.
  head = params['text']['head']
  head['kernel'] = jax.random.normal(jax.random.key(seed + 1),
                                     head['kernel'].shape) * 2
  return params, images


def test_every_connector_decodes_one_of_the_two_ways():
  assert set(captioning.PREFIX_LM) == set(captioning.CONNECTORS) - {
      'cross_attention'}
  assert 'prefix' in captioning.PREFIX_LM


def test_masks_against_numpy():
  prefix, text = 3, 4
  total = prefix + text
  want = np.zeros((total, total), bool)
  for q in range(total):
    for k in range(total):
      # image tokens see every image token; text sees the image and the
      # text up to itself
      want[q, k] = k < prefix or k <= q
  got = captioning.attention_mask(jnp.arange(total), jnp.arange(total),
                                  prefix)
  np.testing.assert_array_equal(got, want)
  causal = captioning.attention_mask(jnp.arange(text), jnp.arange(text))
  np.testing.assert_array_equal(causal, np.tril(np.ones((text, text), bool)))


@pytest.mark.parametrize('connector', DECODINGS)
def test_decoder_masks_as_said(connector):
  """A later input changes no earlier logit under teacher forcing, and
  changes them all in parallel prediction."""
  model = _captioner(connector)
  params, images = _init(model)
  tokens = jnp.array([[BOS, 3, 4, 3]] * 3)
  changed = tokens.at[:, 2].set(0)

  @jax.jit
  def logits(t, parallel=None):
    return model.apply({'params': params}, images, t, parallel=parallel)
  a, b = logits(tokens), logits(changed)
  np.testing.assert_allclose(a[:, :2], b[:, :2], atol=1e-6)
  assert np.abs(a[:, 2:] - b[:, 2:]).max() > 1e-4
  if connector == 'cross_attention':
    parallel = jnp.array([True, False, True])
    a, b = logits(tokens, parallel), logits(changed, parallel)
    assert np.abs(a[0, :2] - b[0, :2]).max() > 1e-4
    np.testing.assert_allclose(a[1, :2], b[1, :2], atol=1e-6)


def test_memory_mask_hides_the_padding():
  """NaFlex's padded memory: with `memory_mask`, what the padding holds
  changes no logit, and the logits are those of the real tokens alone."""
  decoder = captioning.TextDecoder(vocab_size=VOCAB, width=16, num_layers=2,
                                   num_heads=2, mlp_dim=32, max_len=4)
  rng = np.random.default_rng(0)
  memory = rng.normal(size=(2, 6, 16)).astype(np.float32)
  real = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]], bool)
  tokens = jnp.array([[BOS, 3, 4, 3]] * 2)
  params = decoder.init(jax.random.key(0), tokens, memory=memory)['params']
  params['head']['kernel'] = jnp.asarray(rng.normal(
      size=params['head']['kernel'].shape), jnp.float32)
  apply = lambda m, mask=None: decoder.apply(
      {'params': params}, tokens, memory=m, memory_mask=mask)
  noisy = np.where(real[..., None], memory, 5 * rng.normal(size=memory.shape))
  a, b = apply(memory, real), apply(noisy.astype(np.float32), real)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  for row, n in enumerate(real.sum(1)):
    alone = apply(memory[row:row + 1, :n])
    np.testing.assert_allclose(a[row], alone[0], rtol=1e-5, atol=1e-6)
  assert np.abs(apply(noisy.astype(np.float32)) - a).max() > 1e-3


def test_log_likelihood_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 4, VOCAB)).astype(np.float32)
  targets = np.array([[3, EOS, 4, 4], [3, 4, 3, EOS]])
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  want = [logp[0, 0, 3] + logp[0, 1, EOS],
          logp[1, 0, 3] + logp[1, 1, 4] + logp[1, 2, 3] + logp[1, 3, EOS]]
  np.testing.assert_allclose(
      captioning.log_likelihood(jnp.asarray(logits), targets, EOS), want,
      rtol=1e-5)


@pytest.mark.parametrize('connector', DECODINGS)
@pytest.mark.parametrize('beam', [1, 3])
def test_cache_changes_no_token(connector, beam):
  model = _captioner(connector, vocab=12, max_len=6)
  params, images = _init(model, seed=3, max_len=6)
  def run(cache):
    return jax.jit(functools.partial(
        decoding.captions, model, bos=BOS, eos=EOS, max_len=6, beam=beam,
        cache=cache))(params, images)
  with_cache, without = run(True), run(False)
  np.testing.assert_array_equal(with_cache, without)
  assert len({tuple(r) for r in np.asarray(with_cache)}) > 1


def _brute_force(model, params, images, max_len, alpha):
  """The best normalised score over every sequence, by teacher forcing."""
  best = [(-np.inf, None)] * images.shape[0]
  other = [t for t in range(VOCAB) if t != EOS]
  seqs = [s + (EOS,) for n in range(max_len) for s in
          itertools.product(other, repeat=n)]
  seqs += list(itertools.product(other, repeat=max_len))

  @jax.jit
  def log_likelihood(targets):
    logits = model.apply({'params': params}, images,
                         captioning.shift_right(targets, BOS))
    return captioning.log_likelihood(logits, targets, EOS)

  for seq in seqs:
    padded = np.full((max_len,), EOS)
    padded[:len(seq)] = seq
    score = np.asarray(log_likelihood(
        jnp.asarray(np.repeat(padded[None], images.shape[0], 0))))
    score = score / len(seq)**alpha
    best = [max(b, (s, tuple(padded)), key=lambda x: x[0])
            for b, s in zip(best, score)]
  return best


@pytest.mark.parametrize('connector', DECODINGS)
def test_beam_search_equals_brute_force(connector):
  max_len, alpha = 3, 1.0
  model = _captioner(connector, max_len=max_len)
  params, images = _init(model, seed=5, max_len=max_len)

  @jax.jit
  def search(params, images):
    memory = model.apply({'params': params}, images, method='encode')
    first = jnp.full((3, 1), BOS, jnp.int32)
    logits, state, step = decoding.cached_decoder(model, params, memory,
                                                  first, max_len)
    kw = dict(max_len=max_len, eos=EOS)
    # A beam wide enough for every prefix: the search is exhaustive.
    return (decoding.beam_search(step, state, logits[:, -1], beam=64,
                                 alpha=alpha, **kw),
            decoding.greedy(step, state, logits[:, -1], **kw),
            decoding.beam_search(step, state, logits[:, -1], beam=1, **kw)[0])
  (tokens, scores), greedy, one = search(params, images)
  best = _brute_force(model, params, images, max_len, alpha)
  # Sums of float32 log-probabilities, in another order: ~1e-6 apart.
  np.testing.assert_allclose(scores, [s for s, _ in best], rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_array_equal(tokens, [t for _, t in best])
  np.testing.assert_array_equal(greedy, one)


def test_remat_and_bfloat16_keep_the_parameters_and_the_result():
  model = _captioner('cross_attention')
  params, images = _init(model)
  tokens = jnp.array([[BOS, 3, 4, 3]] * 3)

  def loss(model, params):
    logits = model.apply({'params': params}, images, tokens)
    return captioning.log_likelihood(logits, tokens, EOS).sum()

  grads = jax.jit(jax.grad(functools.partial(loss, model)))(params)
  for settings in (dict(remat=True), dict(dtype='bfloat16')):
    other = model.clone(decoder={**model.decoder, **settings})
    other_grads = jax.jit(jax.grad(functools.partial(loss, other)))(params)
    tol = 1e-5 if 'remat' in settings else 0.1
    for a, b in zip(jax.tree.leaves(grads['text']),
                    jax.tree.leaves(other_grads['text'])):
      np.testing.assert_allclose(a, b, atol=tol * (1 + np.abs(a).max()))
  # Decoding a remat model runs its blocks plainly (the cache's shapes).
  decoded = jax.jit(functools.partial(
      decoding.captions, model.clone(decoder={**model.decoder,
                                              'remat': True}),
      bos=BOS, eos=EOS, max_len=4))(params, images)
  assert decoded.shape == (3, 4)
