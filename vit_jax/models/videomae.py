"""VideoMAE (Tong et al., NeurIPS 2022): MAE on clips, with tube masking.

A clip's tubelets (`vivit`'s 3-D embedding: T' slots of h x w) are masked
by tubes (`tube_keep`): one random set of spatial positions per clip,
masked in every slot, at a high ratio (the paper's 0.9), so that a masked
patch cannot be copied from the same place in the next frames. The encoder
sees only the visible tubelets, each with its entry of the fixed sin-cos
table (`posemb.sinusoid_table`) over all T'·h·w tokens; MAE's decoder
(`mae.decode`, with the same kind of table at its width) predicts the
t·p·p·C pixels of every tubelet, and the loss (`tubelet_targets`,
`mae.mae_loss`) is the squared error on the masked ones.

The encoder's parameters (`encoder`: `embedding`, `Transformer/...`) are
those of a `vivit.ViViT` with `encoder_config`'s settings (unfactorised,
'sincos' positions, mean pooling): exported alone, a ViViT checkpoint.
"""

from typing import Any, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import mae as models_mae
from vit_jax.models import vivit
from vit_jax.models.encoder import Encoder
from vit_jax.models.posemb import patch_size
from vit_jax.models.posemb import sinusoid_table

NORM_PIX_EPS = 1e-6  # VideoMAE's: added to the std, not the variance


def num_masked(num_patches: int, ratio: float) -> int:
  """Patches masked per slot: int(ratio * num_patches), as VideoMAE's
  `TubeMaskingGenerator`."""
  if not 0. <= ratio < 1.:
    raise ValueError(f'The mask ratio must be in [0, 1), got {ratio}.')
  return int(ratio * num_patches)  # < num_patches: one at least visible


def tube_keep(rng, batch: int, grid: Tuple[int, int, int], ratio: float):
  """Tube masks: per clip, the same random spatial positions masked in
  each of the T' slots of `grid` (T', h, w).

  Returns `keep`, int32 (batch, T' * k) indices of the visible tokens in
  the row-major (T', h, w) order, ascending (k = h*w - `num_masked`), and
  `mask`, float32 (batch, T'*h*w), 1 where a token is masked.
  """
  slots, h, w = grid
  per_slot = h * w
  k = per_slot - num_masked(per_slot, ratio)
  noise = jax.random.uniform(rng, (batch, per_slot))
  spatial = jnp.sort(jnp.argsort(noise, axis=1)[:, :k], axis=1)
  keep = (jnp.arange(slots)[None, :, None] * per_slot +
          spatial[:, None]).reshape(batch, slots * k).astype(jnp.int32)
  mask = jnp.ones((batch, slots * per_slot), jnp.float32)
  mask = mask.at[jnp.arange(batch)[:, None], keep].set(0.)
  return keep, mask


def tubelets(clips, tubelet: int, patch: Tuple[int, int]):
  """(n, T, H, W, C) clips -> (n, T'*h*w, t*ph*pw, C): tubelets in the
  row-major (T', h, w) order of the embedding's tokens, the pixels of each
  in (t, ph, pw) order."""
  n, frames, height, width, c = clips.shape
  ph, pw = patch
  s, h, w = frames // tubelet, height // ph, width // pw
  x = clips.reshape(n, s, tubelet, h, ph, w, pw, c)
  x = x.transpose(0, 1, 3, 5, 2, 4, 6, 7)
  return x.reshape(n, s * h * w, tubelet * ph * pw, c)


def tubelet_targets(clips, tubelet: int, patch: Tuple[int, int],
                    norm_pix: bool):
  """The decoder's targets (n, L, t*ph*pw*C) of `clips` (pixels in [0, 1]).

  `norm_pix`: each channel of each tubelet normalized by its own mean and
  std over the tubelet's t*ph*pw pixels (unbiased, plus NORM_PIX_EPS), as
  VideoMAE's `normlize_target`.
  """
  x = tubelets(clips, tubelet, patch)
  if norm_pix:
    mean = x.mean(-2, keepdims=True)
    std = jnp.sqrt(x.var(-2, keepdims=True, ddof=1)) + NORM_PIX_EPS
    x = (x - mean) / std
  return x.reshape(*x.shape[:2], -1)


def encoder_config(model_config) -> dict:
  """A ViViT config as VideoMAE's encoder: unfactorised, the fixed sin-cos
  table, mean pooling, no head or pre-logits."""
  config = {k: v for k, v in dict(model_config).items()
            if k not in ('temporal_transformer', 'model_name')}
  config.update(encoder='unfactorised', temporal_posemb='sincos',
                classifier='gap', representation_size=None)
  return config


class VisibleEncoder(nn.Module):
  """The encoder of a `vivit.ViViT` of `config` (`encoder_config`) on the
  visible tubelets `keep` only; the same parameters (`embedding`,
  `Transformer`). Returns their tokens (n, k, D) after `encoder_norm`."""
  config: Any

  @nn.compact
  def __call__(self, clips, keep, *, train):
    c = self.config
    vivit.video_grid(clips.shape, c['tubelet'], patch_size(c['patches']))
    dtype = jnp.dtype(c.get('dtype', 'float32'))
    tubelet = (c['tubelet'], *patch_size(c['patches']))
    x = nn.Conv(c['hidden_size'], kernel_size=tubelet, strides=tubelet,
                padding='VALID', name='embedding', dtype=dtype)(clips)
    x = x.reshape(x.shape[0], -1, x.shape[-1])
    x = x + sinusoid_table(*x.shape[1:]).astype(x.dtype)
    x = jnp.take_along_axis(x, keep[..., None], axis=1)
    return Encoder(name='Transformer', posemb='none', dtype=dtype,
                   **c['transformer'])(x, train=train)


class VideoMaskedAutoencoder(nn.Module):
  """VideoMAE: `VisibleEncoder` on the visible tubelets, MAE's decoder.

  Attributes:
    encoder: the ViViT config of the encoder (`encoder_config`).
    decoder: `hidden_size`, `num_layers`, `num_heads`, `mlp_dim` of the
      decoder's blocks (no dropout).
  """
  encoder: Any
  decoder: Any

  @property
  def tubelet(self) -> int:
    return self.encoder['tubelet']

  @property
  def patch(self) -> Tuple[int, int]:
    return patch_size(self.encoder['patches'])

  @nn.compact
  def __call__(self, clips, keep, *, train):
    """Predicted pixels (n, T'*h*w, t*ph*pw*C) of every tubelet, in
    `tubelet_targets`' layout, from the tubelets `keep` (n, k) of `clips`
    (n, T, H, W, C)."""
    latent = VisibleEncoder(self.encoder, name='encoder')(clips, keep,
                                                          train=train)
    slots, h, w = vivit.video_grid(clips.shape, self.tubelet, self.patch)
    pe = sinusoid_table(slots * h * w, self.decoder['hidden_size'])[None]
    pixels = self.tubelet * self.patch[0] * self.patch[1] * clips.shape[-1]
    return models_mae.decode(
        self, latent, keep, pe, pixels, self.decoder,
        self.encoder['transformer'].get('gelu_approximate', True), train)
