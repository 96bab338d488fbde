"""Checkpoints: paths anywhere (`storage`), the original's `.npz` and Orbax
workdirs (`files`), which file a config starts from (`pretrained`), and
any checkpoint fitted to a model (`loading`)."""
