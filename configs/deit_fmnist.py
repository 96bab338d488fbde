r"""ViT on a data-starved Fashion-MNIST: today's recipe, AugReg, DeiT.

10% of the training set (6,000 images), the full test set, the same step
budget for every arm (docs/recipes.md holds the table):

  plain:   the default job's ViT and recipe (crops, flips).
  augreg:  + RandAugment, Mixup, dropout and stochastic depth 0.1.
  teacher: a small BiT ResNet-v2, plain recipe: the teacher of `deit`.
  deit:    augreg + hard distillation from the teacher through a
           distillation token (DeiT's recipe).

  python -m vit_jax.main --config=configs/deit_fmnist.py:teacher --workdir=/tmp/t
  python -m vit_jax.main --config=configs/deit_fmnist.py:deit --workdir=/tmp/d \
      --config.distill.teacher_path=/tmp/t/BiT-fmnist.npz

RandAugment's translations and Cutout are in pixels (big_vision's, made for
224 px): on 28-px images magnitude 2 already shifts by 20 px, so the arms
use magnitude 2 rather than AugReg's 10-20.
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

ARMS = ('plain', 'augreg', 'teacher', 'deit')


def _vit(config, classifier, regularize):
  """The default job's ViT; `regularize`: dropout and stochastic depth."""
  model = default.get_config().model.to_dict()
  model['classifier'] = classifier
  rate = 0.1 if regularize else 0.0
  model['transformer'].update(dropout_rate=rate, stochastic_depth=rate)
  return common.with_model(config, 'ViT-fmnist', model)


def get_config(arm: str = 'plain') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  config = default.get_config().unlock()
  config.pp.train = 'train[:10%]'
  config.total_steps = 1500
  config.warmup_steps = 100
  config.evals.test.every = 0  # at the end
  config.checkpoint_every = 0
  if arm == 'teacher':
    return common.with_model(config, 'BiT-fmnist', dict(
        num_layers=(1, 1, 1), width_factor=0.5, dtype='float32')).lock()
  augmented = arm in ('augreg', 'deit')
  config = _vit(config, 'distilled' if arm == 'deit' else 'token', augmented)
  if augmented:
    config.pp.randaug = (2, 2)
    config.mixup.p = 0.2
  if arm == 'deit':
    config.trainer = 'distill'
    config.distill.kind = 'hard'
  return config.lock()
