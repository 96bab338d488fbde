"""Meshes and the shardings of parameter and optimizer-state trees."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from vit_jax.platform import sharding


@pytest.mark.parametrize('shape,spec', [
    ((64, 128), P(None, 'data')),  # the largest dim
    ((768, 12, 64), P('data')),  # attention query kernel
    ((12, 64, 768), P(None, None, 'data')),  # attention out kernel
    ((100, 64), P(None, 'data')),  # the largest, 100, is not divisible
    ((128, 128), P('data')),  # a tie: the first
    ((16, 16, 3, 768), P(None, None, None, 'data')),  # patch embedding
    ((99, 101), P()),  # no divisible dim
    ((3072,), P()),  # under FSDP_MIN_SIZE
    ((), P()),  # a scalar (a step count)
])
def test_fsdp_spec(shape, spec):
  assert sharding.fsdp_spec(shape, 8) == spec


def test_fsdp_spec_threshold_and_one_device():
  assert sharding.FSDP_MIN_SIZE == 4096
  assert sharding.fsdp_spec((4096,), 8) == P('data')
  assert sharding.fsdp_spec((4088,), 8) == P()
  assert sharding.fsdp_spec((8, 8), 8, min_size=64) == P('data')
  assert sharding.fsdp_spec((64, 128), 1) == P()  # nothing to split


def _state_like():
  """Shapes as in a TrainState: params, SGD trace mirroring them, a count."""
  f32 = lambda *shape: jax.ShapeDtypeStruct(shape, np.float32)
  params = {'Dense_0': {'kernel': f32(64, 128), 'bias': f32(128)},
            'Dense_1': {'kernel': f32(128, 64), 'bias': f32(64)},
            'odd': f32(99, 101)}
  trace = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, jax.numpy.bfloat16), params)
  return {'step': f32(), 'params': params,
          'opt_state': ({'trace': trace}, {'count': f32()})}


def _specs(tree, mesh, rules=(), strategy='replicate'):
  return jax.tree.map(lambda s: s.spec,
                      sharding.tree_shardings(tree, mesh, rules, strategy))


def test_fsdp_tree_state_mirrors_params():
  mesh = sharding.make_mesh([('data', -1)])
  specs = _specs(_state_like(), mesh, strategy='fsdp')
  expected = {'Dense_0': {'kernel': P(None, 'data'), 'bias': P()},
              'Dense_1': {'kernel': P('data'), 'bias': P()},
              'odd': P()}
  assert specs['params'] == expected
  assert specs['opt_state'][0]['trace'] == expected
  assert specs['step'] == specs['opt_state'][1]['count'] == P()
  # Each device holds an eighth of a large kernel.
  kernel = sharding.tree_shardings(_state_like(), mesh, (), 'fsdp')[
      'opt_state'][0]['trace']['Dense_0']['kernel']
  assert kernel.shard_shape((64, 128)) == (64, 16)


def test_replicate_is_the_default():
  mesh = sharding.make_mesh([('data', -1)])
  specs = _specs(_state_like(), mesh)
  assert all(s == P() for s in jax.tree.leaves(specs))


def test_rule_wins_over_fsdp():
  mesh = sharding.make_mesh([('data', 4), ('model', 2)])
  rules = [('Dense_0/kernel$', (None, 'model')),
           ('odd$', (None, None, 'model'))]  # too many dims: not applied
  specs = _specs(_state_like(), mesh, rules, 'fsdp')
  for tree in (specs['params'], specs['opt_state'][0]['trace']):
    assert tree['Dense_0']['kernel'] == P(None, 'model')
    assert tree['Dense_1']['kernel'] == P('data')  # split 4 ways on `data`
    assert tree['odd'] == P()


def test_unknown_strategy():
  mesh = sharding.make_mesh([('data', -1)])
  with pytest.raises(ValueError, match=r"'zero3'.*\('replicate', 'fsdp'\)"):
    sharding.tree_shardings(_state_like(), mesh, (), 'zero3')


@pytest.mark.parametrize('axes,match', [
    ([('model', 8)], 'needs a `data` axis'),
    ([('data', -1), ('model', -1)], 'do not fit 8 devices'),
    ([('data', 2), ('model', 2)], 'use 4 devices, but there are 8'),
])
def test_make_mesh_errors(axes, match):
  with pytest.raises(ValueError, match=match):
    sharding.make_mesh(axes)


def test_make_mesh_fills_in_minus_one():
  mesh = sharding.make_mesh([('data', -1), ('model', 2)])
  assert dict(mesh.shape) == {'data': 4, 'model': 2}
