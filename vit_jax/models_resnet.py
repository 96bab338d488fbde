"""The original's module name of `vit_jax.models.resnet`."""

import sys

from vit_jax.models import resnet

sys.modules[__name__] = resnet
