"""`load_pretrained`, the original's fine-tuning load: the checkpoint's
parameters fitted to the model (new head, pre_logits dropped or kept,
position tables resized) for every model family and position-embedding
scheme, and the checkpoints that cannot fit."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage

from tests.checkpoints.common import _apply
from tests.checkpoints.common import _assert_trees_equal
from tests.checkpoints.common import _hybrid
from tests.checkpoints.common import _init
from tests.checkpoints.common import _mixer
from tests.checkpoints.common import _model
from tests.checkpoints.common import _outputs
from tests.checkpoints.common import _random_params
from tests.checkpoints.common import _transformer
from tests.checkpoints.common import _without
from tests.helpers import cubic_taps_inside as _inside
from tests.helpers import param_shapes
from tests.helpers import smooth_1d as _smooth_1d
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import checkpoint  # the original's helpers: load_pretrained, resize_posemb_grid
from vit_jax import models


# Fine-tuning loads.


def test_load_pretrained_drop_head_and_resize(pretrained):
  path, ckpt = pretrained
  model = _model(num_classes=3, head_bias_init=-2.5)
  init = _init(model, (48, 48))
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init,
      model_config=models.MODEL_CONFIGS['testing'], resize_method='linear_zoom')
  np.testing.assert_array_equal(params['head']['kernel'], np.zeros((10, 3)))
  np.testing.assert_array_equal(params['head']['bias'], np.full(3, -2.5))
  # The model has no pre_logits parameters: the result is shaped like init.
  assert 'pre_logits' not in params
  assert jax.tree.structure(params) == jax.tree.structure(init)
  for key in ('embedding', 'cls'):
    _assert_trees_equal(params[key], ckpt[key])
  _assert_trees_equal(params['Transformer']['encoderblock_0'],
                      ckpt['Transformer']['encoderblock_0'])
  pe = params['Transformer']['posembed_input']['pos_embedding']
  old = ckpt['Transformer']['posembed_input']['pos_embedding']
  assert pe.shape == (1, 1 + 9, 10)
  np.testing.assert_array_equal(pe[:, 0], old[:, 0])
  np.testing.assert_array_equal(
      pe[0, 1:].reshape(3, 3, 10),
      scipy.ndimage.zoom(old[0, 1:].reshape(2, 2, 10), (1.5, 1.5, 1), order=1))
  out = _apply(model, params, (48, 48))
  np.testing.assert_allclose(out, np.full((2, 3), -2.5))


def test_load_pretrained_keeps_pre_logits_non_square(pretrained):
  path, ckpt = pretrained
  model = _model(num_classes=3, representation_size=4)
  init = _init(model, (48, 32))
  # A head unlike the checkpoint's and unlike zeros: it must be init's.
  init['head'] = _random_params(model, (48, 32), seed=5)['head']
  params = checkpoint.load_pretrained(
      pretrained_path=str(path), init_params=init, new_grid=(3, 2),
      model_config={'classifier': 'token', 'representation_size': 4})
  _assert_trees_equal(params['head'], init['head'])
  _assert_trees_equal(params['pre_logits'], ckpt['pre_logits'])
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 7, 10)
  out = _apply(model, params, (48, 32))
  assert out.shape == (2, 3) and np.all(np.isfinite(out))
  assert np.abs(out).min() > 0


def test_load_pretrained_without_class_token(tmp_path):
  ckpt = _random_params(_model(classifier='gap'))
  path = tmp_path / 'gap.npz'
  files.save(ckpt, path)
  model = _model(classifier='gap')
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=_init(model, (64, 64)),
      model_config={'classifier': 'gap', 'representation_size': None})
  pe = params['Transformer']['posembed_input']['pos_embedding']
  assert pe.shape == (1, 16, 10)
  np.testing.assert_allclose(pe, checkpoint.resize_posemb_grid(
      ckpt['Transformer']['posembed_input']['pos_embedding'],
      new_grid=(4, 4), has_class_token=False))
  assert _apply(model, params, (64, 64)).shape == (2, 3)


def test_load_pretrained_same_resolution_keeps_posemb(pretrained):
  path, ckpt = pretrained
  model = _model()
  params = checkpoint.load_pretrained(
      pretrained_path=path,
      init_params=_init(model, (32, 32)),
      model_config={'classifier': 'token', 'representation_size': None})
  _assert_trees_equal(params['Transformer'], ckpt['Transformer'])


# Errors.


def test_checkpoint_of_another_width(tmp_path):
  path = tmp_path / 'wide.npz'
  files.save(_random_params(_model(hidden_size=12)), path)
  init = _init(_model(), (32, 32))
  with pytest.raises(files.CheckpointError) as e:
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=init,
        model_config={'classifier': 'token', 'representation_size': None})
  message = str(e.value)
  assert isinstance(e.value, ValueError)
  assert str(path) in message
  assert 'wrong shape' in message
  assert 'Transformer/encoder_norm/bias: (12,) vs (10,)' in message
  assert '21 parameters have the wrong shape (checkpoint vs model)' in message
  assert '... and 11 more' in message
  assert len(message.splitlines()) == 13


def test_checkpoint_with_fewer_layers(pretrained):
  path, _ = pretrained
  model = _model(transformer=dict(num_layers=2, mlp_dim=10, num_heads=2))
  with pytest.raises(
      files.CheckpointError,
      match=r'missing(.|\n)*encoderblock_1/LayerNorm_0/bias: \(10,\)'):
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(model, (32, 32)),
        model_config={'classifier': 'token', 'representation_size': None})


def test_non_square_target_needs_new_grid(pretrained):
  path, _ = pretrained
  with pytest.raises(files.CheckpointError,
                     match=r'6 tokens are not a square grid'):
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(_model(), (48, 32)),
        model_config={'classifier': 'token', 'representation_size': None})


# Hybrids, Mixers, the MAP head and the position-embedding schemes.


@pytest.fixture
def learn2d_pretrained(tmp_path):
  """A learn2d ViT trained at 32x32 in 4x4 patches (8x8 grid), whose row
  and column tables are known smooth functions of the patch centers."""
  model = _model(num_classes=5, posemb='learn2d', patches=dict(size=(4, 4)))
  params = _random_params(model, (32, 32))
  tables = params['Transformer']['posembed_input']
  tables['pos_embedding_row'] = _smooth_1d(8)[None].astype(np.float32)
  tables['pos_embedding_col'] = _smooth_1d(8)[None, :, ::-1].astype(
      np.float32)
  path = tmp_path / 'learn2d.npz'
  files.save(params, path)
  return path, params


@pytest.mark.parametrize('size,grid', [((48, 64), (12, 16)),
                                       ((24, 40), (6, 10))])
def test_load_pretrained_learn2d_resizes_rows_and_columns(
    learn2d_pretrained, size, grid):
  path, ckpt = learn2d_pretrained
  model = _model(posemb='learn2d', patches=dict(size=(4, 4)))
  init = _init(model, size)
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init,
      model_config={'classifier': 'token', 'posemb': 'learn2d'})
  assert jax.tree.structure(params) == jax.tree.structure(init)
  tables = params['Transformer']['posembed_input']
  row, col = tables['pos_embedding_row'], tables['pos_embedding_col']
  assert row.shape == (1, grid[0], 5) and col.shape == (1, grid[1], 5)
  # Against the functions at the new centers (i + .5) / h: exact for the
  # quadratic channels where all four cubic taps lie inside the old table.
  for table, n, flip in ((row, grid[0], False), (col, grid[1], True)):
    want = _smooth_1d(n)[:, ::-1] if flip else _smooth_1d(n)
    quadratic = [3, 4] if flip else [0, 1]
    inside = _inside(8, n)
    np.testing.assert_allclose(table[0][inside][:, quadratic],
                               want[inside][:, quadratic], atol=1e-5)
    np.testing.assert_allclose(table[0][inside], want[inside], atol=5e-3)
    np.testing.assert_allclose(table[0], want, atol=0.1)
  # Everything else is the checkpoint's, the head init's.
  _assert_trees_equal(_without(params, 'Transformer', 'head'),
                      _without(ckpt, 'Transformer', 'head'))
  _assert_trees_equal(_without(params['Transformer'], 'posembed_input'),
                      _without(ckpt['Transformer'], 'posembed_input'))
  _assert_trees_equal(params['head'], init['head'])
  # The same with the grid given, or with the original's linear zoom.
  _assert_trees_equal(checkpoint.load_pretrained(
      pretrained_path=path, init_params=init, new_grid=grid, old_grid=(8, 8),
      model_config={'classifier': 'token', 'posemb': 'learn2d'}), params)
  zoomed = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init, resize_method='linear_zoom',
      model_config={'classifier': 'token', 'posemb': 'learn2d'})
  old = ckpt['Transformer']['posembed_input']
  for name, n in (('pos_embedding_row', grid[0]),
                  ('pos_embedding_col', grid[1])):
    np.testing.assert_array_equal(
        zoomed['Transformer']['posembed_input'][name][0],
        scipy.ndimage.zoom(old[name][0], (n / 8, 1), order=1))
  out, = _outputs(model, size, params)
  assert out.shape == (2, 3) and np.all(np.isfinite(out))


def test_load_pretrained_learn2d_grid_must_match(learn2d_pretrained):
  path, _ = learn2d_pretrained
  model = _model(posemb='learn2d', patches=dict(size=(4, 4)))
  with pytest.raises(
      files.CheckpointError,
      match=(re.escape(f'Cannot resize pos_embedding_row of {path} from '
                       '(1, 8, 5) to (1, 12, 5): new_grid (16, 12) does not '
                       'match the length 12'))):
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(model, (48, 64)),
        new_grid=(16, 12), model_config={'posemb': 'learn2d'})


@pytest.mark.parametrize('posemb', ['relative', 'sincos2d', 'none'])
def test_load_pretrained_posembs_without_resize(tmp_path, posemb):
  make = lambda **kw: _model(hidden_size=12, posemb=posemb, transformer=(
      _transformer(num_layers=2, relative_max_distance=2)), **kw)
  ckpt = _random_params(make(num_classes=5), (32, 32))
  path = tmp_path / f'{posemb}.npz'
  files.save(ckpt, path)
  model = make()
  init = _init(model, (64, 48))  # 2x2 -> 4x3 patches
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init,
      model_config={'classifier': 'token', 'posemb': posemb})
  assert jax.tree.structure(params) == jax.tree.structure(init)
  _assert_trees_equal(_without(params, 'head'), _without(ckpt, 'head'))
  _assert_trees_equal(params['head'], init['head'])
  if posemb == 'relative':
    assert params['Transformer']['encoderblock_1']['posembed_relative'][
        'rel_embedding'].shape == (5, 5, 2, 6)
  out, = _outputs(model, (64, 48), params)
  assert out.shape == (2, 3) and np.all(np.isfinite(out))


def test_relative_tables_of_another_size(tmp_path):
  make = lambda k: _model(posemb='relative', transformer=_transformer(
      num_layers=2, relative_max_distance=k))
  path = tmp_path / 'relative.npz'
  files.save(_random_params(make(2), (32, 32)), path)
  with pytest.raises(files.CheckpointError) as e:
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(make(3), (64, 64)),
        model_config={'posemb': 'relative'})
  message = str(e.value)
  assert str(path) in message and 'relative_max_distance' in message
  assert ('Transformer/encoderblock_0/posembed_relative/rel_embedding is '
          '(5, 5, 2, 5) in the checkpoint and (7, 7, 2, 5) in the model'
          in message)
  assert ('2 relative position tables have the wrong shape (checkpoint vs '
          'model):\n    Transformer/encoderblock_0/posembed_relative/'
          'rel_embedding: (5, 5, 2, 5) vs (7, 7, 2, 5)' in message)


def test_load_pretrained_hybrid_at_new_resolution(tmp_path):
  ckpt = _random_params(_hybrid(num_classes=5), (64, 64))  # 4x4 grid
  path = tmp_path / 'hybrid.npz'
  files.save(ckpt, path)
  model = _hybrid(head_bias_init=-1.)
  # 96x64 image -> 12x8 feature map (8x down) -> 6x4 grid of 2x2 patches.
  init = _init(model, (96, 64))
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init, new_grid=(6, 4),
      model_config=_model_config_of(model))
  assert jax.tree.structure(params) == jax.tree.structure(init)
  pe = params['Transformer']['posembed_input']['pos_embedding']
  old = ckpt['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(pe, checkpoint.resize_posemb_grid(
      old, new_grid=(6, 4), has_class_token=True))
  assert pe.shape == (1, 1 + 24, 12)
  for key in ('conv_root', 'gn_root', 'block1', 'block2', 'embedding', 'cls'):
    _assert_trees_equal(params[key], ckpt[key])
  assert params['block1']['unit1']['gn_proj']['scale'].shape == (128,)
  out, = _outputs(model, (96, 64), params)
  np.testing.assert_allclose(out, np.full((2, 3), -1.))


def _model_config_of(model):
  """The config `load_pretrained` reads, from a model's attributes."""
  return {'classifier': model.classifier, 'posemb': model.posemb,
          'representation_size': model.representation_size}


def _documented_grid(config, image):
  """The `new_grid` that load_pretrained documents for a hybrid."""
  stages = len(config.resnet.num_layers)
  down = 4 * 2**max(stages - 1, 0)
  ph, pw = config.patches.size
  return image[0] // down // ph, image[1] // down // pw


@pytest.mark.parametrize('name', ['R+ViT-Ti_16', 'R26+ViT-S_32',
                                  'R50+ViT-B_16'])
def test_hybrid_grid_as_documented(name):
  image = (384, 320)
  model = models.get_model(name, num_classes=0)
  shapes = param_shapes(model, jnp.zeros((1, *image, 3)), train=False)
  h, w = _documented_grid(models.MODEL_CONFIGS[name], image)
  assert shapes['Transformer']['posembed_input']['pos_embedding'].shape[
      1] == 1 + h * w


def test_load_pretrained_map_head(tmp_path):
  ckpt = _random_params(_model(num_classes=5, classifier='map'))
  path = tmp_path / 'map.npz'
  files.save(ckpt, path)
  model = _model(classifier='map')
  init = _init(model, (48, 48))
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=init,
      model_config={'classifier': 'map', 'representation_size': None})
  assert jax.tree.structure(params) == jax.tree.structure(init)
  _assert_trees_equal(params['MAPHead_0'], ckpt['MAPHead_0'])
  _assert_trees_equal(params['head'], init['head'])
  # No class token: all 2x2 -> 3x3 tokens are grid tokens.
  np.testing.assert_array_equal(
      params['Transformer']['posembed_input']['pos_embedding'],
      checkpoint.resize_posemb_grid(
          ckpt['Transformer']['posembed_input']['pos_embedding'],
          new_grid=(3, 3), has_class_token=False))
  out, = _outputs(model, (48, 48), params)
  assert out.shape == (2, 3) and np.all(np.isfinite(out))


def test_load_pretrained_mixer(tmp_path):
  ckpt = _random_params(_mixer(num_classes=5))
  path = tmp_path / 'mixer.npz'
  files.save(ckpt, path)
  model = _mixer()
  init = _init(model, (32, 32))
  config = models.MODEL_CONFIGS['Mixer-testing']
  params = checkpoint.load_pretrained(pretrained_path=path, init_params=init,
                                      model_config=config)
  assert jax.tree.structure(params) == jax.tree.structure(init)
  assert 'pre_logits' not in params
  _assert_trees_equal(_without(params, 'head'), _without(ckpt, 'head'))
  np.testing.assert_array_equal(params['head']['kernel'], np.zeros((16, 3)))
  np.testing.assert_array_equal(params['head']['bias'], np.zeros(3))
  out, = _outputs(model, (32, 32), params)
  np.testing.assert_array_equal(out, np.zeros((2, 3)))

  # 48x48 makes 9 patches instead of 4: no resize can fix the token MLPs.
  with pytest.raises(files.CheckpointError) as e:
    checkpoint.load_pretrained(pretrained_path=path, init_params=_init(
        model, (48, 48)), model_config=config)
  message = str(e.value)
  assert message.startswith(f'Checkpoint {path} is an MLP-Mixer for 4 '
                            'patches, but the model makes 9')
  assert 'cannot be fine-tuned at another resolution' in message
  assert ('6 token-mixing parameters have the wrong shape (checkpoint vs '
          'model):' in message)
  assert 'MixerBlock_0/token_mixing/Dense_0/kernel: (4, 8) vs (9, 8)' in message


def test_load_pretrained_config_errors(pretrained, learn2d_pretrained):
  path, _ = pretrained
  init = _init(_model(), (32, 32))
  with pytest.raises(ValueError, match="Unknown model_config.posemb 'learn3d'"):
    checkpoint.load_pretrained(pretrained_path=path, init_params=init,
                               model_config={'posemb': 'learn3d'})
  with pytest.raises(ValueError, match="Unknown resize method 'cubic'"):
    checkpoint.load_pretrained(pretrained_path=path, init_params=init,
                               model_config={}, resize_method='cubic')
  with pytest.raises(ValueError, match=r"posemb='learn2d', but the model has "
                     r"the position tables \['pos_embedding'\]"):
    checkpoint.load_pretrained(pretrained_path=path, init_params=init,
                               model_config={'posemb': 'learn2d'})
  # A learn2d checkpoint for a 'learn' model: the usual listing.
  path2d, _ = learn2d_pretrained
  with pytest.raises(files.CheckpointError,
                     match=r'missing:\n    Transformer/posembed_input/'
                     r'pos_embedding: \(1, 5, 10\)'):
    checkpoint.load_pretrained(pretrained_path=path2d, init_params=init,
                               model_config={})


def test_a_two_tower_config_loads_its_image_tower():
  """A SigLIP file with its towers' config (a dense probe's encoder from a
  two-tower export): the image ViT, the file's `img` tree as it is."""
  path = 'tests/data/big_vision_siglip.npz'
  config = models.MODEL_CONFIGS['SigLIP2-testing-towers'].to_dict()
  model, params, size = loading.load_model(config, path)
  assert isinstance(model, models.VisionTransformer) and size == 32
  _assert_trees_equal(params, files.load(path)['img'])
