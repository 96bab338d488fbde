"""ResNets with weight-standardized convolutions and GroupNorm, in Flax.

`ResidualUnit`, `ResNetStage`: the front end of the hybrid R+ViT models, as
in the original release (each convolution followed by its GroupNorm); module
names match it, so the published hybrid checkpoints load with no renaming.
`ResNetV2`: BiT's classifier (Kolesnikov et al., 2020), pre-activation units
(He et al., 2016) under BiT's names, e.g. a DeiT teacher. Nothing depends on
the batch (no BatchNorm).

`dtype` is the computation dtype (a dtype or its name, e.g. 'bfloat16');
parameters stay float32.
Kernels are standardized, and GroupNorm statistics computed, in float32.
"""

import functools
from typing import Any, Optional, Sequence, Tuple

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
  """`block_size` units of bottleneck width `features`, named by `names`
  (unit1, unit2, ...; BiT's unit01, unit02, ...); the first unit has strides
  `first_stride`, the others 1. `unit`: `ResidualUnit` or `PreActUnit`."""
  block_size: int
  features: int
  first_stride: Tuple[int, int]
  dtype: Any = jnp.float32
  unit: Any = None  # ResidualUnit
  names: str = 'unit{}'

  @nn.compact
  def __call__(self, x):
    unit = self.unit or ResidualUnit
    for i in range(self.block_size):
      strides = self.first_stride if i == 0 else (1, 1)
      x = unit(self.features, strides=strides, dtype=jnp.dtype(self.dtype),
               name=self.names.format(i + 1))(x)
    return x


class PreActUnit(nn.Module):
  """BiT's pre-activation bottleneck: x + convs(ReLU(GN(x))).

  GroupNorm and ReLU come before each of the 1x1, 3x3 (strided) and 1x1
  convs; when the shape changes, the shortcut is a 1x1 projection of the
  normalized input (`conv_proj`, no GroupNorm of its own).

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
    conv = functools.partial(StdConv, use_bias=False, dtype=dtype)
    norm = functools.partial(nn.GroupNorm, epsilon=1e-5, dtype=dtype)
    out = 4 * self.features
    strides = tuple(self.strides)
    y = nn.relu(norm(name='gn1')(x))
    residual = x
    if x.shape[-1] != out or strides != (1, 1):
      residual = conv(out, (1, 1), strides, name='conv_proj')(y)
    y = conv(self.features, (1, 1), name='conv1')(y)
    y = nn.relu(norm(name='gn2')(y))
    # BiT's symmetric padding, not 'SAME''s (which pads an even side at the
    # end only), so that BiT's and timm's weights compute the same.
    y = conv(self.features, (3, 3), strides, padding=((1, 1), (1, 1)),
             name='conv2')(y)
    y = nn.relu(norm(name='gn3')(y))
    return residual + conv(out, (1, 1), name='conv3')(y)


class RootBlock(nn.Module):
  """BiT's root: a 7x7 stride-2 conv, then a 3x3 stride-2 max-pool.

  Both pad symmetrically, the max-pool with zeros (BiT's and timm's 'fixed'
  stem), not flax's -inf: with no ReLU before it, a border of negative
  values then pools to 0.
  """
  width: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = StdConv(self.width, (7, 7), (2, 2), padding=((3, 3), (3, 3)),
                use_bias=False, dtype=jnp.dtype(self.dtype),
                name='conv_root')(x)
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    return nn.max_pool(x, (3, 3), strides=(2, 2), padding='VALID')


class ResNetV2(nn.Module):
  """BiT's ResNet-v2 classifier: `RootBlock`, stages of `PreActUnit`s (`ResNetStage`), head.

  Head: GroupNorm, ReLU, global average pool, a zero-initialized Dense
  layer. Parameter names are BiT's: root_block/conv_root,
  block{i}/unit{j:02d}, norm-pre-head, head.

  Attributes:
    num_classes: head size; 0 or None: the pooled features.
    num_layers: units per stage (ResNet-50: (3, 4, 6, 3)).
    width_factor: BiT's x1, x3...: the root is 64 * width_factor wide and
      stage i's bottleneck that times 2**i.
  """
  num_classes: Optional[int]
  num_layers: Sequence[int]
  width_factor: float = 1
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, images, *, train):
    """`train` is accepted as the other models take it; nothing (no dropout,
    no batch statistics) depends on it."""
    del train
    if images.ndim != 4:
      raise ValueError(f'Expected NHWC images, got shape {images.shape}.')
    dtype = jnp.dtype(self.dtype)
    width = int(64 * self.width_factor)
    x = RootBlock(width, dtype=dtype, name='root_block')(images)
    for i, block_size in enumerate(self.num_layers):
      x = ResNetStage(block_size, width * 2**i,
                      first_stride=(2, 2) if i else (1, 1), dtype=dtype,
                      unit=PreActUnit, names='unit{:02d}',
                      name=f'block{i + 1}')(x)
    x = nn.relu(nn.GroupNorm(epsilon=1e-5, dtype=dtype,
                             name='norm-pre-head')(x))
    x = jnp.mean(x.astype(jnp.float32), axis=(1, 2))
    if self.num_classes:
      x = nn.Dense(self.num_classes, kernel_init=nn.initializers.zeros,
                   dtype=jnp.float32, name='head')(x)
    return x
