"""Tests of vit_jax/models."""
