"""The ResNet v2 front end of the hybrid R+ViT models, in Flax Linen.

As in the original release (and BiT), convolutions are weight-standardized
and followed by GroupNorm instead of BatchNorm, so nothing depends on the
batch. Module names match the original, so the published hybrid checkpoints
load with no renaming.

`dtype` is the computation dtype (a dtype or its name, e.g. 'bfloat16');
parameters stay float32.
Kernels are standardized, and GroupNorm statistics computed, in float32.
"""

import functools
from typing import Any, Tuple

import flax.linen as nn
import jax.numpy as jnp


def standardize(kernel, axis=(0, 1, 2), eps=1e-5):
  """`kernel` with zero mean and unit standard deviation over `axis` (all
  but a conv kernel's output axis). `eps` is added to the standard deviation,
  as the original, so that a constant kernel maps to zeros, not NaNs."""
  centered = kernel - jnp.mean(kernel, axis=axis, keepdims=True)
  return centered / (jnp.std(centered, axis=axis, keepdims=True) + eps)


class StdConv(nn.Conv):
  """nn.Conv whose kernel is weight-standardized at every use.

  As the original release's: the stored `kernel` is the raw one, so the
  parameter tree, attributes and arguments are those of an nn.Conv. The
  kernel is standardized in (at least) float32, then cast to the parameter
  dtype; nn.Conv then casts it and the input to `dtype` for the conv.
  """

  def param(self, name, *args, **kwargs):
    param = super().param(name, *args, **kwargs)
    if name != 'kernel':
      return param
    wide = jnp.promote_types(param.dtype, jnp.float32)
    return standardize(param.astype(wide)).astype(param.dtype)


class ResidualUnit(nn.Module):
  """Bottleneck unit: 1x1, 3x3 (strided), 1x1 convs, each with GroupNorm.

  The last GroupNorm starts with a zero scale, so every unit starts as (the
  ReLU of) its shortcut. The shortcut is projected when the shape changes.

  Attributes:
    features: bottleneck width; the unit outputs 4 * features channels.
    strides: strides of the 3x3 conv and of the projection.
  """
  features: int
  strides: Tuple[int, int] = (1, 1)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    dtype = jnp.dtype(self.dtype)
    # No biases: a GroupNorm follows every convolution.
    conv = functools.partial(StdConv, use_bias=False, dtype=dtype)
    norm = functools.partial(nn.GroupNorm, dtype=dtype)
    out = 4 * self.features
    strides = tuple(self.strides)
    residual = x
    if x.shape[-1] != out or strides != (1, 1):
      residual = conv(out, (1, 1), strides, name='conv_proj')(x)
      residual = norm(name='gn_proj')(residual)

    y = conv(self.features, (1, 1), name='conv1')(x)
    y = nn.relu(norm(name='gn1')(y))
    y = conv(self.features, (3, 3), strides, name='conv2')(y)
    y = nn.relu(norm(name='gn2')(y))
    y = conv(out, (1, 1), name='conv3')(y)
    y = norm(scale_init=nn.initializers.zeros, name='gn3')(y)
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`block_size` units, named unit1, unit2, ..., of bottleneck width
  `features`; the first unit has strides `first_stride`, the others 1."""
  block_size: int
  features: int
  first_stride: Tuple[int, int]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    for i in range(self.block_size):
      strides = self.first_stride if i == 0 else (1, 1)
      x = ResidualUnit(self.features, strides=strides,
                       dtype=jnp.dtype(self.dtype), name=f'unit{i + 1}')(x)
    return x
