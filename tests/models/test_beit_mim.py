"""BEiT's masked image modelling (`models.beit`): the block masks against a
numpy transcription of the paper's Algorithm 1, the masked-token loss, and
the codebook's lookup, EMA update and restarts against numpy."""

import math
import random

import jax
import jax.numpy as jnp
import numpy as np
import scipy.ndimage
import scipy.special

from vit_jax.models import beit


def _numpy_algorithm_1(rng, height, width, num_masked, min_patches,
                       min_aspect=0.3):
  """BEiT's `MaskingGenerator`, transcribed from the paper's Algorithm 1."""
  mask = np.zeros((height, width), bool)
  log_aspect = (math.log(min_aspect), math.log(1 / min_aspect))
  count = 0
  while count < num_masked:
    budget = num_masked - count
    delta = 0
    for _ in range(10):
      area = rng.uniform(min_patches, budget)
      aspect = math.exp(rng.uniform(*log_aspect))
      h = int(round(math.sqrt(area * aspect)))
      w = int(round(math.sqrt(area / aspect)))
      if w < width and h < height:
        top, left = rng.randint(0, height - h), rng.randint(0, width - w)
        new = h * w - mask[top:top + h, left:left + w].sum()
        if 0 < new <= budget:
          mask[top:top + h, left:left + w] = True
          delta = new
      if delta > 0:
        break
    if delta == 0:
      break
    count += delta
  return mask


def _statistics(masks):
  """(mean masked count, mean component count, share of the masked patches
  in 4-connected components of at least 14 patches)."""
  counts, components, in_big = [], [], []
  for m in masks:
    labels, n = scipy.ndimage.label(m)
    sizes = np.bincount(labels.reshape(-1))[1:]
    counts.append(m.sum())
    components.append(n)
    in_big.append(sizes[sizes >= 14].sum() / max(m.sum(), 1))
  return np.mean(counts), np.mean(components), np.mean(in_big), np.array(
      counts)


def test_block_masks_have_algorithm_1s_statistics():
  """BEiT's setting: 75 of 14x14 patches in blocks of at least 16."""
  n = 300
  ours = np.asarray(beit.block_masks(jax.random.key(0), n, (14, 14), 75,
                                     min_patches=16)).reshape(n, 14, 14)
  rng = random.Random(0)
  ref = [_numpy_algorithm_1(rng, 14, 14, 75, 16) for _ in range(n)]
  (c1, k1, b1, counts1), (c2, k2, b2, counts2) = map(_statistics,
                                                    (ours, ref))
  assert counts1.max() <= 75 and counts2.max() <= 75
  se = np.std(counts2) / np.sqrt(n)
  assert abs(c1 - c2) < 4 * se + 0.5, (c1, c2)
  assert c1 > 0.9 * 75  # about 40% of the patches
  assert abs(k1 - k2) < 0.25 * k2, (k1, k2)
  # Nearly every masked patch is in a block of >= 14 (the smallest
  # rectangle of area >= 16 after rounding: 2 x 7).
  assert b1 > 0.95 and b2 > 0.95


def test_block_masks_follow_the_key():
  key = jax.random.fold_in(jax.random.key(3), 7)  # (seed, step)
  a = beit.block_masks(key, 8, (4, 4), 6, min_patches=2)
  b = beit.block_masks(key, 8, (4, 4), 6, min_patches=2)
  c = beit.block_masks(jax.random.fold_in(jax.random.key(3), 8), 8, (4, 4),
                       6, min_patches=2)
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  assert a.shape == (8, 16) and a.dtype == bool
  assert np.all(np.asarray(a).sum(1) <= 6) and np.asarray(a).sum() > 0


def test_masked_token_loss_is_over_masked_patches_only():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, (3, 5))
  mask = rng.random((3, 5)) < 0.5
  loss, accuracy = beit.masked_token_loss(jnp.asarray(logits),
                                          jnp.asarray(targets),
                                          jnp.asarray(mask))
  log_p = logits - scipy.special.logsumexp(logits, -1, keepdims=True)
  nll = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss, nll[mask].mean(), rtol=1e-5)
  np.testing.assert_allclose(
      accuracy, (logits.argmax(-1) == targets)[mask].mean(), rtol=1e-6)


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_codes_are_the_nearest_by_cosine():
  rng = np.random.default_rng(1)
  z, book = rng.normal(size=(20, 4)), rng.normal(size=(6, 4)) * 5
  index, codes = beit.nearest_codes(jnp.asarray(z, jnp.float32),
                                    jnp.asarray(book, jnp.float32))
  cos = _unit(z) @ _unit(book).T
  np.testing.assert_array_equal(index, cos.argmax(-1))
  np.testing.assert_allclose(codes, _unit(book)[cos.argmax(-1)], rtol=1e-5)


def test_ema_update_is_beit_v2s():
  """Each used code: normalize(d code + (1 - d) normalize(mean of its
  normalized assignments)); unused codes stay; usage is the EMA of counts."""
  rng = np.random.default_rng(2)
  book = _unit(rng.normal(size=(5, 3)))
  z = rng.normal(size=(12, 3))
  index = np.array([0, 0, 1, 3, 3, 3, 0, 1, 1, 3, 0, 0])
  usage = rng.random(5)
  d = 0.9
  new_book, new_usage = beit.ema_codebook(
      jnp.asarray(book, jnp.float32), jnp.asarray(usage, jnp.float32),
      jnp.asarray(z, jnp.float32), jnp.asarray(index), d)
  counts = np.bincount(index, minlength=5)
  np.testing.assert_allclose(new_usage, d * usage + (1 - d) * counts,
                             rtol=1e-6)
  for k in range(5):
    if counts[k]:
      mean = _unit(_unit(z[index == k]).sum(0))
      want = _unit(d * book[k] + (1 - d) * mean)
    else:
      want = book[k]
    np.testing.assert_allclose(new_book[k], want, rtol=1e-5, atol=1e-6)


def test_dead_codes_restart_from_the_batch():
  rng = np.random.default_rng(3)
  book = _unit(rng.normal(size=(4, 3)))
  usage = np.array([10., 0.01, 5., 0.2])  # uniform share 3.8
  z = rng.normal(size=(9, 3))
  new_book, new_usage, restarted = beit.restart_dead_codes(
      jax.random.key(0), jnp.asarray(book, jnp.float32),
      jnp.asarray(usage, jnp.float32), jnp.asarray(z, jnp.float32), 0.1)
  assert int(restarted) == 2  # below 0.38: codes 1 and 3
  new_book = np.asarray(new_book)
  for k in (0, 2):
    np.testing.assert_array_equal(new_book[k], book[k].astype(np.float32))
    assert new_usage[k] == usage[k]
  for k in (1, 3):  # now a normalized batch vector, with a uniform share
    assert np.min(np.linalg.norm(_unit(z) - new_book[k], axis=1)) < 1e-5
    np.testing.assert_allclose(new_usage[k], usage.sum() / 4, rtol=1e-6)


def test_pretrainer_on_a_beit_preset():
  """BEiT's own encoder (class token, relative tables, fc_norm) pretrains
  too: one logit row per patch; layer decay gives each block's table its
  block's rate."""
  from vit_jax.models import registry  # pylint: disable=g-import-not-at-top
  from vit_jax.run import optim  # pylint: disable=g-import-not-at-top
  config = registry.MODEL_CONFIGS['BEiT-testing'].to_dict()
  config.pop('num_classes', None)
  model = beit.Pretrainer(encoder=config, vocab_size=11)
  images, mask = jnp.zeros((2, 32, 32, 3)), jnp.array([[1, 0, 0, 1]] * 2,
                                                       bool)
  params = model.init(jax.random.key(0), images, train=False,
                      mask=mask)['params']
  assert model.apply({'params': params}, images, train=False,
                     mask=mask).shape == (2, 4, 11)
  assert 'relative_bias' in params['encoder']['Transformer'][
      'encoderblock_1']
  factors = optim.layer_decay_factors(params, 0.5)
  assert factors['encoder']['Transformer']['encoderblock_1'][
      'relative_bias']['table'] == 0.5
  assert factors['encoder']['mask_token'] == 0.5**3
  assert factors['head']['kernel'] == 1.
