"""Tests of checkpoints: checkpoint.py, checkpoint_files.py, and paths in a
bucket or at a URL (run/storage.py)."""
