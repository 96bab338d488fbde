"""Fixtures of the checkpoint tests."""

import pytest

from tests.checkpoints.common import _model
from tests.checkpoints.common import _random_params
from vit_jax.checkpoints import files


@pytest.fixture
def pretrained(tmp_path):
  """A 'testing' checkpoint trained at 32x32 (2x2 patches), with pre_logits."""
  params = _random_params(_model(num_classes=5, representation_size=4))
  path = tmp_path / 'pretrained.npz'
  files.save(params, path)
  return path, params
