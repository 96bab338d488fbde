"""Tests of the experiment configs (vit_jax/configs)."""
