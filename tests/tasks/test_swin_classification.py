"""A tiny Swin trains on the 8-device mesh through the shared loop, and
its fine-tuning presets build."""

import jax
import numpy as np
import pytest

from tests.conftest import make_tiny_config
from vit_jax import models
from vit_jax import launch
from vit_jax.configs import common
from vit_jax.configs import swin
from vit_jax.run import checks


def test_tiny_swin_trains_on_the_mesh(fmnist_dirs, tmp_path, capsys):
  config = make_tiny_config(fmnist_dirs)  # 32 px: one multiple of 32
  common.with_model(config, 'Swin-testing')
  # Two of its four stages (a shifted block, a patch merging): each stage
  # is a program part of its own to compile.
  config.model.depths, config.model.num_heads = (2, 2), (1, 2)
  config.model.stochastic_depth = 0.1
  config.optimizer = 'adamw'
  config.evals.test.every = 3
  assert jax.device_count() == 8
  params = jax.device_get(launch.train_and_evaluate(config, str(tmp_path)))
  out = capsys.readouterr().out
  assert 'Done: 6 steps, test accuracy' in out
  table = params['layers_0']['blocks_1']['attn'][
      'relative_position_bias_table']
  assert table.shape == (9, 1)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


@pytest.mark.parametrize('dataset', ['cifar10', 'imagenet2012'])
def test_fine_tuning_presets(dataset):
  config = swin.get_config(f'swin_t,{dataset}')
  assert (config.model_name, config.pp.crop, config.optimizer) == (
      'Swin-T', 224, 'adamw')
  assert config.pp.mean == (0.485, 0.456, 0.406)  # timm's weights
  assert config.model.stochastic_depth == 0.1
  checks.validate(config, 8)
  model = models.model_class(config.model_name)(
      num_classes=10, **config.model)
  assert models.count_params(model) > 27_000_000


def test_unknown_model():
  with pytest.raises(ValueError, match='Unknown model'):
    swin.get_config('swin_l,cifar10')
