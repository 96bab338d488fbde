"""DPT (Ranftl et al., 2021, "Vision Transformers for Dense Prediction"):
four blocks' tokens reassembled into a feature pyramid, fused from the
coarsest up, then a head for depth or for segmentation.

`DPTHead` is the neck and head of transformers' `DPTForDepthEstimation`,
`DPTForSemanticSegmentation` and `DepthAnythingForDepthEstimation`
(Depth Anything v1/v2: `fusion='next'`, `head_hidden`, `depth_type`), by
their numbers: reassemble (the class token read out, a 1x1 projection to
`out_channels[i]`, a resize by `factors[i]`: a transposed conv for 4 and 2,
none for 1, a 3x3 stride-2 conv for 0.5), a 3x3 conv to `features`, the
fusion blocks (residual conv units, bilinear x2 with align_corners=True),
the head. `DPT` puts it on any backbone with `forward_intermediates`.
Numbered names count from 0 or are transformers' unpadded ones (`conv1`):
`files.load`'s `convert_pre_linen` renumbers any other `name_<i>`.
"""

from typing import Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.models import posemb_resize

READOUTS = ('ignore', 'add', 'project')
HEADS = ('depth', 'segmentation')
FUSIONS = ('x2', 'next')
DEPTH_TYPES = ('relative', 'metric')


def resize_bilinear(x, size: Sequence[int], align_corners: bool):
  """(N, h, w, C) resized to (N, *size, C) as torch's bilinear
  `interpolate` (jax.image.resize has no align_corners)."""
  rows, cols = (posemb_resize.torch_linear_weights(
      old, new, align_corners).astype(np.float32)
                for old, new in zip(x.shape[1:3], size))
  x = jnp.einsum('oh,nhwc->nowc', rows, x, precision='highest')
  return jnp.einsum('pw,nowc->nopc', cols, x, precision='highest')


def _conv(features, kernel, name, stride=1, bias=True):
  """torch's Conv2d(kernel, stride, padding=kernel // 2)."""
  pad = kernel // 2
  return nn.Conv(features, (kernel, kernel), strides=stride,
                 padding=((pad, pad), (pad, pad)), use_bias=bias, name=name)


def _doubled(x) -> Tuple[int, int]:
  return 2 * x.shape[1], 2 * x.shape[2]


class PatchUpsample(nn.Module):
  """torch's ConvTranspose2d(kernel=stride=factor, padding=0): each input
  location becomes a factor x factor patch; `kernel` (factor, factor, in,
  out)."""
  features: int
  factor: int

  @nn.compact
  def __call__(self, x):
    f = self.factor
    kernel = self.param('kernel', nn.initializers.lecun_normal(),
                        (f, f, x.shape[-1], self.features))
    bias = self.param('bias', nn.initializers.zeros, (self.features,))
    y = jnp.einsum('nhwc,abco->nhawbo', x, kernel, precision='highest')
    n, h, _, w, _, o = y.shape
    return y.reshape(n, h * f, w * f, o) + bias


class Reassemble(nn.Module):
  """One map: the class token read out, then a 1x1 projection to
  `channels` and the resize by `factor`."""
  channels: int
  factor: float
  readout: str = 'ignore'

  @nn.compact
  def __call__(self, x, cls=None):
    if self.readout == 'add':
      x = x + cls[:, None, None, :]
    elif self.readout == 'project':  # Linear(2D, D) and exact GELU
      both = jnp.concatenate(
          [x, jnp.broadcast_to(cls[:, None, None, :], x.shape)], axis=-1)
      x = nn.gelu(nn.Dense(x.shape[-1], name='readout')(both),
                  approximate=False)
    x = nn.Conv(self.channels, (1, 1), name='projection')(x)
    if self.factor > 1:
      return PatchUpsample(self.channels, int(self.factor), name='resize')(x)
    if self.factor < 1:
      return _conv(self.channels, 3, 'resize', stride=int(1 / self.factor))(x)
    return x


class ResidualConvUnit(nn.Module):
  """Pre-activation: x + conv(relu(conv(relu(x))))."""

  @nn.compact
  def __call__(self, x):
    y = _conv(x.shape[-1], 3, 'conv1')(nn.relu(x))
    return x + _conv(x.shape[-1], 3, 'conv2')(nn.relu(y))


class FusionBlock(nn.Module):
  """The running map plus a residual unit of this level's map, another
  residual unit, bilinear upsampling (align_corners=True) to `size` (None:
  x2), a 1x1 projection."""

  @nn.compact
  def __call__(self, x, level=None, *, size=None):
    if level is not None:
      if level.shape != x.shape:  # DPT: odd grids (torch's align_corners=False)
        level = resize_bilinear(level, x.shape[1:3], align_corners=False)
      x = x + ResidualConvUnit(name='residual1')(level)
    x = ResidualConvUnit(name='residual2')(x)
    x = resize_bilinear(x, size or _doubled(x), align_corners=True)
    return nn.Conv(x.shape[-1], (1, 1), name='projection')(x)


class DepthHead(nn.Module):
  """3x3 conv to half the width, bilinear to `size`, 3x3 conv to `hidden`,
  ReLU, 1x1 conv to one channel, then ReLU (relative) or a sigmoid
  (metric), times `max_depth`; DPT's `projection` (a 3x3 conv and ReLU)
  first if set."""
  hidden: int = 32
  depth_type: str = 'relative'
  max_depth: float = 1.
  projection: bool = False

  @nn.compact
  def __call__(self, x, size=None):
    if self.projection:
      x = nn.relu(_conv(x.shape[-1], 3, 'projection')(x))
    x = _conv(x.shape[-1] // 2, 3, 'conv1')(x)
    x = resize_bilinear(x, size or _doubled(x), align_corners=True)
    x = nn.relu(_conv(self.hidden, 3, 'conv2')(x))
    x = nn.Conv(1, (1, 1), name='conv3')(x)
    x = nn.relu(x) if self.depth_type == 'relative' else nn.sigmoid(x)
    return x * self.max_depth


class SegmentationHead(nn.Module):
  """DPT's: 3x3 conv (no bias), BatchNorm, ReLU, dropout, 1x1 conv to the
  classes, bilinear to `size` (align_corners=True)."""
  num_classes: int
  dropout: float = 0.1

  @nn.compact
  def __call__(self, x, size=None, train=False):
    x = _conv(x.shape[-1], 3, 'conv', bias=False)(x)
    x = nn.BatchNorm(use_running_average=not train, momentum=0.9,
                     epsilon=1e-5, name='bn')(x)
    x = nn.Dropout(self.dropout, deterministic=not train)(nn.relu(x))
    x = nn.Conv(self.num_classes, (1, 1), name='classifier')(x)
    return resize_bilinear(x, size or _doubled(x), align_corners=True)


class DPTHead(nn.Module):
  """DPT's neck and head on four patch maps.

  Attributes:
    features: the fusion width (transformers' `fusion_hidden_size`).
    out_channels: the four reassembled widths (`neck_hidden_sizes`).
    factors: the four resizes (`reassemble_factors`): 4, 2, 1 or 0.5.
    readout: the class token 'ignore'd, 'add'ed to each patch, or
      'project'ed with it (Linear(2D, D), GELU).
    head: 'depth' (one channel) or 'segmentation' (`num_classes`).
    fusion: each fusion block upsamples 'x2' (DPT) or to the 'next' map's
      size (Depth Anything; the two differ only on odd grids).
    head_hidden, depth_type ('relative': ReLU, 'metric': sigmoid),
      max_depth, head_projection: the depth head's (`DepthHead`).
    dropout: the segmentation head's.
  """
  features: int = 256
  out_channels: Sequence[int] = (256, 512, 1024, 1024)
  factors: Sequence[float] = (4, 2, 1, 0.5)
  readout: str = 'ignore'
  head: str = 'depth'
  num_classes: Optional[int] = None
  fusion: str = 'x2'
  head_hidden: int = 32
  depth_type: str = 'relative'
  max_depth: float = 1.
  head_projection: bool = False
  dropout: float = 0.1

  def _check(self, maps, prefix):
    for name, value, allowed in (('readout', self.readout, READOUTS),
                                 ('head', self.head, HEADS),
                                 ('fusion', self.fusion, FUSIONS),
                                 ('depth_type', self.depth_type, DEPTH_TYPES)):
      if value not in allowed:
        raise ValueError(f'DPTHead: {name}={value!r}; expected one of '
                         f'{allowed}.')
    if len(maps) != len(self.out_channels):
      raise ValueError(f'DPTHead takes {len(self.out_channels)} maps, got '
                       f'{len(maps)}.')
    if self.readout != 'ignore' and prefix is None:
      raise ValueError(f"DPTHead: readout={self.readout!r} needs the class "
                       'tokens (a backbone with one).')
    if self.head == 'segmentation' and not self.num_classes:
      raise ValueError("DPTHead: head='segmentation' needs num_classes.")

  @nn.compact
  def __call__(self, maps, prefix=None, *, size=None, train=False):
    """`maps`: four (N, h, w, D) patch maps; `prefix`: their four (N, D)
    class tokens (None for readout='ignore'). Returns (N, *size, C): C=1
    for depth, `num_classes` logits for segmentation; `size` None: twice
    the last fused map, as DPT's heads (16 times the patch grid)."""
    self._check(maps, prefix)
    levels = []
    for i, (x, channels, factor) in enumerate(
        zip(maps, self.out_channels, self.factors)):
      cls = None if self.readout == 'ignore' else prefix[i]
      x = Reassemble(channels, factor, self.readout,
                     name=f'reassemble_{i}')(x.astype(jnp.float32), cls)
      levels.append(_conv(self.features, 3, f'neck_conv_{i}', bias=False)(x))
    levels = levels[::-1]  # coarsest first
    x = None
    for j, level in enumerate(levels):
      nxt = (levels[j + 1].shape[1:3] if self.fusion == 'next' and
             j + 1 < len(levels) else None)
      block = FusionBlock(name=f'fusion_{j}')
      x = block(level, size=nxt) if x is None else block(x, level, size=nxt)
    if self.head == 'depth':
      return DepthHead(self.head_hidden, self.depth_type, self.max_depth,
                       self.head_projection, name='head')(x, size)
    return SegmentationHead(self.num_classes, self.dropout, name='head')(
        x, size, train)


class DPT(nn.Module):
  """`backbone` (any model with `forward_intermediates`) and a `DPTHead`.

  Attributes:
    backbone: the image model.
    dpt: the `DPTHead`.
    indices: the four blocks whose maps it reads (DPT-Large: 5, 11, 17, 23).
    norm: each map through the backbone's final norm (Depth Anything's, as
      transformers' Dinov2Backbone; DPT's ViT reads them without).
  """
  backbone: nn.Module
  dpt: DPTHead
  indices: Union[int, Sequence[int]] = 4
  norm: bool = False

  def __call__(self, images, *, train=False):
    """Depth (N, H', W') or logits (N, H', W', K) at `output_size` (the
    images' size for a patch of 16 (DPT) or for sides that are multiples
    of the patch (Depth Anything))."""
    maps, prefix = self.features(images)
    return self.head(maps, prefix, self.output_size(images, maps), train)

  def features(self, images):
    """(four (N, h, w, D) maps, their (N, D) class tokens or None)."""
    taken = self.backbone.forward_intermediates(
        images, self.indices, norm=self.norm, output_fmt='NHWC',
        intermediates_only=True, return_prefix_tokens=True)
    maps = [m for m, _ in taken]
    prefix = [p[:, 0] for _, p in taken] if taken[0][1].shape[1] else None
    return maps, prefix

  def head(self, maps, prefix, size, train=False):
    """`DPTHead`'s output, depth squeezed to (N, *size)."""
    out = self.dpt(maps, prefix, size=size, train=train)
    return out[..., 0] if self.dpt.head == 'depth' else out

  def output_size(self, images, maps) -> Optional[Tuple[int, int]]:
    """As transformers' heads: DPT's (fusion 'x2') None, 16 times the
    patch grid; Depth Anything's the grid times the backbone's patch
    (`patches['size']`; the images' size for a backbone without one)."""
    if self.dpt.fusion == 'x2':
      return None
    patches = getattr(self.backbone, 'patches', None)
    if not patches:
      return tuple(images.shape[1:3])
    ph, pw = patches['size']
    return maps[0].shape[1] * ph, maps[0].shape[2] * pw
