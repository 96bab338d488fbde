"""The original's module name of `vit_jax.data.tokenizers`."""

import sys

from vit_jax.data import tokenizers

sys.modules[__name__] = tokenizers
