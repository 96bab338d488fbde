"""Checkpoint format, names, position-embedding resizing, and load_params
from .npz files and Orbax workdirs."""

import os
import re

from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
import scipy.ndimage

from tests.helpers import param_shapes
from tests.helpers import random_params
from vit_jax import checkpoint
from vit_jax import models
from vit_jax.models import vit as models_vit

LINEN_BLOCK = ('LayerNorm_0', 'MultiHeadDotProductAttention_0', 'LayerNorm_1',
               'MlpBlock_0')
PRE_LINEN_BLOCK = ('LayerNorm_0', 'MultiHeadDotProductAttention_1',
                   'LayerNorm_2', 'MlpBlock_3')


def _model(**kw):
  kw.setdefault('num_classes', 3)
  return models.get_model('testing', **kw)


def _random_params(model, size=(32, 32), seed=0):
  """Non-zero float32 parameters shaped like `model`'s on `size` images."""
  return random_params(model, jnp.zeros((1, *size, 3)), train=False,
                       seed=seed, scale=0.3)


def _init(model, size):
  """Stands in for `model.init`, whose jitted RNG is slow to compile on CPU.

  Random non-head parameters, and the head `model.init` makes: a zero kernel
  and a `head_bias_init` bias.
  """
  params = _random_params(model, size, seed=1)
  params['head'] = {
      'kernel': np.zeros_like(params['head']['kernel']),
      'bias': np.full_like(params['head']['bias'],
                           getattr(model, 'head_bias_init', 0.))}
  return params


def _apply(model, params, size, seed=0):
  x = np.random.default_rng(seed).uniform(-1, 1, (2, *size, 3))
  return np.asarray(jax.jit(lambda p, x: model.apply(
      {'params': p}, x, train=False))(params, jnp.asarray(x, jnp.float32)))


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert np.asarray(x).dtype == np.asarray(y).dtype
    np.testing.assert_array_equal(x, y)


def _block(value, names='linen'):
  """A small encoder block with constant leaves, named as given."""
  ln0, attn, ln1, mlp = PRE_LINEN_BLOCK if names == 'pre' else LINEN_BLOCK
  full = lambda shape: np.full(shape, value, np.float32)
  return {
      ln0: {'scale': full(4), 'bias': full(4) + 1},
      attn: {n: {'kernel': full((4, 2, 2)), 'bias': full((2, 2))}
             for n in ('query', 'key', 'value')} | {
                 'out': {'kernel': full((2, 2, 4)), 'bias': full(4)}},
      ln1: {'scale': full(4) + 2, 'bias': full(4) + 3},
      mlp: {'Dense_0': {'kernel': full((4, 8)), 'bias': full(8)},
            'Dense_1': {'kernel': full((8, 4)) + 4, 'bias': full(4)}},
  }


def _flat(tree, prefix=''):
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(_flat(v, f'{prefix}{k}/'))
    else:
      out[prefix + k] = v
  return out


# The file format.


def test_round_trip_same_arrays_and_outputs(tmp_path):
  model = _model(representation_size=4)
  params = _random_params(model)
  path = tmp_path / 'ckpt.npz'
  checkpoint.save(params, path)
  loaded = checkpoint.load(path)
  _assert_trees_equal(loaded, params)
  assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(loaded))
  before = _apply(model, params, (32, 32))
  assert np.abs(before).min() > 0
  np.testing.assert_array_equal(_apply(model, loaded, (32, 32)), before)
  # Only the file itself is left: the temporary one was renamed.
  assert os.listdir(tmp_path) == ['ckpt.npz']


def test_saved_file_uses_published_names(tmp_path):
  params = _random_params(_model(
      transformer=dict(num_layers=2, mlp_dim=8, num_heads=2)))
  path = tmp_path / 'ckpt.npz'
  checkpoint.save(params, str(path))
  with np.load(path, allow_pickle=False) as f:
    keys = set(f.files)
    assert f['Transformer/encoderblock_1/LayerNorm_2/scale'].shape == (10,)
  # The same keys, renamed by hand from the Linen tree.
  expected = set()
  for key in _flat(params):
    for linen, pre in zip(LINEN_BLOCK, PRE_LINEN_BLOCK):
      key = key.replace(f'/{linen}/', f'/{pre}/')
    expected.add(key)
  assert keys == expected
  block = 'Transformer/encoderblock_0'
  assert f'{block}/MultiHeadDotProductAttention_1/query/kernel' in keys
  assert f'{block}/MlpBlock_3/Dense_0/kernel' in keys
  assert not any('MultiHeadDotProductAttention_0' in k for k in keys)
  assert not any('LayerNorm_1' in k or 'MlpBlock_0' in k for k in keys)
  assert {'embedding/kernel', 'cls', 'head/bias',
          'Transformer/encoder_norm/scale',
          'Transformer/posembed_input/pos_embedding'} <= keys


@pytest.mark.parametrize('names', ['pre', 'linen'])
def test_load_hand_made_file(tmp_path, names):
  tree = {
      'Transformer': {'encoderblock_0': _block(1., names),
                      'encoder_norm': {'scale': np.ones(4, np.float32)}},
      'cls': np.zeros((1, 1, 4), np.float32),
  }
  path = tmp_path / 'hand.npz'
  np.savez(path, **_flat(tree))
  loaded = checkpoint.load(path)
  _assert_trees_equal(loaded, {
      'Transformer': {'encoderblock_0': _block(1.),
                      'encoder_norm': {'scale': np.ones(4, np.float32)}},
      'cls': np.zeros((1, 1, 4), np.float32),
  })
  block = loaded['Transformer']['encoderblock_0']
  assert set(block) == set(LINEN_BLOCK)
  # LayerNorm_2 of the file is the second LayerNorm (values +2, +3).
  np.testing.assert_array_equal(block['LayerNorm_1']['scale'], np.full(4, 3.))


def test_more_than_ten_blocks(tmp_path):
  tree = {'Transformer': {f'encoderblock_{i}': _block(float(i), 'pre')
                          for i in range(12)}}
  path = tmp_path / 'deep.npz'
  np.savez(path, **_flat(tree))
  loaded = checkpoint.load(path)['Transformer']
  assert set(loaded) == {f'encoderblock_{i}' for i in range(12)}
  for i in range(12):
    _assert_trees_equal(loaded[f'encoderblock_{i}'], _block(float(i)))
  # And back: every block gets the published names.
  checkpoint.save({'Transformer': loaded}, tmp_path / 'again.npz')
  with np.load(tmp_path / 'again.npz') as f:
    assert set(f.files) == set(_flat(tree))
    np.testing.assert_array_equal(
        f['Transformer/encoderblock_10/MlpBlock_3/Dense_1/kernel'],
        np.full((8, 4), 14.))


def test_other_dicts_keep_their_names(tmp_path):
  tree = {'MixerBlock_0': {'LayerNorm_0': {'scale': np.ones(2)},
                           'LayerNorm_1': {'scale': np.zeros(2)}},
          'Dense_0': {'kernel': np.ones((2, 2))}}
  checkpoint.save(tree, tmp_path / 'm.npz')
  with np.load(tmp_path / 'm.npz') as f:
    assert set(f.files) == {'MixerBlock_0/LayerNorm_0/scale',
                            'MixerBlock_0/LayerNorm_1/scale', 'Dense_0/kernel'}
  _assert_trees_equal(checkpoint.load(tmp_path / 'm.npz'), tree)


def test_groupnorm_shapes(tmp_path):
  c = 6
  rng = np.random.default_rng(0)
  vec = lambda: rng.normal(size=c).astype(np.float32)
  conv = rng.normal(size=(1, 1, 3, c)).astype(np.float32)
  tree = {'resnet': {
      'gn_root': {'scale': vec(), 'bias': vec()},
      'conv_root': {'kernel': conv},
      'block1': {'unit1': {'gn1': {'scale': vec(), 'bias': vec()},
                           'gn_proj': {'scale': vec(), 'bias': vec()},
                           'conv1': {'kernel': conv}}}}}
  path = tmp_path / 'hybrid.npz'
  checkpoint.save(tree, path)
  with np.load(path) as f:
    files = {k: f[k] for k in f.files}
  for key in ('resnet/gn_root/scale', 'resnet/block1/unit1/gn1/bias',
              'resnet/block1/unit1/gn_proj/scale'):
    assert files[key].shape == (1, 1, 1, c)
    np.testing.assert_array_equal(files[key].ravel(), _flat(tree)[key])
  assert files['resnet/block1/unit1/conv1/kernel'].shape == (1, 1, 3, c)
  _assert_trees_equal(checkpoint.load(path), tree)


# Position embeddings.


def _quadratic(h, w, channels=3):
  """Known smooth channels on patch centers ((i + .5) / h, (j + .5) / w)."""
  u, v = np.meshgrid((np.arange(h) + .5) / h, (np.arange(w) + .5) / w,
                     indexing='ij')
  return np.stack([1 + 2 * u - 3 * v, u * u - .5 * u * v + 2 * v * v,
                   np.sin(2 * u) * np.cos(v)][:channels], -1)


def _posemb(grid, cls=True):
  g = grid.reshape(1, -1, grid.shape[-1]).astype(np.float32)
  if not cls:
    return g
  return np.concatenate([np.full((1, 1, g.shape[-1]), 7., np.float32), g], 1)


def _inside(old, new):
  """New cells whose four cubic taps (half-pixel centers) lie in the grid."""
  x = (np.arange(new) + .5) * old / new - .5
  return (np.floor(x) >= 1) & (np.floor(x) + 2 <= old - 1)


@pytest.mark.parametrize('old,new', [((14, 14), (24, 16)), ((14, 14), (7, 10)),
                                     ((8, 8), (12, 12)), ((10, 6), (5, 9))])
def test_bicubic_samples_the_function_at_new_centers(old, new):
  out = checkpoint.resize_posemb_grid(
      _posemb(_quadratic(*old)), old_grid=None if old[0] == old[1] else old,
      new_grid=new, has_class_token=True)
  assert out.shape == (1, 1 + new[0] * new[1], 3) and out.dtype == np.float32
  np.testing.assert_array_equal(out[:, 0], np.full((1, 3), 7.))
  got, want = out[0, 1:].reshape(*new, 3), _quadratic(*new)
  # Keys' cubic reproduces quadratics exactly away from the borders.
  mask = _inside(old[0], new[0])[:, None] & _inside(old[1], new[1])[None, :]
  assert mask.sum() >= 4
  np.testing.assert_allclose(got[mask][:, :2], want[mask][:, :2], atol=1e-4)
  np.testing.assert_allclose(got[mask][:, 2], want[mask][:, 2], atol=5e-3)
  np.testing.assert_allclose(got, want, atol=0.1)


def test_same_size_is_identity():
  pe = np.random.default_rng(0).normal(size=(1, 17, 5)).astype(np.float32)
  for method in ('bicubic', 'linear_zoom'):
    np.testing.assert_array_equal(
        checkpoint.interpolate_posembed(pe, 17, True, method=method), pe)
    np.testing.assert_array_equal(checkpoint.resize_posemb_grid(
        pe[:, 1:], old_grid=(4, 4), new_grid=(4, 4), has_class_token=False,
        method=method), pe[:, 1:])


@pytest.mark.parametrize('old,new,cls', [((14, 14), (24, 16), True),
                                         ((6, 6), (4, 4), False),
                                         ((5, 5), (9, 9), True)])
def test_linear_zoom_is_the_original(old, new, cls):
  grid = np.random.default_rng(1).normal(size=(*old, 4)).astype(np.float32)
  pe = _posemb(grid, cls)
  out = checkpoint.resize_posemb_grid(pe, new_grid=new, has_class_token=cls,
                                      method='linear_zoom')
  ref = scipy.ndimage.zoom(grid, (new[0] / old[0], new[1] / old[1], 1), order=1)
  np.testing.assert_array_equal(out[0, int(cls):].reshape(*new, 4), ref)
  if cls:
    np.testing.assert_array_equal(out[:, 0], pe[:, 0])
  if new[0] == new[1]:
    np.testing.assert_array_equal(checkpoint.interpolate_posembed(
        pe, int(cls) + new[0] * new[1], cls, method='linear_zoom'), out)


def test_interpolate_posembed_square():
  """The original's default: scipy's linear zoom of the grid."""
  grid = _quadratic(7, 7)
  out = checkpoint.interpolate_posembed(_posemb(grid), 1 + 144,
                                        has_class_token=True)
  ref = scipy.ndimage.zoom(grid, (12 / 7, 12 / 7, 1), order=1)
  np.testing.assert_allclose(out[0, 1:].reshape(12, 12, 3), ref, rtol=1e-6)
  assert out.shape == (1, 145, 3)


@pytest.mark.parametrize('args,match', [
    (((1, 1 + 48, 3), 1 + 49, True), '48 tokens are not a square'),
    (((1, 1 + 49, 3), 1 + 50, True), '50 tokens are not a square'),
    (((1, 49, 3), 64, False, 'nearest'), "Unknown resize method 'nearest'"),
    (((49, 3), 64, False), r'Expected a \(1, tokens, width\)'),
])
def test_resize_errors(args, match):
  shape, *rest = args
  with pytest.raises(ValueError, match=match):
    checkpoint.interpolate_posembed(np.zeros(shape, np.float32), *rest)


def test_resize_grid_must_match_tokens():
  with pytest.raises(ValueError, match=r'old_grid \(3, 5\) does not match'):
    checkpoint.resize_posemb_grid(np.zeros((1, 14, 2)), old_grid=(3, 5),
                                  new_grid=(2, 2), has_class_token=False)


# Fine-tuning loads.


@pytest.fixture
def pretrained(tmp_path):
  """A 'testing' checkpoint trained at 32x32 (2x2 patches), with pre_logits."""
  params = _random_params(_model(num_classes=5, representation_size=4))
  path = tmp_path / 'pretrained.npz'
  checkpoint.save(params, path)
  return path, params


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
  checkpoint.save(ckpt, path)
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
  checkpoint.save(_random_params(_model(hidden_size=12)), path)
  init = _init(_model(), (32, 32))
  with pytest.raises(checkpoint.CheckpointError) as e:
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
      checkpoint.CheckpointError,
      match=r'missing(.|\n)*encoderblock_1/LayerNorm_0/bias: \(10,\)'):
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(model, (32, 32)),
        model_config={'classifier': 'token', 'representation_size': None})


def test_truncated_and_corrupt_files(pretrained, tmp_path):
  path, _ = pretrained
  data = path.read_bytes()
  truncated = tmp_path / 'truncated.npz'
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(
      checkpoint.CheckpointError,
      match=re.escape(str(truncated)) + '.*truncated or corrupt'):
    checkpoint.load(truncated)
  corrupt = tmp_path / 'corrupt.npz'
  broken = bytearray(data)
  start = data.index(b'\x93NUMPY') + 200  # inside the first array's data
  broken[start:start + 40] = bytes(40)
  corrupt.write_bytes(bytes(broken))
  with pytest.raises(checkpoint.CheckpointError,
                     match=re.escape(str(corrupt))):
    checkpoint.load(corrupt)
  empty = tmp_path / 'empty.npz'
  empty.write_bytes(b'')
  with pytest.raises(checkpoint.CheckpointError, match=re.escape(str(empty))):
    checkpoint.load(empty)


def test_pickled_object_array_is_refused(tmp_path):
  path = tmp_path / 'pickled.npz'
  np.savez(path, cls=np.zeros(3), **{'head/kernel': np.array([{'a': 1}],
                                                              dtype=object)})
  with pytest.raises(
      checkpoint.CheckpointError,
      match=f"'head/kernel' from checkpoint {re.escape(str(path))}: a pickled"):
    checkpoint.load(path)
  plain = tmp_path / 'plain.npy'
  np.save(plain, np.zeros(3))
  with pytest.raises(checkpoint.CheckpointError, match='single array'):
    checkpoint.load(plain)


def test_missing_file(tmp_path):
  path = tmp_path / 'nowhere.npz'
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    checkpoint.load(path)
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    checkpoint.load_pretrained(pretrained_path=path, init_params={},
                               model_config={})


def test_non_square_target_needs_new_grid(pretrained):
  path, _ = pretrained
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'6 tokens are not a square grid'):
    checkpoint.load_pretrained(
        pretrained_path=path, init_params=_init(_model(), (48, 32)),
        model_config={'classifier': 'token', 'representation_size': None})


def test_inspect_params():
  expected = {'a': {'kernel': np.zeros((2, 3))}, 'empty': {},
              'b': np.zeros(4)}
  params = {'a': {'kernel': np.ones((2, 3))}, 'b': np.ones(4),
            'extra': {'kernel': np.ones(1)}}
  with pytest.raises(ValueError,
                     match=r'not in the model:\n    extra/kernel: \(1,\)'):
    checkpoint.inspect_params(params=params, expected=expected)
  out = checkpoint.inspect_params(params=params, expected=expected,
                                  fail_if_extra=False)
  assert set(out) == {'a', 'b', 'empty'} and out['empty'] == {}
  assert 'extra' in params  # The input is left alone.
  with pytest.raises(ValueError, match=r'missing:\n    b: \(4,\)'):
    checkpoint.inspect_params(params={'a': params['a']}, expected=expected)
  out = checkpoint.inspect_params(params={'a': params['a']}, expected=expected,
                                  fail_if_missing=False)
  assert set(out) == {'a', 'empty'}
  with pytest.raises(ValueError, match=r'a/kernel: \(3, 2\) vs \(2, 3\)'):
    checkpoint.inspect_params(params={'a': {'kernel': np.ones((3, 2))},
                                      'b': params['b']},
                              expected=expected, fail_if_missing=False)


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / 'ckpt.npz'
  checkpoint.save({'w': np.ones(3)}, path)

  def broken_savez(f, **kw):
    f.write(b'partial')
    raise OSError('disk full')

  monkeypatch.setattr(checkpoint.np, 'savez', broken_savez)
  with pytest.raises(OSError, match='disk full'):
    checkpoint.save({'w': np.zeros(3)}, path)
  monkeypatch.undo()
  assert os.listdir(tmp_path) == ['ckpt.npz']
  np.testing.assert_array_equal(checkpoint.load(path)['w'], np.ones(3))
  with pytest.raises(ValueError, match='bfloat16'):
    checkpoint.save({'w': jnp.ones(3, jnp.bfloat16)}, path)


# Hybrids, Mixers, the MAP head and the position-embedding schemes.


def _transformer(**kw):
  return dict(dict(num_layers=1, mlp_dim=10, num_heads=2), **kw)


def _hybrid(**kw):
  """A tiny R26-style hybrid: root and 2 stages (8x down), 2x2 patches."""
  kw.setdefault('num_classes', 3)
  return models.get_model(
      'R26+ViT-S_32', hidden_size=12, patches=dict(size=(2, 2)),
      transformer=_transformer(num_layers=2, stochastic_depth=0.1),
      resnet=dict(num_layers=(1, 1), width_factor=0.5), **kw)


def _mixer(**kw):
  kw.setdefault('num_classes', 3)
  return models.get_model('Mixer-testing', **kw)


def _outputs(model, size, *trees):
  """`model`'s outputs for each parameter tree, on the same inputs."""
  x = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (2, *size, 3)),
                  jnp.float32)
  fn = jax.jit(lambda p: model.apply({'params': p}, x, train=False))
  return [np.asarray(fn(p)) for p in trees]


def _published(key):
  """The file's name for a Linen key: only encoder blocks are renamed."""
  parts = key.split('/')
  for i in range(len(parts) - 1):
    if (re.fullmatch(r'encoderblock_\d+', parts[i]) and
        parts[i + 1] in LINEN_BLOCK):
      parts[i + 1] = PRE_LINEN_BLOCK[LINEN_BLOCK.index(parts[i + 1])]
  return '/'.join(parts)


def _is_groupnorm(key):
  return re.search(r'(^|/)gn(\d+|_root|_proj)/(scale|bias)$', key) is not None


def _without(tree, *keys):
  return {k: v for k, v in tree.items() if k not in keys}


VARIANTS = {
    'hybrid': (_hybrid, (64, 64)),
    'mixer': (_mixer, (32, 32)),
    'map': (lambda: _model(classifier='map'), (32, 32)),
    'learn2d': (lambda: _model(posemb='learn2d'), (48, 32)),
    'relative': (lambda: _model(posemb='relative', transformer=_transformer(
        num_layers=2, relative_max_distance=2, stochastic_depth=0.1)),
                 (48, 32)),
}


@pytest.mark.parametrize('variant', VARIANTS)
def test_round_trip_variants(tmp_path, variant):
  make, size = VARIANTS[variant]
  model = make()
  params = _random_params(model, size)
  path = tmp_path / f'{variant}.npz'
  checkpoint.save(params, path)
  with np.load(path, allow_pickle=False) as f:
    on_disk = {k: f[k] for k in f.files}
  flat = _flat(params)
  assert set(on_disk) == {_published(k) for k in flat}
  for key, value in flat.items():
    stored = on_disk[_published(key)]
    # GroupNorm scale/bias: (1, 1, 1, C) on disk, (C,) in memory.
    want = (1, 1, 1, *value.shape) if _is_groupnorm(key) else value.shape
    assert stored.shape == want, key
    np.testing.assert_array_equal(stored.ravel(), value.ravel())

  loaded = checkpoint.load(path)
  _assert_trees_equal(loaded, params)
  before, after = _outputs(model, size, params, loaded)
  assert np.all(np.isfinite(before)) and np.abs(before).min() > 0
  np.testing.assert_array_equal(after, before)

  keys = set(on_disk)
  block = 'Transformer/encoderblock_1'
  if variant == 'hybrid':
    assert sum(map(_is_groupnorm, keys)) == 2 * (1 + 4 + 4)
    assert on_disk['gn_root/scale'].shape == (1, 1, 1, 32)
    assert on_disk['block2/unit1/gn_proj/bias'].shape == (1, 1, 1, 256)
    assert loaded['block2']['unit1']['gn3']['scale'].shape == (256,)
    assert loaded['block2']['unit1']['conv_proj']['kernel'].shape == (
        1, 1, 128, 256)
    assert f'{block}/MultiHeadDotProductAttention_1/query/kernel' in keys
  elif variant == 'mixer':
    assert {'MixerBlock_1/LayerNorm_1/scale',
            'MixerBlock_1/token_mixing/Dense_1/kernel',
            'MixerBlock_0/channel_mixing/Dense_0/bias',
            'pre_head_layer_norm/scale', 'stem/kernel'} <= keys
    assert not any('encoderblock' in k or 'LayerNorm_2' in k for k in keys)
  elif variant == 'map':
    head = 'MAPHead_0'
    assert {f'{head}/probe', f'{head}/LayerNorm_0/scale',
            f'{head}/MultiHeadDotProductAttention_0/query/kernel',
            f'{head}/MultiHeadDotProductAttention_0/out/bias',
            f'{head}/MlpBlock_0/Dense_1/kernel'} <= keys
    assert not any(re.search(r'MAPHead_0/.*(LayerNorm|MlpBlock|'
                             r'MultiHeadDotProductAttention)_[1-9]', k)
                   for k in keys)
    assert 'Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel' in keys
  elif variant == 'learn2d':
    assert on_disk['Transformer/posembed_input/pos_embedding_row'].shape == (
        1, 3, 5)
    assert on_disk['Transformer/posembed_input/pos_embedding_col'].shape == (
        1, 2, 5)
  else:
    # posembed_relative keeps its name; the rest of the block is published.
    assert on_disk[f'{block}/posembed_relative/rel_embedding'].shape == (
        5, 5, 2, 5)
    assert f'{block}/MultiHeadDotProductAttention_1/query/kernel' in keys
    assert f'{block}/LayerNorm_2/scale' in keys
    assert not any('MultiHeadDotProductAttention_0' in k for k in keys)


def _smooth_1d(n, channels=5):
  """Known smooth channels at entry centers (i + .5) / n; two quadratic."""
  u = (np.arange(n) + .5) / n
  return np.stack([1 + 2 * u - 3 * u * u, u * u - .5 * u, np.sin(2 * u),
                   np.cos(3 * u), np.exp(-u)][:channels], -1)


def test_resize_posemb_1d_samples_the_function_at_new_centers():
  for old, new in ((8, 12), (8, 6), (14, 24), (10, 5)):
    out = checkpoint.resize_posemb_grid(
        _smooth_1d(old)[None].astype(np.float32), new_grid=(new,),
        has_class_token=False)
    assert out.shape == (1, new, 5) and out.dtype == np.float32
    got, want, inside = out[0], _smooth_1d(new), _inside(old, new)
    assert inside.sum() >= 2
    np.testing.assert_allclose(got[inside][:, :2], want[inside][:, :2],
                               atol=1e-5)
    np.testing.assert_allclose(got[inside], want[inside], atol=5e-3)
    np.testing.assert_allclose(got, want, atol=0.1)
    # The 1-D resize is the 2-D one on a grid of one column.
    np.testing.assert_allclose(out, checkpoint.resize_posemb_grid(
        _smooth_1d(old)[None].astype(np.float32), old_grid=(old, 1),
        new_grid=(new, 1), has_class_token=False), atol=1e-6)


def test_resize_posemb_1d_linear_zoom_and_errors():
  resize_1d = lambda table, n, **kw: checkpoint.resize_posemb_grid(
      table, new_grid=(n,), has_class_token=False, **kw)
  table = np.random.default_rng(0).normal(size=(1, 6, 4)).astype(np.float32)
  np.testing.assert_array_equal(
      resize_1d(table, 9, method='linear_zoom')[0],
      scipy.ndimage.zoom(table[0], (9 / 6, 1), order=1))
  for method in ('bicubic', 'linear_zoom'):
    np.testing.assert_array_equal(
        resize_1d(table, 6, method=method), table)
  with pytest.raises(ValueError, match="Unknown resize method 'cubic'"):
    resize_1d(table, 9, method='cubic')
  with pytest.raises(ValueError, match=r'Expected a \(1, tokens, width\)'):
    resize_1d(table[0], 9)
  with pytest.raises(ValueError, match='new_grid must be positive'):
    resize_1d(table, 0)


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
  checkpoint.save(params, path)
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
      checkpoint.CheckpointError,
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
  checkpoint.save(ckpt, path)
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
  checkpoint.save(_random_params(make(2), (32, 32)), path)
  with pytest.raises(checkpoint.CheckpointError) as e:
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
  checkpoint.save(ckpt, path)
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
  checkpoint.save(ckpt, path)
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
  checkpoint.save(ckpt, path)
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
  with pytest.raises(checkpoint.CheckpointError) as e:
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
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'missing:\n    Transformer/posembed_input/'
                     r'pos_embedding: \(1, 5, 10\)'):
    checkpoint.load_pretrained(pretrained_path=path2d, init_params=init,
                               model_config={})


# load_params: any checkpoint, fitted to the model, saying what it changed.


def _shapes(model, size=(32, 32)):
  return param_shapes(model, jnp.zeros((1, *size, 3)), train=False)


def _notes(capsys):
  return capsys.readouterr().err.splitlines()


def test_load_params_npz_as_written(tmp_path, capsys):
  ckpt = _random_params(_model(num_classes=5, representation_size=4))
  path = tmp_path / 'a.npz'
  checkpoint.save(ckpt, path)
  model = _model(num_classes=5, representation_size=4)
  params = checkpoint.load_params(path, init_params=_shapes(model),
                                  model_config={'classifier': 'token'})
  _assert_trees_equal(params, ckpt)
  assert _notes(capsys) == []  # nothing to change, nothing said


def test_load_params_new_head_resize_and_notes(pretrained, capsys):
  path, ckpt = pretrained  # 2x2 grid, head of 5, pre_logits of 4
  model = _model(num_classes=3, head_bias_init=-1.)
  init = _init(model, (48, 48))
  params = checkpoint.load_params(
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
  kept = checkpoint.load_params(
      path, init_params=_shapes(_model(num_classes=5, representation_size=4)),
      model_config={})
  _assert_trees_equal(kept['head'], ckpt['head'])
  _assert_trees_equal(kept['pre_logits'], ckpt['pre_logits'])
  assert _notes(capsys) == []
  # A headless model (few-shot features) keeps pre_logits, drops the head.
  headless = checkpoint.load_params(
      path, init_params=_shapes(_model(num_classes=None,
                                       representation_size=4)),
      model_config={})
  assert 'head' not in headless
  _assert_trees_equal(headless, _without(ckpt, 'head'))
  assert _notes(capsys) == [
      f'Checkpoint {path}: dropped the head (the model has none).']


def test_load_params_head_of_another_size(pretrained):
  path, _ = pretrained
  with pytest.raises(checkpoint.CheckpointError,
                     match=r'head/kernel: \(4, 5\) vs \(4, 3\)'):
    checkpoint.load_params(
        path, model_config={}, init_params=_shapes(
            _model(num_classes=3, representation_size=4)))
  # Fine-tuning takes the head from init_params: shapes are not enough.
  with pytest.raises(ValueError, match='new_head=True'):
    checkpoint.load_params(path, model_config={}, new_head=True,
                           init_params=_shapes(_model(num_classes=3)))


def test_load_params_lit_image_tower(tmp_path, capsys):
  img = _random_params(_model(num_classes=6))  # head: the projection
  txt = {'head': {'kernel': np.full((3, 6), 2., np.float32)}}
  path = tmp_path / 'lit.npz'
  checkpoint.save({'img': img, 'txt': txt, 't': np.ones(1, np.float32)}, path)
  tower = checkpoint.load_params(path, init_params=_shapes(_model(
      num_classes=6)), model_config={})
  _assert_trees_equal(tower, img)
  assert _notes(capsys) == [
      f'Checkpoint {path}: took the LiT image tower (img).']
  # A tower without projection.
  tower = checkpoint.load_params(path, init_params=_shapes(_model(
      num_classes=None)), model_config={})
  _assert_trees_equal(tower, _without(img, 'head'))
  assert _notes(capsys)[1] == (
      f'Checkpoint {path}: dropped the head (the model has none).')


def _write_workdir(workdir, model, trees):
  """An Orbax workdir as training writes it: a TrainState per step."""
  manager = ocp.CheckpointManager(
      workdir / 'checkpoints', item_handlers=ocp.StandardCheckpointHandler())
  for step, params in trees.items():
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.adam(1e-3))
    manager.save(step, args=ocp.args.StandardSave(state.replace(step=step)))
  manager.wait_until_finished()
  manager.close()


def test_load_params_orbax_workdir(tmp_path, capsys):
  model = _model(num_classes=5)
  trees = {1: _random_params(model, seed=1), 2: _random_params(model, seed=2)}
  _write_workdir(tmp_path, model, trees)
  load = lambda path, **kw: checkpoint.load_params(
      path, init_params=_shapes(model), model_config={}, **kw)
  _assert_trees_equal(load(tmp_path), trees[2])  # the latest step
  _assert_trees_equal(load(tmp_path / 'checkpoints'), trees[2])
  _assert_trees_equal(load(tmp_path / 'checkpoints' / '1'), trees[1])
  # Fitted as a file is: here to a headless model.
  headless = checkpoint.load_params(tmp_path, model_config={},
                                    init_params=_shapes(_model(num_classes=0)))
  _assert_trees_equal(headless, _without(trees[2], 'head'))
  assert _notes(capsys)[-1].endswith('dropped the head (the model has none).')


def test_load_params_nothing_to_load(tmp_path):
  init = _shapes(_model())
  (tmp_path / 'empty').mkdir()
  with pytest.raises(checkpoint.CheckpointError,
                     match='empty holds no checkpoint: expected an .npz'):
    checkpoint.load_params(tmp_path / 'empty', init_params=init,
                           model_config={})
  with pytest.raises(FileNotFoundError, match='missing'):
    checkpoint.load_params(tmp_path / 'missing', init_params=init,
                           model_config={})


def test_model_config_for_and_image_size(pretrained, tmp_path):
  path, _ = pretrained
  preset = models.MODEL_CONFIGS['testing']
  config = checkpoint.model_config_for(checkpoint.load(path), preset)
  assert (config['num_classes'], config['representation_size']) == (5, 4)
  assert config['hidden_size'] == 10 and isinstance(config, dict)
  assert checkpoint.image_size(checkpoint.load(path), config) == 32
  headless = tmp_path / 'headless.npz'
  checkpoint.save(_random_params(_model(num_classes=None), (64, 64)),
                  headless)
  params = checkpoint.load(headless)
  config = checkpoint.model_config_for(params, dict(preset,
                                                    representation_size=7))
  assert (config['num_classes'], config['representation_size']) == (
      None, None)
  assert checkpoint.image_size(params, config) == 64


@pytest.mark.parametrize('classifier,has', [
    ('token', True), ('token_unpooled', True), ('gap', False), ('map', False),
    ('unpooled', False), ({}, True), ({'classifier': 'gap'}, False)])
def test_has_class_token(classifier, has):
  assert models_vit.has_class_token(classifier) is has
