"""`load_params`: any checkpoint, fitted to the model, saying what it
changed; `model_config_for` and `image_size`, the model a checkpoint was
trained as."""

import numpy as np
import pytest

from tests.checkpoints.common import _assert_trees_equal
from tests.checkpoints.common import _init
from tests.checkpoints.common import _model
from tests.checkpoints.common import _notes
from tests.checkpoints.common import _random_params
from tests.checkpoints.common import _shapes
from tests.checkpoints.common import _without
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import models


def test_load_params_npz_as_written(tmp_path, capsys):
  ckpt = _random_params(_model(num_classes=5, representation_size=4))
  path = tmp_path / 'a.npz'
  files.save(ckpt, path)
  model = _model(num_classes=5, representation_size=4)
  params = loading.load_params(path, init_params=_shapes(model),
                                  model_config={'classifier': 'token'})
  _assert_trees_equal(params, ckpt)
  assert _notes(capsys) == []  # nothing to change, nothing said


def test_load_params_new_head_resize_and_notes(pretrained, capsys):
  path, ckpt = pretrained  # 2x2 grid, head of 5, pre_logits of 4
  model = _model(num_classes=3, head_bias_init=-1.)
  init = _init(model, (48, 48))
  params = loading.load_params(
      path, init_params=init, model_config={'classifier': 'token'},
      new_head=True)
  _assert_trees_equal(params['head'], init['head'])
  assert 'pre_logits' not in params
  pe = params['Transformer']['posembed_input']['pos_embedding']
  old = ckpt['Transformer']['posembed_input']['pos_embedding']
  assert pe.shape == (1, 10, 10)
  np.testing.assert_array_equal(pe[:, 0], old[:, 0])  # the class entry
  _assert_trees_equal(params['Transformer']['encoderblock_0'],
                      ckpt['Transformer']['encoderblock_0'])
  assert _notes(capsys) == [
      f"Checkpoint {path}: new head (10, 3) (the model's initial one).",
      f'Checkpoint {path}: dropped pre_logits (the model has none).',
      f'Checkpoint {path}: resized pos_embedding from (1, 5, 10) to '
      '(1, 10, 10) (bicubic, grid 2x2 -> 3x3).',
  ]


def test_load_params_keeps_or_drops_the_files_head(pretrained, capsys):
  path, ckpt = pretrained
  kept = loading.load_params(
      path, init_params=_shapes(_model(num_classes=5, representation_size=4)),
      model_config={})
  _assert_trees_equal(kept['head'], ckpt['head'])
  _assert_trees_equal(kept['pre_logits'], ckpt['pre_logits'])
  assert _notes(capsys) == []
  # A headless model (few-shot features) keeps pre_logits, drops the head.
  headless = loading.load_params(
      path, init_params=_shapes(_model(num_classes=None,
                                       representation_size=4)),
      model_config={})
  assert 'head' not in headless
  _assert_trees_equal(headless, _without(ckpt, 'head'))
  assert _notes(capsys) == [
      f'Checkpoint {path}: dropped the head (the model has none).']


def test_load_params_head_of_another_size(pretrained):
  path, _ = pretrained
  with pytest.raises(files.CheckpointError,
                     match=r'head/kernel: \(4, 5\) vs \(4, 3\)'):
    loading.load_params(
        path, model_config={}, init_params=_shapes(
            _model(num_classes=3, representation_size=4)))
  # Fine-tuning takes the head from init_params: shapes are not enough.
  with pytest.raises(ValueError, match='new_head=True'):
    loading.load_params(path, model_config={}, new_head=True,
                           init_params=_shapes(_model(num_classes=3)))


def test_load_params_lit_image_tower(tmp_path, capsys):
  img = _random_params(_model(num_classes=6))  # head: the projection
  txt = {'head': {'kernel': np.full((3, 6), 2., np.float32)}}
  path = tmp_path / 'lit.npz'
  files.save({'img': img, 'txt': txt, 't': np.ones(1, np.float32)}, path)
  tower = loading.load_params(path, init_params=_shapes(_model(
      num_classes=6)), model_config={})
  _assert_trees_equal(tower, img)
  assert _notes(capsys) == [
      f'Checkpoint {path}: took the LiT image tower (img).']
  # A tower without projection.
  tower = loading.load_params(path, init_params=_shapes(_model(
      num_classes=None)), model_config={})
  _assert_trees_equal(tower, _without(img, 'head'))
  assert _notes(capsys)[1] == (
      f'Checkpoint {path}: dropped the head (the model has none).')


def test_model_config_for_and_image_size(pretrained, tmp_path):
  path, _ = pretrained
  preset = models.MODEL_CONFIGS['testing']
  config = loading.model_config_for(files.load(path), preset)
  assert (config['num_classes'], config['representation_size']) == (5, 4)
  assert config['hidden_size'] == 10 and isinstance(config, dict)
  assert loading.image_size(files.load(path), config) == 32
  headless = tmp_path / 'headless.npz'
  files.save(_random_params(_model(num_classes=None), (64, 64)),
                  headless)
  params = files.load(headless)
  config = loading.model_config_for(params, dict(preset,
                                                    representation_size=7))
  assert (config['num_classes'], config['representation_size']) == (
      None, None)
  assert loading.image_size(params, config) == 64
