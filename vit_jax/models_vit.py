"""The original's module name of `vit_jax.models.vit`."""

import sys

from vit_jax.models import vit

sys.modules[__name__] = vit
