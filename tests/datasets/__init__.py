"""Tests of vit_jax/data (tests/data holds the golden files)."""
