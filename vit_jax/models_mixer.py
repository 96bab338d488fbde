"""MLP-Mixer (Tolstikhin et al., NeurIPS 2021), in Flax Linen.

Module names follow the original release, so its checkpoints load with no
renaming. The token-mixing MLP's width is the number of patches: unlike
ViT's position embedding it cannot be resized for another resolution.
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

from vit_jax import models_vit


class MlpBlock(nn.Module):
  """Dense, GELU, Dense back to the input width.

  Attributes:
    mlp_dim: hidden width.
  """
  mlp_dim: int

  @nn.compact
  def __call__(self, x):
    y = nn.gelu(nn.Dense(self.mlp_dim)(x))
    return nn.Dense(x.shape[-1])(y)


class MixerBlock(nn.Module):
  """Token mixing (across patches), then channel mixing, both pre-LN residual.

  Attributes:
    tokens_mlp_dim: hidden width of the token-mixing MLP.
    channels_mlp_dim: hidden width of the channel-mixing MLP.
  """
  tokens_mlp_dim: int
  channels_mlp_dim: int

  @nn.compact
  def __call__(self, x):
    # The token MLP acts on each channel's column of patches.
    y = jnp.swapaxes(nn.LayerNorm()(x), 1, 2)
    y = MlpBlock(self.tokens_mlp_dim, name='token_mixing')(y)
    x = x + jnp.swapaxes(y, 1, 2)
    y = nn.LayerNorm()(x)
    return x + MlpBlock(self.channels_mlp_dim, name='channel_mixing')(y)


class MlpMixer(nn.Module):
  """MLP-Mixer: patch stem, Mixer blocks, LayerNorm, mean over tokens, head.

  Attributes:
    patches: ConfigDict with `size`, the (height, width) of a patch.
    num_classes: head size; 0 or None for no head.
    num_blocks: number of Mixer blocks.
    hidden_dim: patch embedding width.
    tokens_mlp_dim: hidden width of the token-mixing MLPs.
    channels_mlp_dim: hidden width of the channel-mixing MLPs.
    model_name: preset name, for reference only.
  """
  patches: Any
  num_classes: Optional[int]
  num_blocks: int
  hidden_dim: int
  tokens_mlp_dim: int
  channels_mlp_dim: int
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train):
    del train  # No dropout: same signature as the ViT.
    patch = models_vit.patch_size(self.patches)
    models_vit.check_image_size(inputs.shape, patch)
    x = nn.Conv(self.hidden_dim, patch, strides=patch, padding='VALID',
                name='stem')(inputs)
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    for _ in range(self.num_blocks):
      x = MixerBlock(self.tokens_mlp_dim, self.channels_mlp_dim)(x)
    x = nn.LayerNorm(name='pre_head_layer_norm')(x)
    x = jnp.mean(x, axis=1)
    if self.num_classes:
      x = nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                   name='head')(x)
    return x
