"""Tests of vit_jax/analysis."""
