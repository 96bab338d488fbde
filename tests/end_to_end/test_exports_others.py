"""Every output is an input (3 of 3): the exports of SigLIP, a captioner,
a segmentation probe and a ViViT, each opened by its workdir's path alone
in every tool that takes a checkpoint (`exports.py`: the matrix)."""

import pytest

from tests.end_to_end import exports

pytestmark = pytest.mark.xdist_group('exports_others')
KINDS = ('siglip', 'captioning', 'segmentation', 'vivit')


@pytest.mark.parametrize('consumer', exports.CONSUMERS)
@pytest.mark.parametrize('kind', KINDS)
def test_cell(made, kind, consumer, tmp_path):  # `made`: conftest.py's
  exports.check(made, kind, consumer, tmp_path)
