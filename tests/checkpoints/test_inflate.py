"""`checkpoints.inflate`: a ViViT from an image ViT's file. On a video of
equal frames the inflated model computes what the image ViT computes of the
frame (the reason for inflation); the tables are laid out as numpy says;
files that no image ViT of the model's shape made are refused, by name."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import random_params
from vit_jax import models
from vit_jax.checkpoints import files
from vit_jax.checkpoints import inflate
from vit_jax.models import posemb_resize

SIDE = 16  # images and frames: a 4x4 grid of 4x4 patches


def _image_model(**kw):
  """A ViT of ViViT-testing's widths and depth."""
  kw.setdefault('num_classes', 3)
  return models.get_model(
      'testing', hidden_size=32, patches=dict(size=(4, 4)),
      transformer=dict(num_layers=2, mlp_dim=64, num_heads=2,
                       dropout_rate=0., attention_dropout_rate=0.), **kw)


def _image_file(tmp_path, seed=0, **kw):
  model = _image_model(**kw)
  params = random_params(model, jnp.zeros((1, SIDE, SIDE, 3)), train=False,
                         seed=seed, scale=0.3)
  path = tmp_path / 'image.npz'
  files.save(params, path)
  return model, params, path


def _video_model(name='ViViT-testing', **kw):
  kw.setdefault('num_classes', 3)
  model = models.get_model(name, **kw)
  config = dict(models.MODEL_CONFIGS[name].to_dict(), **kw)
  return model, config


def _init(model, frames=4, side=SIDE):
  return model.init(jax.random.key(1), jnp.zeros((1, frames, side, side, 3)),
                    train=False)['params']


def _load(path, model, config, frames=4, side=SIDE, **kw):
  return inflate.load_video_params(path, init_params=_init(model, frames,
                                                           side),
                                   model_config=config, num_frames=frames,
                                   **kw)


def _frames(seed=0, n=2):
  return np.random.default_rng(seed).uniform(
      -1, 1, (n, SIDE, SIDE, 3)).astype(np.float32)


def _captured(model, params, x, name):
  _, state = model.apply({'params': params}, x, train=False,
                         capture_intermediates=lambda m, _: m.name == name,
                         mutable=['intermediates'])
  return np.asarray(state['intermediates'][name]['__call__'][0])


@pytest.mark.parametrize('method', inflate.KERNEL_INITS)
def test_inflated_kernel(method):
  kernel = np.random.default_rng(0).normal(size=(2, 2, 3, 5))
  got = inflate.inflate_kernel(kernel, 3, method)
  if method == 'average':
    want = np.stack([kernel / 3] * 3)
  else:
    want = np.stack([np.zeros_like(kernel), kernel, np.zeros_like(kernel)])
  np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize('method', inflate.KERNEL_INITS)
def test_equal_frames_embed_as_the_image(tmp_path, method):
  """Each tubelet of one frame repeated embeds as the image kernel does
  that frame."""
  image_model, image_params, path = _image_file(tmp_path)
  model, config = _video_model()
  params = _load(path, model, config, kernel_init=method)
  frames = _frames()  # slot 0 repeats frames[0], slot 1 frames[1]
  video = np.repeat(frames[None], 2, axis=0).transpose(1, 0, 2, 3, 4)
  video = video.reshape(1, 4, SIDE, SIDE, 3)
  got = _captured(model, params, video, 'embedding')
  want = _captured(image_model, image_params, frames, 'embedding')
  np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


def test_factorised_spatial_encoder_is_the_image_encoder(tmp_path):
  """On tubelets of equal frames, the spatial encoder's tokens of each
  slot are the image ViT's of its frame."""
  image_model, image_params, path = _image_file(tmp_path)
  model, config = _video_model('ViViT-testing-FE')
  params = _load(path, model, config, kernel_init='central_frame')
  frames = _frames()
  video = np.repeat(frames, 2, axis=0)[None]  # frames a, a, b, b
  got = _captured(model, params, video, 'SpatialTransformer')
  want = _captured(image_model, image_params, frames, 'Transformer')
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('method', inflate.KERNEL_INITS)
def test_gap_vivit_of_a_still_video_is_the_image_vit(tmp_path, method):
  """A 'gap' ViViT with a joint table, on one frame repeated: each token
  sees its T' copies with equal weights, so every token, the mean and the
  logits are the image ViT's."""
  image_model, image_params, path = _image_file(tmp_path, classifier='gap')
  model, config = _video_model(classifier='gap')
  params = _load(path, model, config, frames=6, kernel_init=method,
                 new_head=False)
  frame = _frames(n=1)
  video = np.repeat(frame[:, None], 6, axis=1)
  got = model.apply({'params': params}, video, train=False)
  want = image_model.apply({'params': image_params}, frame, train=False)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_joint_table_repeats_the_image_table(tmp_path):
  """Class entry once, then the image's 16 entries for each of 3 slots."""
  _, image_params, path = _image_file(tmp_path)
  model, config = _video_model()
  params = _load(path, model, config, frames=6)
  got = params['Transformer']['posembed_input']['pos_embedding']
  table = image_params['Transformer']['posembed_input']['pos_embedding']
  assert got.shape == (1, 1 + 3 * 16, 32)
  np.testing.assert_array_equal(got[0, 0], table[0, 0])
  for t in range(3):
    for i in range(16):
      np.testing.assert_array_equal(got[0, 1 + 16 * t + i], table[0, 1 + i])


def test_joint_table_resized_then_repeated(tmp_path):
  """To 8 px frames (a 2x2 grid): the image table resized as images are,
  then repeated."""
  _, image_params, path = _image_file(tmp_path)
  model, config = _video_model()
  params = _load(path, model, config, frames=4, side=8)
  got = params['Transformer']['posembed_input']['pos_embedding']
  resized = posemb_resize.resize_posemb_grid(
      image_params['Transformer']['posembed_input']['pos_embedding'],
      new_grid=(2, 2), has_class_token=True, method='bicubic')
  want = np.concatenate([resized[:, :1], resized[:, 1:], resized[:, 1:]], 1)
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_separate_tables(tmp_path):
  """The image's table as the spatial one; the temporal one the model's
  initial one."""
  _, image_params, path = _image_file(tmp_path)
  model, config = _video_model(temporal_posemb='separate')
  init = _init(model)
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config)
  tables = params['Transformer']['posembed_input']
  np.testing.assert_array_equal(
      tables['pos_embedding'],
      image_params['Transformer']['posembed_input']['pos_embedding'])
  np.testing.assert_array_equal(
      tables['pos_embedding_time'],
      init['Transformer']['posembed_input']['pos_embedding_time'])


def test_class_entries(tmp_path):
  """A 'gap' image for a 'token' model: the model's initial class token
  and class entry; a 'token' image for a 'gap' model: both dropped."""
  _, image_params, path = _image_file(tmp_path, classifier='gap')
  model, config = _video_model()
  init = _init(model)
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config, num_frames=4)
  table = params['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(
      table[0, 0], init['Transformer']['posembed_input']['pos_embedding'][0, 0])
  np.testing.assert_array_equal(
      table[0, 1:17],
      image_params['Transformer']['posembed_input']['pos_embedding'][0])
  np.testing.assert_array_equal(params['cls'], init['cls'])

  _, image_params, path = _image_file(tmp_path)
  model, config = _video_model(classifier='gap')
  params = _load(path, model, config)
  table = params['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(
      table[0, :16],
      image_params['Transformer']['posembed_input']['pos_embedding'][0, 1:])


def test_notes_and_factorised_names(tmp_path, capsys):
  _, image_params, path = _image_file(tmp_path)
  model, config = _video_model('ViViT-testing-FE')
  init = _init(model)
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config)
  np.testing.assert_array_equal(params['cls_SpatialTransformer'],
                                image_params['cls'])
  np.testing.assert_array_equal(
      params['SpatialTransformer']['encoderblock_1']['MlpBlock_0'][
          'Dense_0']['kernel'],
      image_params['Transformer']['encoderblock_1']['MlpBlock_0']['Dense_0'][
          'kernel'])
  np.testing.assert_array_equal(
      params['TemporalTransformer']['encoder_norm']['scale'],
      init['TemporalTransformer']['encoder_norm']['scale'])
  np.testing.assert_array_equal(params['head']['kernel'],
                                init['head']['kernel'])
  err = capsys.readouterr().err
  for line in ('inflated the embedding (4, 4, 3, 32) to 2 frames '
               '(central_frame)', 'Transformer -> SpatialTransformer',
               'cls -> cls_SpatialTransformer', 'new head (32, 3)',
               "TemporalTransformer: the model's initial one"):
    assert f'Checkpoint {path}: {line}' in err


def test_a_vivit_checkpoint_loads_as_it_is(tmp_path):
  model, config = _video_model()
  saved = random_params(model, jnp.zeros((1, 4, SIDE, SIDE, 3)), train=False,
                        scale=0.3)
  path = tmp_path / 'vivit.npz'
  files.save(saved, path)
  init = _init(model)
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config, new_head=False)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(saved)):
    np.testing.assert_array_equal(a, b)
  params = inflate.load_video_params(path, init_params=init,
                                     model_config=config)
  np.testing.assert_array_equal(params['head']['kernel'],
                                init['head']['kernel'])
  fe, fe_config = _video_model('ViViT-testing-FE')
  with pytest.raises(files.CheckpointError,
                     match='ViViT of the unfactorised, the model one of the '
                     'factorised encoder'):
    inflate.load_video_params(path, init_params=_init(fe),
                              model_config=fe_config)


def _params_of(name, side=224, **kw):
  model = models.get_model(name, **kw)
  return random_params(model, jnp.zeros((1, side, side, 3)), train=False)


@pytest.mark.parametrize('found, what', [
    (lambda: _params_of('Mixer-testing', num_classes=3), 'an MLP-Mixer'),
    (lambda: _params_of('Swin-testing', num_classes=3),
     'a Swin Transformer'),
    (lambda: _params_of('BiT-testing', num_classes=3), 'a ResNet'),
    (lambda: _params_of('R+ViT-Ti_16', num_classes=3, hidden_size=8,
                        transformer=dict(num_layers=1, mlp_dim=8,
                                         num_heads=1), side=64),
     'a hybrid ResNet\\+ViT'),
    (lambda: {'Embed_0': {'embedding': np.zeros((10, 32))},
              'Encoder_0': {}}, 'a text tower'),
    (lambda: {'embedding': {'kernel': np.zeros((4, 4, 3, 32))}},
     'no ViT \\(embedding and Transformer'),
])
def test_not_a_vit_is_refused(found, what):
  model, config = _video_model()
  with pytest.raises(files.CheckpointError,
                     match=f'Checkpoint x.npz is {what}.*: a ViViT starts '
                     'from an image ViT'):
    inflate.load_video_params('x.npz', init_params=_init(model),
                              model_config=config, num_frames=4,
                              found=found())


@pytest.mark.parametrize('kw, what', [
    (dict(hidden_size=16), 'width 16, depth 2'),
    (dict(transformer=dict(num_layers=1, mlp_dim=64, num_heads=2)),
     'width 32, depth 1'),
    (dict(patches=dict(size=(8, 8))), 'patch 8x8x3'),
])
def test_other_shapes_are_refused(kw, what):
  image = models.get_model('testing', num_classes=3, **{
      'hidden_size': 32, 'patches': dict(size=(4, 4)),
      'transformer': dict(num_layers=2, mlp_dim=64, num_heads=2), **kw})
  found = random_params(image, jnp.zeros((1, SIDE, SIDE, 3)), train=False)
  model, config = _video_model()
  with pytest.raises(files.CheckpointError,
                     match=f'is a ViT of .*{what}.*; the model\'s Transformer '
                     'is of patch 4x4x3, width 32, depth 2, MLP 64, 2 heads'):
    inflate.load_video_params('x.npz', init_params=_init(model),
                              model_config=config, num_frames=4, found=found)


@pytest.mark.parametrize('kw, match', [
    (dict(classifier='distilled'), 'has parameters that a ViViT has no '
     'place for: dist, head_dist'),
    (dict(posemb='learn2d'), 'has no learned position table'),
])
def test_other_vits_are_refused(kw, match):
  image = _image_model(**kw)
  found = random_params(image, jnp.zeros((1, SIDE, SIDE, 3)), train=False)
  model, config = _video_model()
  with pytest.raises(files.CheckpointError, match=match):
    inflate.load_video_params('x.npz', init_params=_init(model),
                              model_config=config, num_frames=4, found=found)


def test_a_joint_table_needs_the_frames(tmp_path):
  _, _, path = _image_file(tmp_path)
  model, config = _video_model()
  with pytest.raises(ValueError, match='give num_frames'):
    inflate.load_video_params(path, init_params=_init(model),
                              model_config=config)
  with pytest.raises(ValueError, match='3 slots .* check num_frames'):
    inflate.load_video_params(path, init_params=_init(model, 4, 8),
                              model_config=config, num_frames=6)
