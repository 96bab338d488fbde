"""The model SigLIP 2's recipe trains (Tschannen et al., 2025): two towers,
a LocCa decoder on the image tower's patch tokens, and the SILC and TIPS
heads of its self-distillation.

  img, img_pool, img_head  the image tower: a ViT without pooling (or, for
                           NaFlex, a NaViT with one image per sequence, its
                           MAP pooling inside it), a MAP head and the
                           projection to the shared space
  txt                      the text tower (`lit.TextTransformer`), projected
  t, b                     SigLIP's log temperature and bias
  text_decoder             LocCa's decoder (`captioning.TextDecoder`),
                           cross-attending to the image tower's tokens
  silc_head, tips_head     DINO heads (`dino.DinoHead`) on the pooled
                           feature (SILC) and on each patch token (TIPS)

Its `__call__(images=, tokens=)` is `LitModel`'s (normalized embeddings and
`t`, `b`), so the zero-shot evaluator reads it; `encode` and `logits` are a
`Captioner`'s, so `models.decoding` decodes it.
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.models import captioning
from vit_jax.models import dino
from vit_jax.models import layers
from vit_jax.models import lit
from vit_jax.models import navit
from vit_jax.models import posemb
from vit_jax.models import vit as models_vit


def naflex_batch(images, patch: int):
  """NHWC images (all one size) as NaViT's padded batch of one image per
  sequence: every patch, row-major, on the images' own grid."""
  n, height, width, channels = images.shape
  h, w = height // patch, width // patch
  patches = images.reshape(n, h, patch, w, patch, channels)
  patches = jnp.swapaxes(patches, 2, 3).reshape(n, h * w, -1)
  full = lambda v: jnp.broadcast_to(jnp.asarray(v, jnp.int32), (n, h * w))
  positions = dict(zip(navit.POSITION_KEYS, posemb.grid_positions((h, w))))
  return {'patches': patches, 'segment_ids': full(1),
          **{k: full(v) for k, v in positions.items()}}


def _normalized(z):
  return z / (jnp.linalg.norm(z, axis=-1, keepdims=True) + 1e-8)


class RecipeModel(nn.Module):
  """Two towers, LocCa's decoder, SILC's and TIPS' heads (module docstring).

  Attributes:
    image: the image tower's attributes: a `VisionTransformer`'s, or with
      `naflex` a `NaViT`'s (its head, pooling and images per sequence are
      set here).
    text: `lit.TextTransformer` attributes.
    out_dim: the shared space's width.
    naflex: the image tower is a NaViT on padded sequences (NaFlex).
    decoder: `captioning.TextDecoder` attributes, or None (no decoder).
    silc_head, tips_head: `dino.DinoHead` attributes, or None.
    temperature_init, bias_init: SigLIP's exp(t) and b at init.
  """
  image: Any
  text: Any
  out_dim: int
  naflex: bool = False
  decoder: Optional[Any] = None
  silc_head: Optional[Any] = None
  tips_head: Optional[Any] = None
  temperature_init: float = 10.
  bias_init: float = -10.
  model_name: Optional[str] = None

  def setup(self):
    image = dict(self.image)
    if self.naflex:
      self.img = navit.NaViT(**{**image, 'num_classes': None, 'pool': 'map',
                                'max_images': 1})
    else:
      image.update(num_classes=None, classifier='unpooled')
      self.img = models_vit.VisionTransformer(**image)
      transformer = image['transformer']
      self.img_pool = layers.MAPHead(
          num_heads=transformer['num_heads'], mlp_dim=transformer['mlp_dim'],
          gelu_approximate=transformer.get('gelu_approximate', True))
    self.img_head = nn.Dense(self.out_dim)
    self.txt = lit.TextTransformer(**{**self.text, 'num_classes': self.out_dim})
    self.t = self.param('t', nn.initializers.constant(
        np.log(self.temperature_init)), (1,), jnp.float32)
    self.b = self.param('b', nn.initializers.constant(self.bias_init), (1,),
                        jnp.float32)
    if self.decoder is not None:
      self.text_decoder = captioning.TextDecoder(**self.decoder)
    if self.silc_head is not None:
      self.silc = dino.DinoHead(**self.silc_head)
    if self.tips_head is not None:
      self.tips = dino.DinoHead(**self.tips_head)

  def patch(self) -> int:
    return models_vit.patch_size(self.image['patches'])[0]

  def image_features(self, images, *, train=False, mask=None):
    """(pooled (B, D), patch tokens (B, N, D)) of NHWC `images`, or with
    `naflex` of a NaViT batch (a dict); `mask` (B, patches) bools: the
    patches the ViT sees as its `mask_token` (TIPS)."""
    if self.naflex:
      if mask is not None:
        raise ValueError('The NaFlex tower takes no patch mask.')
      if not isinstance(images, dict):
        images = naflex_batch(images, self.patch())
      pooled, tokens = self.img(images, train=train, with_tokens=True)
      return pooled[:, 0], tokens
    tokens = self.img(images, train=train, mask=mask)
    return self.img_pool(tokens), tokens

  def embed_image(self, pooled):
    return _normalized(self.img_head(pooled))

  def embed_text(self, tokens, *, train=False):
    return _normalized(self.txt(tokens, train=train)[0])

  def __call__(self, *, images=None, tokens=None, train=False):
    """(zimg, ztxt, {'t': exp(t), 'b': b}), as `LitModel`'s; None for an
    absent input."""
    zimg = ztxt = None
    if images is not None:
      zimg = self.embed_image(self.image_features(images, train=train)[0])
    if tokens is not None:
      ztxt = self.embed_text(tokens, train=train)
    return zimg, ztxt, {'t': jnp.exp(self.t), 'b': self.b}

  def encode(self, images, train=False):
    """The decoder's memory: the image tower's patch tokens."""
    return self.image_features(images, train=train)[1]

  def logits(self, memory, tokens, *, parallel=None, cache_len=None,
             memory_mask=None):
    """The decoder's logits, as `Captioner.logits`'s; `memory_mask` (B, N)
    the real tokens of a NaFlex memory."""
    return self.text_decoder(tokens, memory=memory, parallel=parallel,
                             cache_len=cache_len, memory_mask=memory_mask)

  def silc_scores(self, pooled):
    return self.silc(pooled)

  def tips_scores(self, tokens):
    return self.tips(tokens)

  def init_all(self, images, text_tokens, decoder_tokens):
    """Touches every part (the parameters' init)."""
    mask = None
    if self.tips_head is not None:
      patches = (images.shape[1] // self.patch()) * (
          images.shape[2] // self.patch())
      mask = jnp.zeros((images.shape[0], patches), bool)
    pooled, tokens = self.image_features(images, mask=mask)
    out = [self.embed_image(pooled), self.embed_text(text_tokens), self.t,
           self.b]
    if self.decoder is not None:
      out.append(self.logits(tokens, decoder_tokens))
    if self.silc_head is not None:
      out.append(self.silc_scores(pooled))
    if self.tips_head is not None:
      out.append(self.tips_scores(tokens))
    return out
