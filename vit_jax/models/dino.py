"""DINO's student and teacher network (Caron et al., 2021; DINOv2, Oquab et
al., 2024): a ViT, and a head that maps its class token (and, for iBOT,
its masked patch tokens) to scores over K prototypes.

The encoder is an ordinary `VisionTransformer` under `encoder`, so the
exported teacher is a published-layout ViT; `mask` adds its `mask_token`.
"""

from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import vit as models_vit

HEAD_KEYS = ('num_prototypes', 'hidden_dim', 'bottleneck_dim', 'num_layers')
LAST_LAYER = 'last_layer'


class DinoHead(nn.Module):
  """DINO's projection head: an MLP (GELU) to a bottleneck, L2-normalized,
  then a weight-normalized linear map without bias to `num_prototypes`
  scores (the norm of each prototype fixed to 1: DINO's `norm_last_layer`).

  Attributes:
    num_prototypes: K, the scores' size.
    hidden_dim: width of the MLP's hidden layers.
    bottleneck_dim: width of the normalized bottleneck.
    num_layers: linear layers before the bottleneck's normalization.
  """
  num_prototypes: int
  hidden_dim: int = 2048
  bottleneck_dim: int = 256
  num_layers: int = 3

  @nn.compact
  def __call__(self, x):
    dense = lambda n: nn.Dense(  # DINO's trunc_normal(.02), zero bias
        n, kernel_init=nn.initializers.truncated_normal(0.02))
    for _ in range(self.num_layers - 1):
      x = nn.gelu(dense(self.hidden_dim)(x), approximate=False)
    x = dense(self.bottleneck_dim)(x)
    x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
    return nn.WeightNorm(
        nn.Dense(self.num_prototypes, use_bias=False, name=LAST_LAYER),
        use_scale=False)(x)


class DinoModel(nn.Module):
  """Encoder and head(s): what DINO's student and teacher both are.

  Attributes:
    encoder: `VisionTransformer` attributes (its `classifier` and head are
      replaced: every token comes out, after the final norm).
    head: `DinoHead` attributes.
    ibot_head: the iBOT head's attributes, or None to share `head` (DINOv2's
      default).
  """
  encoder: Any
  head: Any
  ibot_head: Optional[Any] = None

  def setup(self):
    settings = {**self.encoder, 'num_classes': None,
                'classifier': 'token_unpooled'}
    self.vit = models_vit.VisionTransformer(name='encoder', **settings)
    self.dino_head = DinoHead(name='dino_head', **self.head)
    self.patch_head = (DinoHead(name='ibot_head', **self.ibot_head)
                       if self.ibot_head else self.dino_head)

  def image_encoder(self, params):
    """(the encoder, its parameters of `params`): what
    `forward_intermediates` and feature extraction run."""
    return models_vit.VisionTransformer(
        **{**self.encoder, 'num_classes': None,
           'classifier': 'token_unpooled'}, parent=None), params['encoder']

  def __call__(self, images, *, train, mask=None, masked=None):
    """{'cls': class-token features, 'dino': their scores} of NHWC
    `images`; with `masked` (batch, m) patch indices also 'ibot', those
    patches' scores. `mask` (batch, patches) bools: patches the encoder
    sees as its `mask_token`."""
    tokens = self.vit(images, train=train, mask=mask)
    cls = tokens[:, 0]
    out = {'cls': cls, 'dino': self.dino_head(cls)}
    if masked is not None:
      patches = jnp.take_along_axis(tokens[:, 1:], masked[..., None], axis=1)
      out['ibot'] = self.patch_head(patches)
    return out


def random_masks(rng, batch: int, num_patches: int, *, probability: float,
                 ratio):
  """iBOT's masks, as (mask (batch, patches) bools, masked (batch, m) patch
  indices, weight (batch, m)).

  Each image is masked with `probability`, then a `ratio` = (min, max)
  fraction of its patches drawn uniformly, chosen at random (iBOT's 'rand'
  mode). `masked` lists up to m = ceil(max * patches) of them, with
  `weight` 1 / (patches masked) on real entries and 0 on padding, so that
  each masked image weighs the same (DINOv2's `masks_weight`).
  """
  m = max(1, int(-(-ratio[1] * num_patches // 1)))
  rng_on, rng_ratio, rng_order = jax.random.split(rng, 3)
  on = jax.random.bernoulli(rng_on, probability, (batch,))
  r = jax.random.uniform(rng_ratio, (batch,), minval=ratio[0],
                         maxval=ratio[1])
  count = jnp.where(on, jnp.round(r * num_patches), 0).astype(jnp.int32)
  order = jnp.argsort(jax.random.uniform(rng_order, (batch, num_patches)), -1)
  masked = order[:, :m]
  real = jnp.arange(m)[None] < count[:, None]
  mask = jnp.zeros((batch, num_patches), bool).at[
      jnp.arange(batch)[:, None], masked].set(real)
  weight = real / jnp.maximum(count, 1)[:, None]
  return mask, masked, weight.astype(jnp.float32)
