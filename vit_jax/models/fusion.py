"""Prismatic's fused image backbone (Karamcheti et al., ICML 2024; the
eyes of OpenVLA): several encoders read the same image, each at its own
resolution and input normalization, and their patch tokens are
concatenated per patch (DINOv2's and SigLIP's, there).

Here the encoders' patch maps are resized onto one common grid first
(`grid`, by `resize`), so that encoders of different patch grids can be
fused; Prismatic's two share theirs. The fused tokens go to a captioner's
projector (`captioning.FusedProjector`, Prismatic's 'fused-gelu-mlp').
"""

from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


def renormalize(images, mean: Optional[Sequence[float]],
                std: Optional[Sequence[float]]):
  """Inputs in [-1, 1] as an encoder expects them: unchanged (mean and std
  None: the original's 0.5), else (pixels in [0, 1] - mean) / std."""
  if mean is None and std is None:
    return images
  mean = jnp.asarray(mean if mean is not None else (0.5,) * 3, images.dtype)
  std = jnp.asarray(std if std is not None else (0.5,) * 3, images.dtype)
  return ((images + 1) / 2 - mean) / std


class FusedEncoder(nn.Module):
  """Encoders on one image, patch tokens concatenated on a common grid.

  Attributes:
    encoders: image models with `forward_intermediates`.
    sizes: each one's input side in pixels (the image is resized to it).
    means, stds: each one's input normalization of pixels in [0, 1] (None:
      [-1, 1], the original's).
    grid: the common grid's side, in patches.
    resize: `jax.image.resize`'s method from each encoder's grid onto it.
  """
  encoders: Sequence[nn.Module]
  sizes: Sequence[int]
  means: Sequence[Any]
  stds: Sequence[Any]
  grid: int
  resize: str = 'bilinear'

  def forward_intermediates(self, images, indices, *, norm=False,
                            output_fmt='NLC', intermediates_only=True,
                            train=False):
    """[fused tokens (batch, grid * grid, sum of widths)] of the blocks
    `indices` (one block: the captioner's), as a backbone's method."""
    if not intermediates_only or output_fmt != 'NLC' or len(indices) != 1:
      raise ValueError('FusedEncoder gives one block\'s tokens (NLC) only.')
    fused = []
    for encoder, size, mean, std in zip(self.encoders, self.sizes, self.means,
                                        self.stds):
      x = jax.image.resize(images, (images.shape[0], size, size,
                                    images.shape[-1]), 'bilinear')
      x = encoder.forward_intermediates(
          renormalize(x, mean, std), indices, norm=norm, output_fmt='NHWC',
          intermediates_only=True, train=train)[0]
      x = jax.image.resize(x, (x.shape[0], self.grid, self.grid, x.shape[-1]),
                           self.resize)
      fused.append(x.reshape(x.shape[0], -1, x.shape[-1]))
    return [jnp.concatenate(fused, axis=-1)]
