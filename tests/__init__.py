"""Tests of vit_jax; each folder holds the tests of one part of the package."""
