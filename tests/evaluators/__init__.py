"""Tests of vit_jax/evaluators."""
