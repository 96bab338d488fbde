"""The original's module name of `vit_jax.models.lit`."""

import sys

from vit_jax.models import lit

sys.modules[__name__] = lit
