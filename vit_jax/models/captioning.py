"""Image captioners: an image encoder's tokens, read by a text decoder.

Two connectors (`Captioner.connector`):
  'cross_attention': CapPa (Tschannen et al., NeurIPS 2023). Each decoder
    block attends causally to the text, then cross-attends to the encoder's
    tokens. Training mixes teacher forcing with parallel prediction: every
    input is [MASK], no causal mask, every token predicted at once.
  'prefix': LLaVA (Liu et al., NeurIPS 2023). The encoder's patch tokens of
    one block go through a 2-layer MLP projector to the width of a
    decoder-only LM over [image tokens; text tokens], under a prefix-LM
    mask: image tokens see one another, text tokens see the image and the
    text before them.
  'pixel_shuffle_mlp': InternVL (Chen et al., CVPR 2024). As 'prefix', but
    each 2 x 2 patch tokens are one (`pixel_shuffle`: 4x the channels, a
    quarter of the tokens) through InternVL's projector (LayerNorm, Dense,
    GELU, Dense). Images may come as tiles (`data/tiling.py`: batch,
    tiles, h, w, c); each tile is encoded and shuffled alone, and their
    tokens are one sequence. A tile that is all NaN is padding: the LM
    sees none of its tokens.
  'fused_mlp': Prismatic (Karamcheti et al., ICML 2024), the eyes of
    OpenVLA. As 'prefix', with Prismatic's 3-layer projector over the
    tokens of a `fusion.FusedEncoder` (encoders concatenated per patch).

Tokens are a SentencePiece vocabulary's; a caption ends with its </s>
(`eos`). The decoder reads the caption shifted right after <s> (`bos`);
id `vocab_size` is [MASK], an extra embedding row. In decoding, keys and
values of the positions seen so far stay in the 'cache' collection
(`cache_len` positions), so that each step runs one token
(`vit_jax.models.decoding`).
"""

import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import attention
from vit_jax.models import layers

CONNECTORS = ('cross_attention', 'prefix', 'pixel_shuffle_mlp', 'fused_mlp')
# The connectors of a decoder-only LM over [image tokens; text tokens].
PREFIX_LM = CONNECTORS[1:]


def attention_mask(query_pos, key_pos, prefix=0):
  """(queries, keys) booleans: a query sees the keys at or before its
  position and the first `prefix` keys (prefix-LM; 0: causal)."""
  return (key_pos[None, :] <= query_pos[:, None]) | (key_pos[None, :] < prefix)


def shift_right(tokens, bos):
  """The decoder's inputs for `tokens`: <s>, then all but the last."""
  return jnp.concatenate([jnp.full_like(tokens[:, :1], bos), tokens[:, :-1]],
                         axis=1)


def caption_weights(tokens, eos):
  """1.0 for a caption's tokens up to and including its first `eos`."""
  ends = tokens == eos
  return (jnp.cumsum(ends, axis=1) - ends == 0).astype(jnp.float32)


class Attention(nn.Module):
  """Multi-head attention without biases (CapPa's). With `cache_len`, the
  keys and values of `inputs` are written at `index` into a cache of that
  many positions, and the queries attend to the whole cache."""
  num_heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs, memory, mask, *, cache_len=None, index=None):
    width = inputs.shape[-1]
    dense = functools.partial(
        nn.DenseGeneral, features=(self.num_heads, width // self.num_heads),
        use_bias=False, dtype=self.dtype)
    query = dense(name='query')(inputs)
    key, value = dense(name='key')(memory), dense(name='value')(memory)
    if cache_len is not None:
      shape = (key.shape[0], cache_len, *key.shape[2:])
      cached = [self.variable('cache', name, jnp.zeros, shape, key.dtype)
                for name in ('cached_key', 'cached_value')]
      for var, new in zip(cached, (key, value)):
        var.value = jax.lax.dynamic_update_slice_in_dim(var.value, new, index,
                                                        axis=1)
      key, value = (var.value for var in cached)
    y = attention.attention(query, key, value,
                            mask=None if mask is None else mask[:, None])
    return nn.DenseGeneral(width, axis=(-2, -1), use_bias=False,
                           dtype=self.dtype, name='out')(y)


class DecoderBlock(nn.Module):
  """Pre-LN: self-attention, cross-attention to `memory` (if given), MLP."""
  num_heads: int
  mlp_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, memory, mask, cache_len=None, index=None,
               memory_mask=None):
    y = nn.LayerNorm(name='LayerNorm1')(x)
    x = x + Attention(self.num_heads, self.dtype, name='SelfAttn')(
        y, y, mask, cache_len=cache_len, index=index)
    if memory is not None:
      y = nn.LayerNorm(name='LayerNorm2')(x)
      x = x + Attention(self.num_heads, self.dtype, name='CrossAttn')(
          y, memory, None if memory_mask is None else memory_mask[:, None])
    y = nn.LayerNorm(name='LayerNorm3')(x)
    return x + layers.MlpBlock(self.mlp_dim, dropout_rate=0.,
                               dtype=self.dtype, name='MLP')(
                                   y, deterministic=True)


class TextDecoder(nn.Module):
  """Token embeddings (and [MASK]), learned positions, `DecoderBlock`s,
  a final LayerNorm and the logits.

  Attributes:
    vocab_size: of the tokenizer; id `vocab_size` is [MASK].
    max_len: text positions (the tokenizer's `max_len`).
    remat: recompute each block's activations in the backward pass.
  """
  vocab_size: int
  width: int = 256
  num_layers: int = 6
  num_heads: int = 8
  mlp_dim: int = 1024
  max_len: int = 32
  remat: bool = False
  dtype: Any = 'float32'

  @nn.compact
  def __call__(self, tokens, *, memory=None, prefix=None, parallel=None,
               cache_len=None, memory_mask=None):
    """Logits (batch, tokens, vocab_size) of the text positions.

    memory: tokens to cross-attend to; memory_mask: (batch, M) bools, the
    memory tokens that are real (NaFlex's padding is not attended to);
    prefix: (batch, P, width) inputs
    before the text (prefix-LM); parallel: (batch,) booleans, examples
    whose text attends to all of itself; cache_len: decode with a cache.
    """
    dtype = jnp.dtype(self.dtype)
    x = nn.Embed(self.vocab_size + 1, self.width, name='embedding')(tokens)
    n_prefix = 0 if prefix is None else prefix.shape[1]
    if prefix is not None:  # NaN tokens are padding (unused tiles)
      real = ~jnp.isnan(prefix[..., 0])
      prefix = jnp.where(real[..., None], prefix, 0)
    if cache_len is None:  # the whole sequence at once
      start, seen = jnp.int32(0), jnp.int32(n_prefix)
    else:
      index = self.variable('cache', 'index', lambda: jnp.int32(0))
      seen = self.variable('cache', 'prefix', lambda: jnp.int32(n_prefix))
      start, seen = index.value, seen.value
      index.value = start + n_prefix + tokens.shape[1]
    posemb = self.param('pos_embedding', nn.initializers.normal(0.02),
                        (1, self.max_len, self.width))
    # Text position of the first token: the prefix has no positions here.
    text_start = jnp.maximum(start - seen, 0)
    x = x + jax.lax.dynamic_slice_in_dim(posemb, text_start, tokens.shape[1],
                                         axis=1)
    if prefix is not None:
      x = jnp.concatenate([prefix.astype(x.dtype), x], axis=1)
    x = x.astype(dtype)
    query_pos = start + jnp.arange(x.shape[1])
    key_pos = query_pos if cache_len is None else jnp.arange(cache_len)
    mask = attention_mask(query_pos, key_pos, seen)[None]
    if parallel is not None:
      mask = mask | parallel[:, None, None]
    keys_real = self._real_keys(None if prefix is None else real, x.shape,
                                cache_len)
    if keys_real is not None:
      mask = mask & keys_real[:, None, :]
    # Decoding keeps no activations for a backward pass: no remat.
    remat = self.remat and cache_len is None
    block = nn.remat(DecoderBlock) if remat else DecoderBlock
    for i in range(self.num_layers):
      x = block(self.num_heads, self.mlp_dim, dtype, name=f'block{i}')(
          x, memory, mask, cache_len, start, memory_mask)
    x = nn.LayerNorm(name='LayerNorm')(x[:, n_prefix:])
    return nn.Dense(self.vocab_size, kernel_init=nn.initializers.zeros,
                    dtype=dtype, name='head')(x).astype(jnp.float32)


  def _real_keys(self, real, shape, cache_len):
    """(batch, keys) bools, False for the prefix's padding; None without a
    prefix. Decoding keeps them in the cache, written with the prefix."""
    if cache_len is None:
      return None if real is None else jnp.concatenate(
          [real, jnp.ones((shape[0], shape[1] - real.shape[1]), bool)], 1)
    if real is None and not self.has_variable('cache', 'keys_real'):
      return None
    keys = self.variable('cache', 'keys_real', jnp.ones,
                         (shape[0], cache_len), bool)
    if real is not None:
      keys.value = keys.value.at[:, :real.shape[1]].set(real)
    return keys.value


class Projector(nn.Module):
  """LLaVA-1.5's connector: Dense, GELU, Dense, to the LM's width."""
  width: int

  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Dense(self.width, name='Dense_0')(x), approximate=False)
    return nn.Dense(self.width, name='Dense_1')(x)


def pixel_shuffle(tokens):
  """InternVL's pixel shuffle (scale 0.5) of the tokens (n, g * g, c) of a
  g x g grid, row by row: (n, g * g / 4, 4c), each 2 x 2 block of
  neighbours one token, its channels by (row offset, column offset)."""
  n, length, c = tokens.shape
  g = math.isqrt(length)
  if g * g != length or g % 2:
    raise ValueError(f'Pixel shuffle needs an even square grid of tokens; '
                     f'got {length}.')
  x = tokens.reshape(n, g // 2, 2, g // 2, 2, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, length // 4, 4 * c)


class PixelShuffleProjector(nn.Module):
  """InternVL's connector: pixel shuffle, then LayerNorm (torch's epsilon),
  Dense, GELU, Dense, to the LM's width."""
  width: int

  @nn.compact
  def __call__(self, x):
    x = nn.LayerNorm(epsilon=1e-5, name='LayerNorm')(pixel_shuffle(x))
    x = nn.gelu(nn.Dense(self.width, name='Dense_0')(x), approximate=False)
    return nn.Dense(self.width, name='Dense_1')(x)


class FusedProjector(nn.Module):
  """Prismatic's 'fused-gelu-mlp': Dense to 4x the fused width, GELU,
  Dense to the LM's width, GELU, Dense."""
  width: int

  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Dense(4 * x.shape[-1], name='Dense_0')(x),
                approximate=False)
    x = nn.gelu(nn.Dense(self.width, name='Dense_1')(x), approximate=False)
    return nn.Dense(self.width, name='Dense_2')(x)


PROJECTORS = {'prefix': Projector, 'pixel_shuffle_mlp': PixelShuffleProjector,
              'fused_mlp': FusedProjector}


def _per_tile(fn, x, *, nan=False):
  """`fn` over tiles (batch, tiles, ...) as one batch; with `nan`, the
  all-NaN (padding) tiles are zeros for `fn` and NaN again after it."""
  b, t = x.shape[:2]
  real = ~jnp.isnan(x.reshape(b, t, -1)[..., 0])
  y = fn(jnp.nan_to_num(x).reshape(b * t, *x.shape[2:]))
  y = y.reshape(b, t, *y.shape[1:])
  if nan:
    y = jnp.where(real.reshape(b, t, *[1] * (y.ndim - 2)), y, jnp.nan)
  return y


class Captioner(nn.Module):
  """An image `encoder` (with `forward_intermediates`) and a text decoder.

  Attributes:
    encoder: the image model (a ViT, Swin or Mixer).
    decoder: `TextDecoder` attributes.
    connector: one of CONNECTORS.
    block: the encoder's block whose patch tokens the decoder reads (-1:
      the last; LLaVA reads the penultimate, -2).
    norm: those tokens through the encoder's final norm (CapPa's are the
      encoder's output; LLaVA's are not).
  """
  encoder: nn.Module
  decoder: Any
  connector: str = 'cross_attention'
  block: int = -1
  norm: bool = True

  def setup(self):
    if self.connector not in CONNECTORS:
      raise ValueError(f'Unknown connector {self.connector!r}; expected one '
                       f'of {CONNECTORS}.')
    self.text = TextDecoder(**self.decoder)
    if self.connector in PROJECTORS:
      self.projector = PROJECTORS[self.connector](self.text.width)

  def image_tokens(self, images, train=False):
    """The encoder's patch tokens of `block`, (batch, P, its width); of
    tiles (batch, tiles, ...): (batch, tiles, P, width), NaN for padding."""
    def encode(x):
      return self.encoder.forward_intermediates(
          x, [self.block], norm=self.norm, output_fmt='NLC',
          intermediates_only=True, train=train)[0]
    return _per_tile(encode, images, nan=True) if images.ndim == 5 else \
        encode(images)

  def connect(self, tokens):
    """What the decoder reads of the image tokens (projected, but for
    CapPa); tiles' tokens projected each alone, then one sequence."""
    if self.connector not in PROJECTORS:
      return tokens
    if tokens.ndim == 3:
      return self.projector(tokens)
    out = _per_tile(self.projector, tokens, nan=True)
    return out.reshape(out.shape[0], -1, out.shape[-1])

  def encode(self, images, train=False):
    return self.connect(self.image_tokens(images, train))

  def logits(self, memory, tokens, *, parallel=None, cache_len=None):
    """Logits of the text positions, given the decoder's inputs `tokens`;
    `memory` from `encode` (a decoding step after the first: None for a
    prefix LM, whose image is in the cache)."""
    if self.connector in PREFIX_LM:
      return self.text(tokens, prefix=memory, parallel=parallel,
                       cache_len=cache_len)
    return self.text(tokens, memory=memory, parallel=parallel,
                     cache_len=cache_len)

  def __call__(self, images, tokens, *, train=False, parallel=None):
    return self.logits(self.encode(images, train), tokens, parallel=parallel)


def log_likelihood(logits, targets, eos):
  """(batch,) sums of log p(target) over each caption's tokens to its
  first `eos`."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32))
  picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  return (picked * caption_weights(targets, eos)).sum(-1)

