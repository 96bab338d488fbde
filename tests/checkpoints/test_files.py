"""Checkpoint files (`checkpoint_files`): the .npz format in the published
names, written and read back for every model family; broken, refused and
missing files; `inspect_params`; Orbax workdirs."""

import os
import re

from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from tests.checkpoints.common import _apply
from tests.checkpoints.common import _assert_trees_equal
from tests.checkpoints.common import _hybrid
from tests.checkpoints.common import _mixer
from tests.checkpoints.common import _model
from tests.checkpoints.common import _notes
from tests.checkpoints.common import _outputs
from tests.checkpoints.common import _random_params
from tests.checkpoints.common import _shapes
from tests.checkpoints.common import _transformer
from tests.checkpoints.common import _without
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import checkpoint  # the original's helpers: load_pretrained


LINEN_BLOCK = ('LayerNorm_0', 'MultiHeadDotProductAttention_0', 'LayerNorm_1',
               'MlpBlock_0')
PRE_LINEN_BLOCK = ('LayerNorm_0', 'MultiHeadDotProductAttention_1',
                   'LayerNorm_2', 'MlpBlock_3')


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
  files.save(params, path)
  loaded = files.load(path)
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
  files.save(params, str(path))
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
  loaded = files.load(path)
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
  loaded = files.load(path)['Transformer']
  assert set(loaded) == {f'encoderblock_{i}' for i in range(12)}
  for i in range(12):
    _assert_trees_equal(loaded[f'encoderblock_{i}'], _block(float(i)))
  # And back: every block gets the published names.
  files.save({'Transformer': loaded}, tmp_path / 'again.npz')
  with np.load(tmp_path / 'again.npz') as f:
    assert set(f.files) == set(_flat(tree))
    np.testing.assert_array_equal(
        f['Transformer/encoderblock_10/MlpBlock_3/Dense_1/kernel'],
        np.full((8, 4), 14.))


def test_other_dicts_keep_their_names(tmp_path):
  tree = {'MixerBlock_0': {'LayerNorm_0': {'scale': np.ones(2)},
                           'LayerNorm_1': {'scale': np.zeros(2)}},
          'Dense_0': {'kernel': np.ones((2, 2))}}
  files.save(tree, tmp_path / 'm.npz')
  with np.load(tmp_path / 'm.npz') as f:
    assert set(f.files) == {'MixerBlock_0/LayerNorm_0/scale',
                            'MixerBlock_0/LayerNorm_1/scale', 'Dense_0/kernel'}
  _assert_trees_equal(files.load(tmp_path / 'm.npz'), tree)


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
  files.save(tree, path)
  with np.load(path) as f:
    stored = {k: f[k] for k in f.files}
  for key in ('resnet/gn_root/scale', 'resnet/block1/unit1/gn1/bias',
              'resnet/block1/unit1/gn_proj/scale'):
    assert stored[key].shape == (1, 1, 1, c)
    np.testing.assert_array_equal(stored[key].ravel(), _flat(tree)[key])
  assert stored['resnet/block1/unit1/conv1/kernel'].shape == (1, 1, 3, c)
  _assert_trees_equal(files.load(path), tree)


# Errors.


def test_truncated_and_corrupt_files(pretrained, tmp_path):
  path, _ = pretrained
  data = path.read_bytes()
  truncated = tmp_path / 'truncated.npz'
  truncated.write_bytes(data[:len(data) // 2])
  with pytest.raises(
      files.CheckpointError,
      match=re.escape(str(truncated)) + '.*truncated or corrupt'):
    files.load(truncated)
  corrupt = tmp_path / 'corrupt.npz'
  broken = bytearray(data)
  start = data.index(b'\x93NUMPY') + 200  # inside the first array's data
  broken[start:start + 40] = bytes(40)
  corrupt.write_bytes(bytes(broken))
  with pytest.raises(files.CheckpointError,
                     match=re.escape(str(corrupt))):
    files.load(corrupt)
  empty = tmp_path / 'empty.npz'
  empty.write_bytes(b'')
  with pytest.raises(files.CheckpointError, match=re.escape(str(empty))):
    files.load(empty)


def test_pickled_object_array_is_refused(tmp_path):
  path = tmp_path / 'pickled.npz'
  np.savez(path, cls=np.zeros(3), **{'head/kernel': np.array([{'a': 1}],
                                                              dtype=object)})
  with pytest.raises(
      files.CheckpointError,
      match=f"'head/kernel' from checkpoint {re.escape(str(path))}: a pickled"):
    files.load(path)
  plain = tmp_path / 'plain.npy'
  np.save(plain, np.zeros(3))
  with pytest.raises(files.CheckpointError, match='single array'):
    files.load(plain)


def test_missing_file(tmp_path):
  path = tmp_path / 'nowhere.npz'
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    files.load(path)
  with pytest.raises(FileNotFoundError, match=re.escape(str(path))):
    checkpoint.load_pretrained(pretrained_path=path, init_params={},
                               model_config={})


def test_inspect_params():
  expected = {'a': {'kernel': np.zeros((2, 3))}, 'empty': {},
              'b': np.zeros(4)}
  params = {'a': {'kernel': np.ones((2, 3))}, 'b': np.ones(4),
            'extra': {'kernel': np.ones(1)}}
  with pytest.raises(ValueError,
                     match=r'not in the model:\n    extra/kernel: \(1,\)'):
    files.inspect_params(params=params, expected=expected)
  out = files.inspect_params(params=params, expected=expected,
                                  fail_if_extra=False)
  assert set(out) == {'a', 'b', 'empty'} and out['empty'] == {}
  assert 'extra' in params  # The input is left alone.
  with pytest.raises(ValueError, match=r'missing:\n    b: \(4,\)'):
    files.inspect_params(params={'a': params['a']}, expected=expected)
  out = files.inspect_params(params={'a': params['a']}, expected=expected,
                                  fail_if_missing=False)
  assert set(out) == {'a', 'empty'}
  with pytest.raises(ValueError, match=r'a/kernel: \(3, 2\) vs \(2, 3\)'):
    files.inspect_params(params={'a': {'kernel': np.ones((3, 2))},
                                      'b': params['b']},
                              expected=expected, fail_if_missing=False)


def test_failed_save_keeps_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / 'ckpt.npz'
  files.save({'w': np.ones(3)}, path)

  def broken_savez(f, **kw):
    f.write(b'partial')
    raise OSError('disk full')

  monkeypatch.setattr(files.np, 'savez', broken_savez)
  with pytest.raises(OSError, match='disk full'):
    files.save({'w': np.zeros(3)}, path)
  monkeypatch.undo()
  assert os.listdir(tmp_path) == ['ckpt.npz']
  np.testing.assert_array_equal(files.load(path)['w'], np.ones(3))
  with pytest.raises(ValueError, match='bfloat16'):
    files.save({'w': jnp.ones(3, jnp.bfloat16)}, path)


# Hybrids, Mixers, the MAP head and the position-embedding schemes.


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
  files.save(params, path)
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

  loaded = files.load(path)
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


# Orbax workdirs, as training writes them.


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
  load = lambda path, **kw: loading.load_params(
      path, init_params=_shapes(model), model_config={}, **kw)
  _assert_trees_equal(load(tmp_path), trees[2])  # the latest step
  _assert_trees_equal(load(tmp_path / 'checkpoints'), trees[2])
  _assert_trees_equal(load(tmp_path / 'checkpoints' / '1'), trees[1])
  # Fitted as a file is: here to a headless model.
  headless = loading.load_params(tmp_path, model_config={},
                                    init_params=_shapes(_model(num_classes=0)))
  _assert_trees_equal(headless, _without(trees[2], 'head'))
  assert _notes(capsys)[-1].endswith('dropped the head (the model has none).')


def test_load_params_nothing_to_load(tmp_path):
  init = _shapes(_model())
  (tmp_path / 'empty').mkdir()
  with pytest.raises(files.CheckpointError,
                     match='empty holds no checkpoint: expected an .npz'):
    loading.load_params(tmp_path / 'empty', init_params=init,
                           model_config={})
  with pytest.raises(FileNotFoundError, match='missing'):
    loading.load_params(tmp_path / 'missing', init_params=init,
                           model_config={})
