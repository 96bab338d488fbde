"""Vision Transformer research code in JAX/Flax (see README.md)."""

from vit_jax import original
from vit_jax.platform import tf_startup

tf_startup.install()  # TensorFlow's C++ start-up lines off the screen
original.install()  # the original release's module names (`original/`)
