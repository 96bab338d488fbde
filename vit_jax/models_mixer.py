"""The original's module name of `vit_jax.models.mixer`."""

import sys

from vit_jax.models import mixer

sys.modules[__name__] = mixer
