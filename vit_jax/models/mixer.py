"""MLP-Mixer (Tolstikhin et al., NeurIPS 2021), in Flax Linen.

Module names follow the original release, so its checkpoints load with no
renaming. The token-mixing MLP's width is the number of patches: unlike
ViT's position embedding it cannot be resized for another resolution.

`dtype` is the computation dtype (a dtype or its name, e.g. 'bfloat16'):
parameters stay float32, LayerNorm statistics are float32 (flax's), and the
head computes in float32 (without a head, the output is in `dtype`).
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import intermediates
from vit_jax.models import vit as models_vit


class MlpBlock(nn.Module):
  """Dense to `mlp_dim`, GELU, Dense back to the input width."""
  mlp_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dtype = jnp.dtype(self.dtype)
    y = nn.gelu(nn.Dense(self.mlp_dim, dtype=dtype)(x))
    return nn.Dense(x.shape[-1], dtype=dtype)(y)


class MixerBlock(nn.Module):
  """Token mixing across patches, then channel mixing, both pre-LN residual."""
  tokens_mlp_dim: int
  channels_mlp_dim: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dtype = jnp.dtype(self.dtype)
    # The token MLP acts on each channel's column of patches.
    y = jnp.swapaxes(nn.LayerNorm(dtype=dtype)(x), 1, 2)
    y = MlpBlock(self.tokens_mlp_dim, dtype=dtype, name='token_mixing')(y)
    x = x + jnp.swapaxes(y, 1, 2)
    y = nn.LayerNorm(dtype=dtype)(x)
    return x + MlpBlock(self.channels_mlp_dim, dtype=dtype,
                        name='channel_mixing')(y)


class MlpMixer(nn.Module):
  """MLP-Mixer: patch stem, Mixer blocks, LayerNorm, mean over tokens, head.

  Attributes:
    patches: ConfigDict with `size`, the (height, width) of a patch.
    num_classes: head size; 0 or None for no head.
    hidden_dim: patch embedding width.
    model_name: preset name, for reference only.
  """
  patches: Any
  num_classes: Optional[int]
  num_blocks: int
  hidden_dim: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  model_name: Optional[str] = None
  dtype: Any = jnp.float32

  def __call__(self, inputs, *, train):
    del train  # No dropout: same signature as the ViT.
    return self._forward(inputs)

  def forward_intermediates(self, inputs, indices=None, *, norm=False,
                            output_fmt='NHWC', intermediates_only=False,
                            train=False):
    """The outputs of the blocks `indices` (`intermediates.take_indices`),
    as timm's method: patch maps ('NHWC') or tokens ('NLC'), each through
    `pre_head_layer_norm` with `norm`. `intermediates_only=False` returns
    (final tokens after the norm, intermediates); otherwise no block after
    the last asked for runs."""
    del train
    intermediates.check_output_fmt(output_fmt)
    take = intermediates.take_indices(self.num_blocks, indices)
    depth = max(take) + 1 if intermediates_only else self.num_blocks
    final, taken, grid = self._forward(inputs, (take, depth, norm))
    taken = [intermediates.split_tokens(y, grid, 0, output_fmt, False)
             for y in taken]
    return taken if intermediates_only else (final, taken)

  @nn.compact
  def _forward(self, inputs, take=None):
    """`__call__`, or with `take`, (block indices, blocks to run, norm
    them), (final tokens, those blocks' tokens, the patch grid)."""
    dtype = jnp.dtype(self.dtype)
    patch = models_vit.patch_size(self.patches)
    models_vit.check_image_size(inputs.shape, patch)
    x = nn.Conv(self.hidden_dim, patch, strides=patch, padding='VALID',
                dtype=dtype, name='stem')(inputs)
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    indices, depth, norm_taken = take or ((), self.num_blocks, False)
    norm = nn.LayerNorm(dtype=dtype, name='pre_head_layer_norm')
    taken = []
    for i in range(depth):
      x = MixerBlock(self.tokens_mlp_dim, self.channels_mlp_dim,
                     dtype=dtype, name=f'MixerBlock_{i}')(x)
      if i in indices:
        taken.append(norm(x) if norm_taken else x)
    if take is not None:
      return (norm(x) if depth == self.num_blocks else x), taken, (h, w)
    x = jnp.mean(norm(x), axis=1)
    if self.num_classes:
      # In float32 whatever `dtype`: float32 logits for the loss.
      x = nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                   dtype=jnp.float32, name='head')(x)
    return x
