"""Fixtures that several files of tests/tasks share; the files that use
one are an xdist group, so that one worker makes it once."""

import pytest

from tests.tasks import siglip2_common


@pytest.fixture(scope='session')
def siglip2_dirs(tmp_path_factory, fmnist_dirs):
  return siglip2_common.prepare(tmp_path_factory, fmnist_dirs)


@pytest.fixture(scope='session')
def siglip2_runs(siglip2_dirs, tmp_path_factory):
  """`siglip2_common.runs`: the 'siglip2' arm on 8 devices, crashed and
  resumed, on 1 device with its steps recorded."""
  return siglip2_common.runs(siglip2_dirs,
                             tmp_path_factory.mktemp('siglip2_runs'))
