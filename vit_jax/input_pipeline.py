"""The original's module name of `vit_jax.data.pipeline`."""

import sys

from vit_jax.data import pipeline

sys.modules[__name__] = pipeline
