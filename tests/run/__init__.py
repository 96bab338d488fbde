"""Tests of vit_jax/run: the loop, the optimizer, the run record and config."""
