"""Tests of vit_jax/convert."""
