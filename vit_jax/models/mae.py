"""Masked autoencoder (He et al., CVPR 2022): a ViT encoder on the visible
patches, a light decoder that reconstructs the pixels of the masked ones.

Each image keeps a random `1 - mask_ratio` of its patches (`random_keep`);
only those enter the encoder (`VisionTransformer(..., keep=)`), so its cost
falls with the ratio. The decoder embeds the encoded tokens to its own
width, puts a learned mask token at every removed patch, adds fixed 2-D
sine-cosine position embeddings and predicts each patch's pixels. The loss
(`mae_loss`) is the squared error on the masked patches only.

The encoder's parameters (`encoder`) are a ViT's without a head: exported
alone they are a checkpoint in the published layout.
"""

from typing import Any, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import vit as models_vit

NORM_PIX_EPS = 1e-6  # MAE's


def num_kept(num_patches: int, ratio: float) -> int:
  """Patches an image keeps: int(num_patches * (1 - ratio)), as MAE."""
  if not 0. <= ratio < 1.:
    raise ValueError(f'The mask ratio must be in [0, 1), got {ratio}.')
  k = int(num_patches * (1 - ratio))
  if k < 1:
    raise ValueError(f'A mask ratio of {ratio} leaves none of the '
                     f'{num_patches} patches visible.')
  return k


def random_keep(rng, batch: int, num_patches: int, ratio: float):
  """The patches each image keeps, and the mask of those it loses.

  Per image, uniform noise sorted: the patches of the `num_kept` smallest
  values are kept, in that (random) order. Returns `keep`, int32 (batch, k)
  indices into the row-major patches, and `mask`, float32 (batch,
  num_patches), 1 where a patch is removed.
  """
  k = num_kept(num_patches, ratio)
  noise = jax.random.uniform(rng, (batch, num_patches))
  keep = jnp.argsort(noise, axis=1)[:, :k].astype(jnp.int32)
  mask = jnp.ones((batch, num_patches), jnp.float32)
  mask = mask.at[jnp.arange(batch)[:, None], keep].set(0.)
  return keep, mask


def patchify(images, patch: Tuple[int, int]):
  """(n, H, W, C) images -> (n, h*w, ph*pw*C): patches row-major, the
  pixels of each in (ph, pw, C) order."""
  n, height, width, c = images.shape
  ph, pw = patch
  h, w = height // ph, width // pw
  x = images.reshape(n, h, ph, w, pw, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, h * w, ph * pw * c)


def unpatchify(patches, patch: Tuple[int, int], grid: Tuple[int, int]):
  """The inverse of `patchify`: (n, h*w, ph*pw*C) on `grid` (h, w) -> images."""
  n = patches.shape[0]
  (ph, pw), (h, w) = patch, grid
  x = patches.reshape(n, h, w, ph, pw, -1).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(n, h * ph, w * pw, -1)


def patch_stats(target):
  """Per-patch mean and std (unbiased variance + eps, as MAE's torch.var)."""
  mean = target.mean(-1, keepdims=True)
  var = target.var(-1, keepdims=True, ddof=1)
  return mean, jnp.sqrt(var + NORM_PIX_EPS)


def mae_loss(pred, target, mask, norm_pix: bool):
  """Mean over the masked patches of each patch's mean squared error.

  `pred`, `target`: (n, L, P) patches; `mask`: (n, L), 1 where removed.
  `norm_pix`: the target of each patch is its pixels normalized by their
  own mean and std (the paper's best setting).
  """
  if norm_pix:
    mean, std = patch_stats(target)
    target = (target - mean) / std
  per_patch = jnp.mean((pred - target)**2, axis=-1)
  return jnp.sum(per_patch * mask) / jnp.sum(mask)


def encoder_config(model_config) -> dict:
  """The ViT config of an MAE encoder (`vit.pretrained_encoder_config`)."""
  return models_vit.pretrained_encoder_config(model_config, 'MAE')


def decode(module, latent, keep, pe, pixels, decoder, gelu_approximate,
           train):
  """MAE's decoder, called in `module`'s compact method (its scope): the
  encoder's tokens `latent` (n, prefix + k, D) of the patches `keep` (n, k)
  embedded to the decoder's width (`decoder_embed`), each put back in its
  place among `mask_token`s, the fixed table `pe` (1, L, width) added, the
  `decoder_block_{i}`s, `decoder_norm` and `decoder_pred` to `pixels` per
  patch: (n, prefix + L, pixels)."""
  n, num_patches = latent.shape[0], pe.shape[1]
  width = decoder['hidden_size']
  x = nn.Dense(width, name='decoder_embed')(latent)
  prefix = x.shape[1] - keep.shape[1]
  mask_token = module.param('mask_token', nn.initializers.normal(0.02),
                            (1, 1, width))
  # Unshuffle: each encoded patch back to its place, mask tokens elsewhere.
  grid = jnp.tile(mask_token, (n, num_patches, 1)).astype(x.dtype)
  grid = grid.at[jnp.arange(n)[:, None], keep].set(x[:, prefix:])
  x = jnp.concatenate([x[:, :prefix], grid + pe.astype(x.dtype)], axis=1)
  for i in range(decoder['num_layers']):
    x = models_vit.Encoder1DBlock(
        mlp_dim=decoder['mlp_dim'], num_heads=decoder['num_heads'],
        dropout_rate=0., attention_dropout_rate=0.,
        gelu_approximate=gelu_approximate,
        name=f'decoder_block_{i}')(x, not train)
  x = nn.LayerNorm(name='decoder_norm')(x)
  return nn.Dense(pixels, name='decoder_pred')(x)


class MaskedAutoencoder(nn.Module):
  """MAE: a ViT encoder on the kept patches, a Transformer decoder.

  Attributes:
    encoder: the ViT's model config (`encoder_config`).
    decoder: `hidden_size`, `num_layers`, `num_heads` and `mlp_dim` of the
      decoder's blocks (no dropout).
  """
  encoder: Any
  decoder: Any

  @property
  def patch(self) -> Tuple[int, int]:
    return models_vit.patch_size(self.encoder['patches'])

  def image_encoder(self, params):
    """(the encoder, its parameters of `params`): what
    `forward_intermediates` and feature extraction run."""
    return models_vit.VisionTransformer(
        **dict(self.encoder, classifier='token_unpooled', num_classes=None),
        parent=None), params['encoder']

  @nn.compact
  def __call__(self, images, keep, *, train):
    """Predicted pixels (n, h*w, ph*pw*C) of every patch, in `patchify`'s
    layout, from the patches `keep` (n, k) of `images` (n, H, W, C)."""
    # The encoder's tokens of the kept patches: (n, prefix + k, D).
    latent = models_vit.VisionTransformer(
        **dict(self.encoder, classifier='token_unpooled', num_classes=None),
        name='encoder')(images, train=train, keep=keep)
    n, _, _, c = images.shape
    h, w = images.shape[1] // self.patch[0], images.shape[2] // self.patch[1]
    pe = models_vit.posemb_sincos_2d(h, w, self.decoder['hidden_size'])
    x = decode(self, latent, keep, pe, self.patch[0] * self.patch[1] * c,
               self.decoder, self.encoder['transformer'].get(
                   'gelu_approximate', True), train)
    prefix = latent.shape[1] - keep.shape[1]
    return x[:, prefix:]
