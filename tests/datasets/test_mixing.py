"""Mixup, CutMix and label smoothing, checked in numpy from their
definitions (big_vision's Mixup, timm's CutMix and smoothing)."""

import functools

import chex
import jax
import ml_collections
import numpy as np
import optax
import pytest
from flax.training import train_state

from vit_jax import losses
from vit_jax import launch
from vit_jax.data import mixing
from vit_jax.platform import sharding
from vit_jax.tasks import classification

B, H, W, C, K = 8, 12, 10, 3, 5


def _batch(seed=0, constant=False):
  """(images, one-hot labels of `i % K`); constant: image i is all i + 1."""
  if constant:
    images = np.broadcast_to(np.arange(1, B + 1, dtype=np.float32)[
        :, None, None, None], (B, H, W, C)).copy()
  else:
    images = np.random.default_rng(seed).normal(size=(B, H, W, C)).astype(
        np.float32)
  return images, np.eye(K, dtype=np.float32)[np.arange(B) % K]


@functools.partial(jax.jit, static_argnames=('n', 'p', 'cutmix_alpha'))
def _mixes(n, images, labels, seed=0, p=0.0, cutmix_alpha=0.0,
           switch_prob=0.5):
  """n mixed batches, from n keys (one compilation for them all)."""
  keys = jax.random.split(jax.random.key(seed), n)
  return jax.vmap(lambda k: mixing.mix(
      k, images, labels, p=p, cutmix_alpha=cutmix_alpha,
      switch_prob=switch_prob))(keys)


def _check_mixup(x, y, images, labels):
  """Images and labels are a * x + (1 - a) * roll(x), a >= 0.5, with a read
  off the labels (example 0: class 0, its neighbour 7: class 2)."""
  a = y[0, 0]
  assert 0.5 <= a <= 1.0
  for mixed, plain in ((x, images), (y, labels)):
    np.testing.assert_allclose(
        mixed, a * plain + (1 - a) * np.roll(plain, 1, axis=0), rtol=1e-6,
        atol=1e-6)


def test_mixup_images_and_labels_one_convex_combination():
  images, labels = _batch()
  for x, y in zip(*jax.device_get(_mixes(8, images, labels, p=0.8))):
    _check_mixup(x, y, images, labels)


def test_mixup_weight_is_max_of_beta():
  """E[max(a, 1 - a)], a ~ Beta(p, p), as numpy's Beta sampler gives it."""
  ps = np.array([0.2, 1.0], np.float32)
  draws = np.random.default_rng(0).beta(ps[:, None], ps[:, None],
                                        (2, 200_000))
  expected = np.maximum(draws, 1 - draws).mean(1)
  keys = jax.random.split(jax.random.key(1), 4000)
  weights = jax.jit(jax.vmap(jax.vmap(mixing.mixup_weight, (0, None)),
                             (None, 0)))(keys, ps)
  assert float(weights.min()) >= 0.5
  np.testing.assert_allclose(weights.mean(1), expected, atol=0.01)


def _check_cutmix(x, y, images, labels):
  """The pasted pixels form one box, the same in every example; the rolled
  example's label weight is that box's area fraction. Returns it."""
  rolled = np.roll(images, 1, axis=0)
  pasted = (x == rolled) & (rolled != images)
  assert ((x == images) | pasted).all()  # every pixel is one or the other
  box = pasted[0, :, :, 0]
  assert (pasted == box[None, :, :, None]).all()
  rows, cols = np.nonzero(box.any(1))[0], np.nonzero(box.any(0))[0]
  if box.any():  # a filled rectangle
    assert box[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()
  area = box.mean()
  np.testing.assert_allclose(
      y, (1 - area) * labels + area * np.roll(labels, 1, axis=0), atol=1e-6)
  return area


def test_cutmix_label_weight_is_the_pasted_area():
  images, labels = _batch(constant=True)
  areas = [_check_cutmix(x, y, images, labels) for x, y in zip(
      *jax.device_get(_mixes(40, images, labels, cutmix_alpha=1.0)))]
  # lam ~ U(0, 1): pasted area 1 - lam before clipping, less after.
  assert 0.2 < np.mean(areas) < 0.5 and max(areas) > 0.5


def test_switch_between_mixup_and_cutmix():
  images, labels = _batch(constant=True)
  both = dict(p=0.8, cutmix_alpha=1.0)
  for x, y in zip(*jax.device_get(_mixes(60, images, labels,
                                         switch_prob=1.0, **both))):
    _check_cutmix(x, y, images, labels)
  for x, y in zip(*jax.device_get(_mixes(60, images, labels,
                                         switch_prob=0.0, **both))):
    _check_mixup(x, y, images, labels)
  xs, _ = jax.device_get(_mixes(60, images, labels, switch_prob=0.5, **both))
  is_cutmix = [set(np.unique(x)) <= set(range(1, B + 1)) for x in xs]
  assert 0.3 < np.mean(is_cutmix) < 0.7


def test_reproducible_from_the_key():
  images, labels = _batch()
  kw = dict(p=0.8, cutmix_alpha=1.0, switch_prob=0.5)
  first = jax.device_get(_mixes(60, images, labels, seed=3, **kw))
  chex.assert_trees_all_equal(
      first, jax.device_get(_mixes(60, images, labels, seed=3, **kw)))
  other = jax.device_get(_mixes(60, images, labels, seed=4, **kw))
  assert not any(np.array_equal(a, b) for a, b in zip(first[0], other[0]))


def test_same_mixed_batch_on_1_and_8_devices():
  images, labels = _batch()
  kw = dict(p=0.8, cutmix_alpha=1.0)  # computes both, picks one
  out = []
  for devices in (jax.devices()[:1], jax.devices()[:8]):
    mesh = sharding.make_mesh([('data', -1)], devices)
    data = sharding.batch_sharding(mesh)
    fn = jax.jit(functools.partial(mixing.mix, **kw),
                 in_shardings=(None, data, data), out_shardings=data)
    x, y = fn(jax.random.key(5), jax.device_put(images, data),
              jax.device_put(labels, data))
    assert len(x.sharding.device_set) == len(devices)
    out.append(jax.device_get((x, y)))
  chex.assert_trees_all_equal(*out)


def test_label_smoothing():
  eps = 0.1
  _, labels = _batch()
  smooth = np.asarray(mixing.smooth_labels(labels, eps))
  np.testing.assert_allclose(smooth, labels * (1 - eps) + eps / K, rtol=1e-6)
  np.testing.assert_allclose(smooth.sum(-1), 1, rtol=1e-6)
  multi = np.array([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], np.float32)
  smooth = np.asarray(mixing.smooth_labels(multi, eps))
  np.testing.assert_allclose(smooth.sum(-1), [2, 0], rtol=1e-6)
  # Softmax's target (labels / their sum) is the smoothed normalized row.
  np.testing.assert_allclose(smooth[0] / 2, [.5 * .9 + .02] * 2 + [.02] * 3,
                             rtol=1e-6)


def test_smoothing_commutes_with_mixing():
  images, labels = _batch()
  config = ml_collections.ConfigDict(dict(
      mixup=dict(p=0.8, cutmix_alpha=1.0, switch_prob=0.5),
      label_smoothing=0.1))


  @jax.jit
  def both(key):
    _, mixed = mixing.mix(jax.random.fold_in(key, mixing.STREAM), images,
                          labels, **config.mixup)
    return mixing.augment(key, images, labels, config)[1], mixed

  y, mixed = both(jax.random.key(2))
  np.testing.assert_allclose(y, mixing.smooth_labels(mixed, 0.1), atol=1e-6)
  np.testing.assert_allclose(np.asarray(y).sum(-1), 1, rtol=1e-5)


@pytest.mark.parametrize('settings,match', [
    (dict(mixup=dict(p=-0.1)), 'mixup.p'),
    (dict(mixup=dict(cutmix_alpha=-1.0)), 'mixup.cutmix_alpha'),
    (dict(mixup=dict(switch_prob=1.5)), 'switch_prob'),
    (dict(label_smoothing=1.2), 'label_smoothing')])
def test_bad_settings_are_named(settings, match):
  with pytest.raises(ValueError, match=match):
    mixing.check_config(ml_collections.ConfigDict(settings))


def test_nothing_to_mix():
  with pytest.raises(ValueError, match='Nothing to mix'):
    mixing.mix(jax.random.key(0), *_batch())


# The training step.


def _todays_step(state, batch, *, rng, loss):
  """classification.Task.train_step as it was before mixing existed."""
  dropout_rng = jax.random.fold_in(rng, state.step)

  def compute_loss(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': dropout_rng})
    return losses.classification(logits, batch['label'], loss).mean()

  value, grads = jax.value_and_grad(compute_loss)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


def _two_steps(step, task, params, images, labels):
  state = train_state.TrainState.create(
      apply_fn=task.model.apply, params=params,
      tx=optax.sgd(0.1, momentum=0.9))
  step = jax.jit(functools.partial(step, rng=jax.random.key(1)))
  for _ in range(2):
    state, metrics = step(state, {'image': images, 'label': labels})
  return jax.device_get((state.params, metrics['loss']))


def test_off_is_todays_step(tiny_config, tmp_path):
  mesh = sharding.make_mesh(tiny_config.mesh)
  images = np.random.default_rng(0).normal(size=(8, 32, 32, 3)).astype(
      np.float32)
  labels = np.eye(10, dtype=np.float32)[np.arange(8)]
  task = classification.Task(tiny_config, str(tmp_path), mesh)
  # `testing` has dropout 0.1: the step's key matters.
  params = jax.jit(task.init_params)(jax.random.key(0))
  data = (task, params, images, labels)
  before = _two_steps(functools.partial(_todays_step, loss='softmax_xent'),
                      *data)
  chex.assert_trees_all_equal(_two_steps(task.train_step, *data), before)
  del tiny_config.mixup, tiny_config.label_smoothing  # a config without them
  chex.assert_trees_all_equal(_two_steps(task.train_step, *data), before)
  tiny_config.label_smoothing = 0.1
  assert _two_steps(task.train_step, *data)[1] != before[1]


def test_training_with_mixup_and_smoothing(tiny_config, tmp_path, capsys):
  tiny_config.mixup.update(dict(p=0.8, cutmix_alpha=1.0, switch_prob=0.5))
  tiny_config.label_smoothing = 0.1
  params = launch.train_and_evaluate(tiny_config, str(tmp_path))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  losses = [float(line.split(' loss ')[1].split()[0])
            for line in capsys.readouterr().out.splitlines()
            if '] loss ' in line]
  assert len(losses) >= 3 and np.isfinite(losses).all()
