"""Vision Transformer research code in JAX/Flax (see README.md)."""

from vit_jax.run import tf_startup

tf_startup.install()  # TensorFlow's C++ start-up lines off the screen
