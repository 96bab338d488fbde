"""Dense probes on a frozen backbone: DINOv2's linear head, and DPT's.

DINOv2's linear head (Oquab et al., 2024, Sec. 7.4; its `BNHead`): the
patch maps of the backbone's last block, or of its last four concatenated
("+ms" uses those), each through the final norm, then BatchNorm and a 1x1
convolution to the classes (one channel for depth), at the patch grid.
The logits are upsampled bilinearly to the labels' size (`upsample`) for
the loss and the metrics. `DPTSegmenter` puts `dpt.DPTHead` (DPT's four
blocks reassembled and fused) in the linear head's place, its output at
the images' size.
"""

from typing import Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import dpt


def upsample(logits, size):
  """(batch, h, w, K) logits resized bilinearly to (batch, *size, K), as
  torch's `interpolate(..., align_corners=False)`."""
  return jax.image.resize(logits, (logits.shape[0], *size, logits.shape[-1]),
                          method='bilinear')


class LinearHead(nn.Module):
  """BatchNorm, then a 1x1 convolution (a Dense per location) to
  `num_classes`, on the concatenated maps."""
  num_classes: int
  momentum: float = 0.9

  @nn.compact
  def __call__(self, maps, *, train):
    x = jnp.concatenate([m.astype(jnp.float32) for m in maps], axis=-1)
    x = nn.BatchNorm(use_running_average=not train, momentum=self.momentum,
                     epsilon=1e-5, name='bn')(x)
    return nn.Dense(self.num_classes, name='conv_seg')(x)


class LinearSegmenter(nn.Module):
  """`backbone` (any model with `forward_intermediates`) and a `LinearHead`.

  Attributes:
    backbone: the image model, run in inference mode.
    num_classes: of the pixels.
    indices: its blocks whose maps the head reads (an int n: the last n).
    norm: each map through the backbone's final norm (DINOv2's).
  """
  backbone: nn.Module
  num_classes: int
  indices: Union[int, Sequence[int]] = 1
  norm: bool = True
  momentum: float = 0.9

  def setup(self):
    self.head = LinearHead(self.num_classes, self.momentum)

  def __call__(self, images, *, train=False):
    """Logits at the patch grid, (batch, h, w, num_classes)."""
    return self.classify(self.features(images), train=train)

  def features(self, images):
    """The backbone's maps that the head reads."""
    return self.backbone.forward_intermediates(
        images, self.indices, norm=self.norm, output_fmt='NHWC',
        intermediates_only=True)

  def classify(self, maps, *, train=False):
    return self.head(maps, train=train)


class DPTSegmenter(dpt.DPT):
  """`dpt.DPT` (its parameters' names) as a probe: `features(images)`, then
  `classify(features, train=)`, (N, *size, num_classes) logits or (N,
  *size, 1) depth.

  Attributes:
    size: the output's (height, width); None: the head's own (DPT's: 16
      times the patch grid).
  """
  size: Optional[Tuple[int, int]] = None

  @property
  def num_classes(self):
    return 1 if self.dpt.head == 'depth' else self.dpt.num_classes

  def __call__(self, images, *, train=False):
    return self.classify(self.features(images), train=train)

  def classify(self, features, *, train=False):
    maps, prefix = features
    return self.dpt(maps, prefix, size=self.size, train=train)


# The dense models: `features(images)`, then `classify(features, train=)`;
# `num_classes` output channels (1: depth).
DENSE = (LinearSegmenter, DPTSegmenter)
