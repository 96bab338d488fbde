"""BiT's ResNet-v2 classifiers (Kolesnikov et al., 2020), named as BiT's
R50x1...: ResNet-depth x width factor; DeiT's teachers. They take any
image size."""

import ml_collections

from vit_jax.models import registry
from vit_jax.models import resnet

# name: (units per stage, width_factor)
_BITS = {
    'BiT-testing': ((1, 1), 0.5),
    'BiT-R26x1': ((2, 2, 2, 2), 1),
    'BiT-R50x1': ((3, 4, 6, 3), 1),
    'BiT-R50x3': ((3, 4, 6, 3), 3),
    'BiT-R101x1': ((3, 4, 23, 3), 1),
    'BiT-R152x2': ((3, 8, 36, 3), 2),
}


def _bit(name, num_layers, width_factor):
  """A BiT ResNet-v2 ConfigDict."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'num_layers': num_layers,
      'width_factor': width_factor,
      'dtype': 'float32',
  })


registry.register(registry.Family(
    'BiT', resnet.ResNetV2, [_bit(name, *row) for name, row in _BITS.items()],
    native=None))
