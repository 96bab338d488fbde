"""The original's module name of `vit_jax.models.presets`."""

import sys

from vit_jax.models import presets

sys.modules[__name__] = presets
