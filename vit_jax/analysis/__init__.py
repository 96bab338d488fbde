"""The paper's Figures 6 and 7, and DINO's class-token attention, for a
model: `python -m vit_jax.analysis`."""
