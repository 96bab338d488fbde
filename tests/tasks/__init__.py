"""Tests of vit_jax/tasks, one task or method a file, and of losses.py."""
