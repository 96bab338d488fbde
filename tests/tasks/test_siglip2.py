"""SigLIP 2's recipe end to end: configs/siglip2_scenes.py's three arms run
and write their metrics; NaFlex's batches change length by step
(tests/tasks/test_siglip2_resume.py: devices and resume)."""

import json

import pytest

from tests.tasks import siglip2_common
from vit_jax import launch
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.configs import siglip2_scenes
from vit_jax.data import locca
from vit_jax.data import packing
from vit_jax.models import lit
from vit_jax.tasks import siglip2


# One worker runs the SigLIP 2 files, this one first: it prepares the scenes
# (`siglip2_dirs`, tests/tasks/conftest.py) for all three.
pytestmark = pytest.mark.xdist_group('siglip2')


@pytest.fixture(scope='module')
def dirs(siglip2_dirs):
  return siglip2_dirs


# The 'siglip2' arm runs in test_siglip2_resume.py (its export opened there)
# and test_siglip2_terms.py; its evaluators are the NaFlex arm's.
ARMS = ('siglip', 'siglip2_naflex')


def test_the_arms_write_their_metrics(dirs, tmp_path):
  for arm in ARMS:
    config = siglip2_common.small_config(arm, dirs)
    config.total_steps = 2
    launch.train_and_evaluate(config, str(tmp_path / arm))
    results = json.loads((tmp_path / arm / 'results.json').read_text())
    assert 0 <= results['zeroshot_accuracy'] <= 1 and results['count'] == 37
    if arm == 'siglip':
      assert 'cider_d' not in results
      continue
    for key in ('exact_match', 'token_f1', 'cider_d', 'ref_box_accuracy',
                'ref_box_iou', 'grounded_exact_match'):
      assert 0 <= results[key] <= (1 if key != 'cider_d' else 10), key
    assert results['scenes'] == 10 and results['objects'] > 10
    decoder = files.load(
        str(tmp_path / arm / f'{config.model_name}.decoder.npz'))
    assert set(decoder) == {'text_decoder'}
  for arm in ARMS:  # the towers open by the workdir alone
    pretrained = models.from_pretrained(str(tmp_path / arm))
    assert isinstance(pretrained.model, lit.LitModel)
    assert set(pretrained.params) == {'img', 'txt', 't', 'b'}
    name = siglip2_scenes.get_config(arm).model_name
    assert (tmp_path / arm / f'{name}.vocab.model').exists()


def test_naflex_batches_take_the_steps_budget(dirs, tmp_path):
  """Each step one budget; each image stretched by its drawn aspect, then
  at its `naflex_grid` within the budget, padded."""
  config = siglip2_common.small_config('siglip2_naflex', dirs)
  task = launch.make_task(config, str(tmp_path))
  budgets = config.siglip2.naflex_budgets
  batches = task.batches(batch_size=8, rows=None, start_step=5)
  seen, lengths = set(), set()
  for step, batch in zip(range(5, 11), batches):
    n = locca.naflex_budget(config.seed, step, budgets)
    stretch = locca.naflex_aspects(config.seed, step, 8,
                                   config.siglip2.naflex_aspects)
    assert batch['patches'].shape == (8, n, 7 * 7 * 3)
    for row, factor in enumerate(stretch):
      grid = packing.naflex_grid(56, round(56 * factor), 7, n)
      real = batch['segment_ids'][row] == 1
      assert real.sum() == grid[0] * grid[1] and real[:real.sum()].all()
      assert (batch['heights'][row][real] == grid[0]).all()
      assert (batch['widths'][row][real] == grid[1]).all()
      lengths.add(int(real.sum()))
    seen.add(n)
  assert len(seen) > 1 and len(lengths) > len(seen)  # lengths mix in a batch


@pytest.mark.parametrize('arm,settings,match', [
    ('siglip2', dict(parallel_fraction=1.5), 'parallel_fraction'),
    ('siglip2', dict(ssl_start=1.0), 'ssl_start'),
    ('siglip2', dict(tips_weight=-1.), 'tips_weight'),
    ('siglip2_naflex', dict(silc_weight=1.), 'SILC and TIPS train the fixed'),
    ('siglip2_naflex', dict(naflex_aspects=(2., 0.5)), 'naflex_aspects'),
])
def test_bad_settings_are_refused(arm, settings, match):
  config = siglip2_scenes.get_config(arm).unlock()
  config.siglip2.update(settings)
  with pytest.raises(ValueError, match=match):
    siglip2.check_settings(config)
