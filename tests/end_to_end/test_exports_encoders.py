"""Every output is an input (2 of 3): the exports of self-supervised
encoders (MAE, DINO, BEiT), each opened by its workdir's path alone in
every tool that takes a checkpoint (`exports.py`: the matrix)."""

import pytest

from tests.end_to_end import exports

pytestmark = pytest.mark.xdist_group('exports_encoders')
KINDS = ('mae', 'dino', 'beit')


def test_the_three_files_cover_every_kind():
  from tests.end_to_end import test_exports_images  # pylint: disable=g-import-not-at-top
  from tests.end_to_end import test_exports_others  # pylint: disable=g-import-not-at-top
  assert sorted(KINDS + test_exports_images.KINDS +
                test_exports_others.KINDS) == sorted(exports.KINDS)


@pytest.mark.parametrize('consumer', exports.CONSUMERS)
@pytest.mark.parametrize('kind', KINDS)
def test_cell(made, kind, consumer, tmp_path):  # `made`: conftest.py's
  exports.check(made, kind, consumer, tmp_path)
