"""ViViT, video Vision Transformers (Arnab et al., ICCV 2021), in Flax Linen.

A video (batch, T, H, W, C) is cut into tubelets of `tubelet` frames and a
patch each (a 3-D convolution, `embedding`, kernel (t, p, p, C, D)): T' =
T / t slots of h x w tokens. The paper's model 1 ('unfactorised') encodes
all T'·h·w tokens (and a class token) with one ViT encoder; model 2 (the
factorised encoder, 'factorised') encodes each slot with a spatial ViT
(`SpatialTransformer`, its class token `cls_SpatialTransformer`), then the
slots' pooled tokens with a temporal one (`TemporalTransformer`,
`cls_TemporalTransformer`). The names are Scenic's, but for the head,
`head` as the ViT's (Scenic: `output_projection`), so that an image ViT's
parameters map by name (`vit_jax.checkpoints.inflate`).

VideoMAE's encoder (Tong et al., NeurIPS 2022) is model 1 with options: a
fixed sinusoid table (temporal_posemb='sincos'), no class token ('gap'),
query and value biases but no key bias (transformer.qkv_bias='qv'), and
after mean pooling either `fc_norm` without a final norm (its fine-tuned
models) or the final norm alone (its pre-trained encoders).
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import intermediates
from vit_jax.models import ops
from vit_jax.models.encoder import Encoder
from vit_jax.models import layers
from vit_jax.models.posemb import patch_size
from vit_jax.models.posemb import sinusoid_table

ENCODERS = ('unfactorised', 'factorised')
TEMPORAL_POSEMBS = ('joint', 'separate', 'sincos')
CLASSIFIERS = ('token', 'gap')
OUTPUT_FORMATS = ('NTHWC', 'NLC')


def video_grid(shape, tubelet: int, patch) -> tuple:
  """The (T', h, w) token grid of a (batch, T, H, W, C) video; raises a
  ValueError unless T, H and W are multiples of the tubelet's sides."""
  if len(shape) != 5:
    raise ValueError('Expected videos (batch, frames, height, width, '
                     f'channels), got shape {tuple(shape)}.')
  _, t, h, w, _ = shape
  sides = (tubelet, *patch)
  if any(n % s or n < s for n, s in zip((t, h, w), sides)):
    raise ValueError(f'Video of {t} frames of {h}x{w} is not a multiple of '
                     f'the tubelet {sides[0]}x{sides[1]}x{sides[2]} '
                     '(frames x height x width).')
  return t // sides[0], h // sides[1], w // sides[2]


class SeparatePositionEmbs(nn.Module):
  """Adds a spatial table `pos_embedding` (1, prefix + h*w, D), an image
  ViT's, and a temporal one `pos_embedding_time` (1, T', D): patch token
  (t, i) gets spatial entry prefix + i plus temporal entry t; the prefix
  (class) token its spatial entry alone."""
  posemb_init: Any = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, x, slots: int, prefix: int):
    b, n, d = x.shape
    per_slot = (n - prefix) // slots
    space = self.param('pos_embedding', self.posemb_init,
                       (1, prefix + per_slot, d))
    time = self.param('pos_embedding_time', self.posemb_init, (1, slots, d))
    patches = space[:, None, prefix:] + time[:, :, None]
    pe = jnp.concatenate(
        [space[:, :prefix], patches.reshape(1, slots * per_slot, d)], axis=1)
    return x + pe.astype(x.dtype)


class SeparatePosembEncoder(nn.Module):
  """An `Encoder` whose position embedding is `SeparatePositionEmbs`, in
  the encoder's own scope: `Transformer/posembed_input/pos_embedding` is
  where an image ViT has its table."""
  settings: Any

  def setup(self):
    self.encoder = Encoder(add_position_embedding=False, **self.settings)
    nn.share_scope(self, self.encoder)
    self.posembed_input = SeparatePositionEmbs()
    self.dropout = nn.Dropout(rate=self.encoder.dropout_rate)

  def __call__(self, x, *, train, slots, prefix, **kw):
    x = self.posembed_input(x, slots, prefix)
    x = self.dropout(x, deterministic=not train)
    return self.encoder(x, train=train, **kw)


class ViViT(nn.Module):
  """ViViT: tubelet embedding, then one encoder (model 1) or a spatial and
  a temporal one (model 2, the factorised encoder).

  Attributes:
    num_classes: head size; 0 or None for no head.
    patches: ConfigDict with `size`, the (height, width) of a tubelet.
    transformer: ConfigDict of `Encoder` attributes (of the spatial encoder,
      for the factorised encoder).
    hidden_size: token width D.
    tubelet: frames per tubelet t (the paper's 16x2: 16 px, t = 2).
    encoder: 'unfactorised' or 'factorised' (ENCODERS).
    temporal_transformer: the factorised encoder's temporal `Encoder`
      attributes (its width is hidden_size); None for 'unfactorised'.
    temporal_posemb: of the unfactorised encoder: 'joint', one learned
      table over the class token and all T'·h·w tokens (the paper's);
      'separate', an image ViT's spatial table plus a learned temporal one
      over the T' slots (`SeparatePositionEmbs`); 'sincos', VideoMAE's
      fixed table (`sinusoid_table`) over the T'·h·w tokens, no parameter
      (the class token, if any, gets none). The factorised encoder's
      tables are separate by construction (one per encoder); None: 'joint'
      or that.
    representation_size: width of the tanh `pre_logits` layer, if any.
    classifier: 'token' (class token) or 'gap' (mean of the tokens), in
      each encoder.
    fc_norm: a LayerNorm `fc_norm` on the pooled features (VideoMAE's
      fine-tuned models, which set `transformer.final_norm` False), of
      epsilon `fc_norm_eps` (None: the encoder's `layer_norm_eps`).
    dtype: of the computation; parameters stay float32, logits float32.
  """
  num_classes: Optional[int]
  patches: Any
  transformer: Any
  hidden_size: int
  tubelet: int = 2
  encoder: str = 'unfactorised'
  temporal_transformer: Optional[Any] = None
  temporal_posemb: Optional[str] = None
  representation_size: Optional[int] = None
  classifier: str = 'token'
  fc_norm: bool = False
  fc_norm_eps: Optional[float] = None
  dtype: Any = jnp.float32
  model_name: Optional[str] = None
  # Its inputs are clips (batch, T, H, W, C), not images.
  TAKES_CLIPS = True

  def __call__(self, inputs, *, train):
    """Logits (or pooled features, without a head) of (batch, T, H, W, C)
    videos."""
    return self._forward(inputs, train)

  def forward_intermediates(self, inputs, indices=None, *, norm=False,
                            output_fmt='NTHWC', intermediates_only=False,
                            return_prefix_tokens=False, train=False):
    """The outputs of the blocks `indices` (`intermediates.take_indices`)
    that see patches: the encoder's, or the factorised encoder's spatial
    one's; as VisionTransformer's method.

    Each is a map (batch, T', h, w, D) ('NTHWC') or the tokens (batch,
    T'·h·w, D) ('NLC'), the class tokens dropped, or with
    `return_prefix_tokens` the pair (that, the class tokens (batch, k, D):
    one, or one per slot for the factorised encoder). `norm` puts each
    through the (spatial) encoder's final norm. `intermediates_only=False`
    returns (final tokens, intermediates), the final tokens the
    (temporal) encoder's output; otherwise no block after the last asked
    for runs (nor the temporal encoder).
    """
    intermediates.check_output_fmt(output_fmt, OUTPUT_FORMATS)
    take = intermediates.take_indices(self.transformer['num_layers'],
                                      indices)
    depth = max(take) + 1 if intermediates_only else None
    final, taken, grid = self._forward(inputs, train,
                                       take=(take, depth, norm))
    taken = [self._split(y, grid, output_fmt, return_prefix_tokens)
             for y in taken]
    return taken if intermediates_only else (final, taken)

  def _split(self, tokens, grid, output_fmt, return_prefix_tokens):
    """A block's tokens as `forward_intermediates` returns them."""
    slots, h, w = grid
    prefix = int(self.classifier == 'token')
    d = tokens.shape[-1]
    if self.encoder == 'factorised':  # (batch * T', prefix + h*w, D)
      tokens = tokens.reshape(-1, slots, prefix + h * w, d)
      patches, cls = tokens[:, :, prefix:], tokens[:, :, :prefix]
    else:
      patches, cls = tokens[:, prefix:], tokens[:, :prefix]
    shape = (slots, h, w, d) if output_fmt == 'NTHWC' else (-1, d)
    patches = patches.reshape(tokens.shape[0], *shape)
    if not return_prefix_tokens:
      return patches
    return patches, cls.reshape(tokens.shape[0], -1, d)

  def _check(self):
    if self.encoder not in ENCODERS:
      raise ValueError(f'Unknown encoder {self.encoder!r}; expected one of '
                       f'{ENCODERS}.')
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; a ViViT '
                       f'takes one of {CLASSIFIERS}.')
    if self.temporal_posemb not in (None, *TEMPORAL_POSEMBS):
      raise ValueError(f'Unknown temporal_posemb {self.temporal_posemb!r}; '
                       f'expected None or one of {TEMPORAL_POSEMBS}.')
    factorised = self.encoder == 'factorised'
    if factorised != (self.temporal_transformer is not None):
      raise ValueError("encoder='factorised' needs temporal_transformer, "
                       f'and only it: got encoder={self.encoder!r} with '
                       f'temporal_transformer={self.temporal_transformer}.')
    if factorised and self.temporal_posemb in ('joint', 'sincos'):
      raise ValueError("The factorised encoder's position tables are "
                       'separate (one per encoder): temporal_posemb='
                       f"{self.temporal_posemb!r} is for encoder="
                       "'unfactorised'.")

  @nn.compact
  def _forward(self, inputs, train, take=None):
    """`__call__`, or with `take`, (block indices, blocks to run, norm
    them), (final tokens, those blocks' tokens, the (T', h, w) grid)."""
    self._check()
    grid = video_grid(inputs.shape, self.tubelet, patch_size(self.patches))
    dtype = jnp.dtype(self.dtype)
    tubelet = (self.tubelet, *patch_size(self.patches))
    x = nn.Conv(self.hidden_size, kernel_size=tubelet, strides=tubelet,
                padding='VALID', name='embedding', dtype=dtype)(inputs)
    b, slots, h, w, d = x.shape
    if self.encoder == 'factorised':
      out = self._factorised(x.reshape(b * slots, h * w, d), slots, train,
                             take)
    else:
      out = self._unfactorised(x.reshape(b, slots * h * w, d), slots, train,
                               take)
    if take is not None:
      final, taken = out
      return final, taken, grid
    return self._head(out)

  def _settings(self, transformer):
    return dict(dtype=jnp.dtype(self.dtype), **transformer)

  def _prepend_cls(self, x, name):
    """`x` after its class token `name`, for classifier 'token'."""
    if self.classifier != 'token':
      return x
    cls = self.param(name, nn.initializers.zeros, (1, 1, x.shape[-1]))
    cls = jnp.tile(cls, (x.shape[0], 1, 1)).astype(x.dtype)
    return jnp.concatenate([cls, x], axis=1)

  def _pool(self, x):
    return x[:, 0] if self.classifier == 'token' else jnp.mean(x, axis=1)

  def _unfactorised(self, x, slots, train, take):
    """Model 1: class token and every spatio-temporal token, one encoder."""
    posemb = 'learn'
    if self.temporal_posemb == 'sincos':
      posemb = 'none'
      x = x + sinusoid_table(*x.shape[1:]).astype(x.dtype)
    x = self._prepend_cls(x, 'cls')
    kw = {} if take is None else dict(zip(('take', 'depth', 'norm_taken'),
                                          take))
    if self.temporal_posemb == 'separate':
      out = SeparatePosembEncoder(self._settings(self.transformer),
                                  name='Transformer')(
                                      x, train=train, slots=slots,
                                      prefix=int(self.classifier == 'token'),
                                      **kw)
    else:
      out = Encoder(name='Transformer', posemb=posemb,
                    **self._settings(self.transformer))(x, train=train, **kw)
    return out if take is not None else self._pool(out)

  def _factorised(self, x, slots, train, take):
    """Model 2: a spatial encoder per slot (the slots in the batch), then a
    temporal encoder over the slots' pooled tokens."""
    x = self._prepend_cls(x, 'cls_SpatialTransformer')
    spatial = Encoder(name='SpatialTransformer', posemb='learn',
                      **self._settings(self.transformer))
    taken = None
    if take is None:
      x = spatial(x, train=train)
    else:
      indices, depth, norm = take
      x, taken = spatial(x, train=train, take=indices, depth=depth,
                         norm_taken=norm)
      if depth is not None:  # intermediates only: no temporal encoder
        return x, taken
    x = self._pool(x).reshape(-1, slots, x.shape[-1])
    x = self._prepend_cls(x, 'cls_TemporalTransformer')
    x = Encoder(name='TemporalTransformer', posemb='learn',
                **self._settings(self.temporal_transformer))(x, train=train)
    return (x, taken) if take is not None else self._pool(x)

  def _head(self, x):
    """`fc_norm`, `pre_logits` and the head of the pooled features."""
    if self.fc_norm:
      eps = self.fc_norm_eps or self.transformer.get('layer_norm_eps', 1e-6)
      x = ops.LayerNorm(name='fc_norm', epsilon=eps,
                        dtype=jnp.dtype(self.dtype))(x)
    return layers.pre_logits_and_head(x, self.representation_size,
                                      self.num_classes, jnp.dtype(self.dtype))

