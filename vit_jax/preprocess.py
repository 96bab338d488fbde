"""The original's module name of `vit_jax.convert.transform`."""

import sys

from vit_jax.convert import transform

sys.modules[__name__] = transform
