"""The paper's Figures 6 and 7 for a model: `python -m vit_jax.analysis`."""
