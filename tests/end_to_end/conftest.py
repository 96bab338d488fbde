"""The matrix of exports (`exports.py`): each test file's kinds, made once
per file."""

import pytest

from tests.end_to_end import exports


@pytest.fixture(scope='module')
def made(fmnist_dirs, tmp_path_factory):
  return exports.Made(fmnist_dirs, tmp_path_factory)
