"""Greedy and beam search, each one `lax.while_loop`, over a step function
with a cache: `step(tokens (n, 1), cache) -> (logits (n, 1, V), cache)`.

A sequence ends at its first `eos` (padded with `eos` after it) or at
`max_len` tokens. Beam search ranks finished sequences by their
length-normalised log-probability, sum(log p) / length**alpha (Wu et al.,
2016, without their +5), where the length counts the `eos`.

`captions` runs either on a `models.captioning.Captioner`, by
`cached_decoder` or by `uncached_decoder` (which recomputes every position,
to check the first).
"""

import jax
import jax.numpy as jnp


def _advance(step, tokens, cache, logits, more):
  """The next position's logits (n, V) and cache, if `more` positions are
  to come (else as they were: the cache is full)."""
  def run(cache):
    new_logits, cache = step(tokens[:, None], cache)
    return new_logits[:, -1].astype(logits.dtype), cache
  return jax.lax.cond(more, run, lambda cache: (logits, cache), cache)


def greedy(step, cache, logits, *, max_len, eos):
  """(n, max_len) tokens, the most likely at each position; `logits`
  (n, V) are the first position's."""
  n = logits.shape[0]

  def body(carry):
    i, tokens, logits, cache, done = carry
    token = jnp.where(done, eos, jnp.argmax(logits, -1)).astype(jnp.int32)
    tokens = tokens.at[:, i].set(token)
    done = done | (token == eos)
    logits, cache = _advance(step, token, cache, logits, i + 1 < max_len)
    return i + 1, tokens, logits, cache, done

  carry = (0, jnp.full((n, max_len), eos, jnp.int32), logits, cache,
           jnp.zeros((n,), bool))
  carry = jax.lax.while_loop(
      lambda c: (c[0] < max_len) & ~c[4].all(), body, carry)
  return carry[1]


def beam_search(step, cache, logits, *, beam, max_len, eos, alpha=1.0):
  """((n, max_len) best tokens, (n,) their normalised scores), keeping
  `beam` live sequences per row. `cache` and `logits` are the rows' (n
  each); each row's cache is copied `beam` times here."""
  n, vocab = logits.shape
  cache = jax.tree.map(lambda x: jnp.repeat(x, beam, 0) if x.ndim else x,
                       cache)
  neg = jnp.float32(-jnp.inf)
  # One live sequence to start with, so that the first tokens differ.
  live_logp = jnp.where(jnp.arange(beam) == 0, 0., neg)[None].repeat(n, 0)
  live = jnp.full((n, beam, max_len), eos, jnp.int32)
  logp = jnp.repeat(jax.nn.log_softmax(logits.astype(jnp.float32))[:, None],
                    beam, 1)
  candidates = min(2 * beam, beam * vocab)
  rows = jnp.arange(n)[:, None]

  def body(carry):
    i, live, live_logp, logp, cache, done, done_score = carry
    top_logp, index = jax.lax.top_k(
        (live_logp[..., None] + logp).reshape(n, -1), candidates)
    origin, token = index // vocab, (index % vocab).astype(jnp.int32)
    seqs = live[rows, origin].at[:, :, i].set(token)
    ends = (token == eos) | (i + 1 == max_len)
    length = (i + 1).astype(jnp.float32)
    ended = jnp.where(ends, top_logp / length**alpha, neg)
    done_score, keep = jax.lax.top_k(
        jnp.concatenate([done_score, ended], 1), beam)
    done = jnp.concatenate([done, seqs], 1)[rows, keep]
    live_logp, keep = jax.lax.top_k(
        jnp.where(token == eos, neg, top_logp), beam)
    live, token = seqs[rows, keep], token[rows, keep]
    order = (rows * beam + origin[rows, keep]).reshape(-1)
    cache = jax.tree.map(lambda x: x[order] if x.ndim else x, cache)
    logits, cache = _advance(step, token.reshape(-1), cache,
                             logp.reshape(n * beam, vocab), i + 1 < max_len)
    logp = jax.nn.log_softmax(logits).reshape(n, beam, vocab)
    return i + 1, live, live_logp, logp, cache, done, done_score

  carry = (jnp.int32(0), live, live_logp, logp, cache,
           jnp.full((n, beam, max_len), eos, jnp.int32),
           jnp.full((n, beam), neg))
  carry = jax.lax.while_loop(lambda c: c[0] < max_len, body, carry)
  return carry[5][:, 0], carry[6][:, 0]


def cached_decoder(model, params, memory, first, max_len):
  """(first logits, state, step) of a Captioner's decoding with its
  key/value cache, from the inputs `first` (n, 1) and `encode`'s
  `memory`; the state holds the cache (and the memory that cross-attention
  reads at every step)."""
  cross = model.connector == 'cross_attention'
  cache_len = max_len + (0 if cross else memory.shape[1])

  def run(memory, tokens, cache):
    variables = {'params': params}
    if cache is not None:
      variables['cache'] = cache
    logits, out = model.apply(variables, memory, tokens, cache_len=cache_len,
                              method='logits', mutable=['cache'])
    return logits, out['cache']

  def step(tokens, state):
    logits, cache = run(state.get('memory'), tokens, state['cache'])
    return logits, {**state, 'cache': cache}

  logits, cache = run(memory, first, None)
  return logits, {'cache': cache, **({'memory': memory} if cross else {})}, step


def uncached_decoder(model, params, memory, first, max_len):
  """As `cached_decoder`, but each step runs the decoder over every
  position so far (a buffer of `max_len` inputs; the causal mask hides
  those not yet written)."""
  def run(state):
    logits = model.apply({'params': params}, state['memory'],
                         state['inputs'], method='logits')
    return jax.lax.dynamic_slice_in_dim(logits, state['i'], 1, axis=1)

  def step(tokens, state):
    i = state['i'] + 1
    state = {**state, 'i': i, 'inputs': jax.lax.dynamic_update_slice_in_dim(
        state['inputs'], tokens.astype(jnp.int32), i, axis=1)}
    return run(state), state

  inputs = jnp.zeros((first.shape[0], max_len), jnp.int32).at[:, :1].set(first)
  state = {'memory': memory, 'inputs': inputs, 'i': jnp.int32(0)}
  return run(state), state, step


def captions(model, params, images, *, bos, eos, max_len, beam=1, alpha=1.0,
             cache=True):
  """(n, max_len) caption tokens of `images`: greedy (`beam` 1) or beam
  search; `cache=False` recomputes every position at each step."""
  memory = model.apply({'params': params}, images, method='encode')
  first = jnp.full((memory.shape[0], 1), bos, jnp.int32)
  decoder = cached_decoder if cache else uncached_decoder
  logits, state, step = decoder(model, params, memory, first, max_len)
  if beam == 1:
    return greedy(step, state, logits[:, -1], max_len=max_len, eos=eos)
  return beam_search(step, state, logits[:, -1], beam=beam, max_len=max_len,
                     eos=eos, alpha=alpha)[0]
