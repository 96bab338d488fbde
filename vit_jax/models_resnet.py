"""The ResNet v2 front end of the hybrid R+ViT models, in Flax Linen.

As in the original release (and BiT), convolutions are weight-standardized
and followed by GroupNorm instead of BatchNorm, so nothing depends on the
batch. Module names match the original, so the published hybrid checkpoints
load with no renaming.
"""

import functools
from typing import Tuple

import flax.linen as nn
import jax.numpy as jnp


def standardize(kernel, axis=(0, 1, 2), eps=1e-5):
  """Returns `kernel` with zero mean and unit standard deviation over `axis`.

  Args:
    kernel: a convolution kernel, (height, width, in, out) for a 2-D conv.
    axis: the axes to normalize over: all but the output axis.
    eps: added to the standard deviation, as the original, so that a
      constant kernel maps to zeros rather than NaNs.
  """
  centered = kernel - jnp.mean(kernel, axis=axis, keepdims=True)
  return centered / (jnp.std(centered, axis=axis, keepdims=True) + eps)


class StdConv(nn.Conv):
  """nn.Conv whose kernel is weight-standardized at every use.

  As the original release's: the stored `kernel` is the raw one, so the
  parameter tree, attributes and arguments are those of an nn.Conv.
  """

  def param(self, name, *args, **kwargs):
    param = super().param(name, *args, **kwargs)
    return standardize(param) if name == 'kernel' else param


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

  @nn.compact
  def __call__(self, x):
    # No biases: a GroupNorm follows every convolution.
    conv = functools.partial(StdConv, use_bias=False)
    out = 4 * self.features
    strides = tuple(self.strides)
    residual = x
    if x.shape[-1] != out or strides != (1, 1):
      residual = conv(out, (1, 1), strides, name='conv_proj')(x)
      residual = nn.GroupNorm(name='gn_proj')(residual)

    y = conv(self.features, (1, 1), name='conv1')(x)
    y = nn.relu(nn.GroupNorm(name='gn1')(y))
    y = conv(self.features, (3, 3), strides, name='conv2')(y)
    y = nn.relu(nn.GroupNorm(name='gn2')(y))
    y = conv(out, (1, 1), name='conv3')(y)
    y = nn.GroupNorm(scale_init=nn.initializers.zeros, name='gn3')(y)
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """A stage of `block_size` units, named unit1, unit2, ...

  Attributes:
    block_size: number of units.
    features: bottleneck width of every unit (output: 4 * features channels).
    first_stride: strides of the first unit; the others use (1, 1).
  """
  block_size: int
  features: int
  first_stride: Tuple[int, int]

  @nn.compact
  def __call__(self, x):
    for i in range(self.block_size):
      strides = self.first_stride if i == 0 else (1, 1)
      x = ResidualUnit(self.features, strides=strides, name=f'unit{i + 1}')(x)
    return x
