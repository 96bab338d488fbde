"""Tests of the devices a program runs on: the mesh (run/sharding.py),
target.py, and plan.py's TPU slices."""
