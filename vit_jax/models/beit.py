"""BEiT's masked image modelling (Bao et al., 2022; BEiT v2, Peng et al.,
2022): block-wise masks, the visual tokenizers that make its targets, and
the pretraining model (a ViT with a mask token, a linear head over the
tokenizer's codes).

Tokenizers (`VisualTokenizer.kind`):
  'vqkd'   BEiT v2's vector-quantized knowledge distillation: a ViT encodes
           each patch, the nearest code by cosine similarity replaces it,
           and a decoder reconstructs a teacher's patch features from the
           codes;
  'vqvae'  the same quantizer, reconstructing the patches' pixels;
  'dvae'   a discrete VAE with a Gumbel-softmax relaxation, on pixels (BEiT
           v1 used DALL-E's).
"""

import math
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from vit_jax.models import posemb
from vit_jax.models import vit as models_vit
from vit_jax.models.encoder import Encoder

KINDS = ('vqkd', 'vqvae', 'dvae')


def block_mask(key, grid: Tuple[int, int], num_masked: int, *,
               min_patches: int = 16, max_patches: Optional[int] = None,
               min_aspect: float = 0.3, attempts: int = 10):
  """One image's mask, (h * w,) bools, by BEiT's Algorithm 1 (its
  `MaskingGenerator`): rectangles of a random area (at least `min_patches`)
  and aspect ratio (log-uniform in [min_aspect, 1 / min_aspect]) are added
  until `num_masked` patches are masked, each adding at most what is left;
  a round of `attempts` rectangles that adds nothing ends it."""
  height, width = grid
  max_patches = num_masked if max_patches is None else max_patches
  log_aspect = math.log(min_aspect)
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]

  def attempt(carry, key):
    mask, delta, budget = carry
    k_area, k_aspect, k_top, k_left = jax.random.split(key, 4)
    # Python's uniform(a, b): a + (b - a) u, also when b < a.
    area = min_patches + (budget - min_patches) * jax.random.uniform(k_area)
    aspect = jnp.exp(jax.random.uniform(k_aspect, minval=log_aspect,
                                        maxval=-log_aspect))
    h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
    w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
    top = jax.random.randint(k_top, (), 0, jnp.maximum(height - h, 0) + 1)
    left = jax.random.randint(k_left, (), 0, jnp.maximum(width - w, 0) + 1)
    box = ((rows >= top) & (rows < top + h) & (cols >= left) &
           (cols < left + w))
    new = jnp.sum(box & ~mask)
    take = (w < width) & (h < height) & (delta == 0) & (new > 0) & (
        new <= budget)
    return (mask | (box & take), jnp.where(take, new, delta), budget), None

  def one_round(carry):
    mask, count, key, _ = carry
    key, sub = jax.random.split(key)
    budget = jnp.minimum(num_masked - count, max_patches)
    (mask, delta, _), _ = lax.scan(attempt, (mask, 0, budget),
                                   jax.random.split(sub, attempts))
    return mask, count + delta, key, delta == 0

  start = (jnp.zeros(grid, bool), jnp.int32(0), key, jnp.bool_(False))
  mask, *_ = lax.while_loop(lambda c: (c[1] < num_masked) & ~c[3],
                            one_round, start)
  return mask.reshape(-1)


def block_masks(key, batch: int, grid, num_masked: int, **kw):
  """(batch, h * w) masks, one `block_mask` per image."""
  return jax.vmap(lambda k: block_mask(k, grid, num_masked, **kw))(
      jax.random.split(key, batch))


def masked_token_loss(logits, targets, mask):
  """(Cross-entropy, accuracy) of the codes `targets` (batch, patches) from
  `logits` (batch, patches, K), over the masked patches only."""
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  weight = mask.astype(jnp.float32)
  count = jnp.maximum(weight.sum(), 1.)
  correct = (jnp.argmax(logits, -1) == targets) * weight
  return (nll * weight).sum() / count, correct.sum() / count


def l2_normalize(x, eps=1e-12):
  return x * lax.rsqrt(jnp.maximum(jnp.sum(x * x, -1, keepdims=True), eps))


def nearest_codes(z, codebook):
  """(indices, codes): the entry of `codebook` (K, d) of the highest cosine
  similarity to each of `z` (..., d), l2-normalized."""
  codebook = l2_normalize(codebook)
  index = jnp.argmax(l2_normalize(z) @ codebook.T, -1)
  return index, codebook[index]


def ema_codebook(codebook, usage, z, index, decay: float):
  """BEiT v2's normalized EMA update, as (codebook, usage): each used code
  moves to decay * code + (1 - decay) * the normalized mean of the
  normalized `z` (n, d) assigned to it (`index`), renormalized; `usage`
  (K,) is the EMA of its assignment counts."""
  k = codebook.shape[0]
  onehot = jax.nn.one_hot(index, k, dtype=jnp.float32)
  counts = onehot.sum(0)
  usage = decay * usage + (1 - decay) * counts
  means = l2_normalize(onehot.T @ l2_normalize(z))
  means = jnp.where(counts[:, None] > 0, means, codebook)
  return l2_normalize(decay * codebook + (1 - decay) * means), usage


def restart_dead_codes(key, codebook, usage, z, threshold: float):
  """Codes whose `usage` is below `threshold` times a uniform share are
  replaced by random (normalized) `z` (n, d) of the batch, and given a
  uniform share: (codebook, usage, how many were restarted)."""
  k = codebook.shape[0]
  share = jnp.sum(usage) / k
  dead = usage < threshold * share
  picks = jax.random.randint(key, (k,), 0, z.shape[0])
  codebook = jnp.where(dead[:, None], l2_normalize(z[picks]), codebook)
  return codebook, jnp.where(dead, share, usage), dead.sum()


class VisualTokenizer(nn.Module):
  """Image -> one code per patch, and the codes -> a reconstruction.

  Attributes:
    encoder: `VisionTransformer` attributes of the encoder (its patch grid
      is the tokens'); its class token and head are not used.
    kind: one of KINDS.
    codebook_size: K.
    code_dim: the codes' width (BEiT v2: 32).
    decoder: `hidden_size`, `num_layers`, `num_heads`, `mlp_dim` of the
      Transformer from codes to targets.
    target_dim: the width of each patch's target (a teacher's features, or
      its pixels).
  """
  encoder: Any
  kind: str
  codebook_size: int
  code_dim: int
  decoder: Any
  target_dim: int

  def setup(self):
    width = self.encoder['hidden_size']
    self.vit = models_vit.VisionTransformer(
        name='encoder', **{**self.encoder, 'num_classes': None,
                           'classifier': 'unpooled'})
    out = self.codebook_size if self.kind == 'dvae' else self.code_dim
    # BEiT v2's `encode_task_layer`: Dense, tanh, Dense.
    self.code_hidden = nn.Dense(width, name='code_hidden')
    self.code_out = nn.Dense(out, name='code_out')
    self.codebook = self.param(
        'codebook', lambda k, s: l2_normalize(jax.random.normal(k, s)),
        (self.codebook_size, self.code_dim))
    d = self.decoder
    self.from_code = nn.Dense(d['hidden_size'], name='from_code')
    self.transformer = Encoder(
        num_layers=d['num_layers'], mlp_dim=d['mlp_dim'],
        num_heads=d['num_heads'], dropout_rate=0.,
        attention_dropout_rate=0., gelu_approximate=False, name='decoder')
    self.head = nn.Dense(self.target_dim, name='head')

  def encode(self, images, train=False):
    """(batch, patches, code_dim) features (dvae: (batch, patches, K)
    logits) and the patch grid."""
    tokens = self.vit(images, train=train)
    grid = posemb.token_grid(self.encoder, images.shape[1:3])
    return self.code_out(jnp.tanh(self.code_hidden(tokens))), grid

  def decode(self, codes, grid, train=False):
    """Targets (batch, patches, target_dim) from codes (batch, patches,
    code_dim)."""
    x = self.transformer(self.from_code(codes), train=train, grid=grid)
    return self.head(x)

  def tokens(self, images):
    """(batch, patches) int32 codes: BEiT's targets."""
    z, _ = self.encode(images)
    if self.kind == 'dvae':
      return jnp.argmax(z, -1).astype(jnp.int32)
    return nearest_codes(z, self.codebook)[0].astype(jnp.int32)

  def __call__(self, images, *, train, temperature=1.):
    """{'pred': reconstruction, 'index': code indices, 'z': encoder
    outputs}; for a VQ 'codes', the (normalized) codes of `index`, for
    'dvae' 'logits' (Gumbel-softmax at `temperature` in training, the hard
    codes else; needs the 'gumbel' rng in training)."""
    z, grid = self.encode(images, train)
    if self.kind == 'dvae':
      index = jnp.argmax(z, -1)
      if train:
        noise = jax.random.gumbel(self.make_rng('gumbel'), z.shape)
        weights = jax.nn.softmax((z + noise) / temperature, -1)
      else:
        weights = jax.nn.one_hot(index, self.codebook_size)
      codes = weights @ self.codebook
      return {'pred': self.decode(codes, grid, train), 'index': index,
              'z': z, 'logits': z}
    index, codes = nearest_codes(z, self.codebook)
    z = l2_normalize(z)
    straight = z + lax.stop_gradient(codes - z)  # straight-through
    return {'pred': self.decode(straight, grid, train), 'index': index,
            'z': z, 'codes': codes}


class Pretrainer(nn.Module):
  """A ViT whose masked patches are its `mask_token`, and a linear head
  `head` from each patch token to the K codes.

  Attributes:
    encoder: `VisionTransformer` attributes; the class token (if any) is
      kept, and the encoder's final norm (or `fc_norm`) ends it.
    vocab_size: K, the tokenizer's codebook size.
  """
  encoder: Any
  vocab_size: int

  @nn.compact
  def __call__(self, images, *, train, mask):
    classifier = ('token_unpooled' if models_vit.has_class_token(self.encoder)
                  else 'unpooled')
    tokens = models_vit.VisionTransformer(
        name='encoder', **{**self.encoder, 'num_classes': None,
                           'classifier': classifier})(
                               images, train=train, mask=mask)
    prefix = models_vit.num_prefix_tokens(classifier)
    return nn.Dense(self.vocab_size, name='head',
                    kernel_init=nn.initializers.truncated_normal(0.02))(
                        tokens[:, prefix:])
