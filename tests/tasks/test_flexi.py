"""FlexiViT's training at random patch sizes (the classification task): the
size drawn from the seed and step, a step at each size, resume, the
settings refused, and configs/flexivit_fmnist.py."""

import functools

import chex
from flax.training import train_state
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.conftest import interrupt_at
from tests.conftest import make_tiny_config
from vit_jax import launch
from vit_jax.configs import flexivit_fmnist
from vit_jax.run import checks
from vit_jax.tasks import classification


def test_patch_index_is_a_function_of_seed_and_step():
  rng = jax.random.key(0)
  draws = [int(classification.patch_index(rng, s, 3)) for s in range(40)]
  assert draws == [int(classification.patch_index(rng, s, 3))
                   for s in range(40)]
  assert set(draws) == {0, 1, 2}
  assert draws != [int(classification.patch_index(jax.random.key(1), s, 3))
                   for s in range(40)]


@pytest.fixture
def flexi_config(fmnist_dirs):
  config = make_tiny_config(fmnist_dirs)
  config.pp.crop = 16
  with config.model.unlocked():
    config.model.update(patches=dict(size=(8, 8)), posemb_grid=(4, 4),
                        patch_sizes=(4, 8))
  config.model.transformer.dropout_rate = 0.0
  config.evals.test.patch_size = 4
  config.evals.test8 = dict(type='classification', every=0, patch_size=8)
  config.total_steps = 4
  return config


def test_a_step_at_each_size(flexi_config):
  model = classification.make_model(flexi_config, 10)
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)),
                      train=False)['params']
  batch = {'image': jax.random.normal(jax.random.key(1), (4, 16, 16, 3)),
           'label': jax.nn.one_hot(jnp.arange(4), 10)}
  rng = jax.random.key(5)
  draws = [int(classification.patch_index(rng, n, 2)) for n in range(8)]
  step = jax.jit(lambda s: classification.train_step(
      s, batch, rng=rng, config=flexi_config))
  logits = jax.jit(functools.partial(model.apply, train=True,
                                     rngs={'dropout': rng}),
                   static_argnames='patch_size')
  for index, size in enumerate(flexi_config.model.patch_sizes):
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params,
        tx=optax.sgd(0.1)).replace(step=draws.index(index))
    _, metrics = step(state)
    assert int(metrics['patch_size']) == size
    expected = optax.softmax_cross_entropy(logits(
        {'params': params}, batch['image'], patch_size=size), batch['label'])
    np.testing.assert_allclose(metrics['loss'], expected.mean(), rtol=1e-5)


def test_trains_at_random_patch_sizes_and_resumes(flexi_config, tmp_path,
                                                  monkeypatch, capsys):
  """A crash in step 6 resumes from step 4's checkpoint: the same sizes are
  drawn again, the same parameters come out."""
  flexi_config.total_steps = 6
  params = launch.train_and_evaluate(flexi_config, str(tmp_path / 'whole'))
  out = capsys.readouterr().out
  assert 'test accuracy at patch 4' in out and 'at patch 8' in out
  with open(tmp_path / 'whole' / 'results.json') as f:
    assert '"accuracy_patch8"' in f.read()
  assert params['embedding']['kernel'].shape == (8, 8, 3, 10)

  def crash(batch):
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, 5, crash)
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(flexi_config, str(tmp_path / 'resumed'))
  monkeypatch.undo()
  resumed = launch.train_and_evaluate(flexi_config, str(tmp_path / 'resumed'))
  chex.assert_trees_all_close(resumed, params, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('change,match', [
    (lambda c: c.model.update(patch_sizes=(4, 6)), r'patch_sizes: patch '
     r'size 6 does not divide pp.crop=16; divisors: \[1, 2, 4, 8, 16\]'),
    (lambda c: c.evals.test.update(patch_size=5), 'evals.test.patch_size'),
    (lambda c: c.update(trainer='distill'), "trainer='train', not 'distill'"),
    (lambda c: c.model.update(posemb='learn2d'), 'other than .learn2d.'),
])
def test_config_errors(flexi_config, change, match):
  change(flexi_config)
  with pytest.raises(ValueError, match=match):
    launch.check(flexi_config)  # the shared checks and the task's


@pytest.mark.parametrize('arm', flexivit_fmnist.ARMS)
def test_demo_config(arm):
  config = flexivit_fmnist.get_config(arm)
  checks.validate(config, 1)
  model = classification.make_model(config, 10)
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 28, 28, 3)), train=False))['params']
  table = shapes['Transformer']['posembed_input']['pos_embedding']
  assert table.shape[1] == (50 if arm != 'vit14' else 5)
