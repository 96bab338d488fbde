"""VTAB-1k configs (named, never loaded)."""

import pytest
import tensorflow_datasets as tfds

from vit_jax.configs import vtab
from vit_jax.data import labels as task_labels
from vit_jax.run import checks


# task_adaptation's val200 starts at pct% of the train split of n examples;
# where the test split is cut from train too, it starts at test_pct%.
_FROM_TRAIN = {  # task: (n, pct, test_pct)
    'caltech101': (3060, 90, None), 'cifar100': (50_000, 90, None),
    'oxford_iiit_pet': (3680, 80, None), 'svhn': (73_257, 90, None),
    'eurosat': (27_000, 60, 80), 'resisc45': (31_500, 60, 80),
    'clevr_count': (70_000, 90, None), 'clevr_distance': (70_000, 90, None),
    'dsprites_location': (737_280, 80, 90),
    'dsprites_orientation': (737_280, 80, 90),
}


def _parts(split, train_size=10**6):
  """[(split name, start, stop)] as tfds reads `split`; splits other than
  'train' are taken to be large."""
  infos = {name: tfds.core.SplitInfo(
      name=name, shard_lengths=[train_size if name == 'train' else 10**6],
      num_bytes=0) for name in ('train', 'validation', 'test')}
  return [(p.splitname, p.from_ or 0,
           infos[p.splitname].num_examples if p.to is None else p.to)
          for p in tfds.core.ReadInstruction.from_spec(split).to_absolute(
              infos)]


def test_nineteen_tasks():
  assert len(vtab.TASKS) == 19


@pytest.mark.parametrize('task', sorted(vtab.TASKS))
def test_splits_hold_800_and_200_examples(task):
  train_split, test_split = vtab.splits(task)
  n, pct, test_pct = _FROM_TRAIN.get(task, (10**6, None, None))
  first, second = _parts(train_split, n)
  assert first == ('train', 0, 800)
  val_name, start, stop = second
  assert stop - start == 200
  if val_name == 'train':  # val200 lies after the train part
    assert start == pct * n // 100 >= 800
    if test_pct:
      assert _parts(test_split, n) == [('train', test_pct * n // 100, n)]
  assert vtab.splits(task, validation=True) == (
      'train[:800]', train_split.split('+')[1])


@pytest.mark.parametrize('task', sorted(vtab.TASKS))
def test_paper_settings(task):
  config = vtab.get_config(f'b16,{task}')
  assert (config.base_lr, config.total_steps, config.batch, config.pp.crop,
          config.optimizer) == (0.01, 2500, 512, 384, 'sgd')
  assert config.dataset == vtab.TASKS[task][0]
  tfds.core.naming.parse_builder_name_kwargs(config.dataset)
  checks.validate(config, 8)
  task_labels.check(config.pp.label)


def test_validation_variant_and_errors():
  config = vtab.get_config('s16,dtd,val')
  assert (config.pp.train, config.pp.test) == ('train[:800]',
                                               'validation[:200]')
  with pytest.raises(ValueError, match='TASK one of'):
    vtab.get_config('b16,imagenet')
  with pytest.raises(ValueError, match="Unknown pp.label 'nope'"):
    task_labels.check('nope')
