"""NaViT on packed sequences, and the position schemes it shares with the ViT,
against numpy references written from the equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import layernorm
from helpers import random_params
from vit_jax import checkpoint
from vit_jax import models_navit
from vit_jax import models_vit

PATCH, CHANNELS = 4, 3


# Packed batches, made here from the format's definition (not by packing.py).


def _image_tokens(image, keep=None):
  """One image's tokens: (patches, rows, cols) of its (h, w) grid,
  row-major, only those at `keep` (indices) if given."""
  h, w = image.shape[0] // PATCH, image.shape[1] // PATCH
  patches = image.reshape(h, PATCH, w, PATCH, CHANNELS).transpose(
      0, 2, 1, 3, 4).reshape(h * w, -1)
  rows, cols = np.divmod(np.arange(h * w), w)
  keep = np.arange(h * w) if keep is None else np.asarray(keep)
  return patches[keep], rows[keep], cols[keep], (h, w)


def _pack(sequences, tokens):
  """A packed batch of `sequences`, each a list of (image, keep) placed in
  that order into `tokens` slots, the rest padding."""
  batch = {k: np.zeros((len(sequences), tokens), np.int32)
           for k in models_navit.BATCH_KEYS[1:]}
  batch['patches'] = np.zeros((len(sequences), tokens,
                               PATCH * PATCH * CHANNELS), np.float32)
  for b, images in enumerate(sequences):
    start = 0
    for k, (image, keep) in enumerate(images):
      patches, rows, cols, (h, w) = _image_tokens(image, keep)
      at = slice(start, start + len(rows))
      batch['patches'][b, at] = patches
      batch['segment_ids'][b, at] = k + 1
      batch['rows'][b, at], batch['cols'][b, at] = rows, cols
      batch['heights'][b, at], batch['widths'][b, at] = h, w
      start += len(rows)
    assert start <= tokens
  return batch


def _images():
  """Images of other sizes and aspect ratios (in patches: 3x5, 4x2, 2x2,
  4x4), the last with half its tokens dropped."""
  rng = np.random.default_rng(0)
  sides = [(3, 5), (4, 2), (2, 2), (4, 4)]
  images = [rng.uniform(-1, 1, (h * PATCH, w * PATCH, CHANNELS)).astype(
      np.float32) for h, w in sides]
  keep = [None, None, None, rng.permutation(16)[:8]]
  return list(zip(images, keep))


def _navit(posemb, pool='gap', **kw):
  transformer = dict(num_layers=2, mlp_dim=16, num_heads=2, dropout_rate=0.,
                     attention_dropout_rate=0.)
  transformer.update(kw.pop('transformer', {}))
  return models_navit.NaViT(
      num_classes=3, patches={'size': PATCH}, hidden_size=16,
      transformer=transformer, posemb=posemb, max_grid=6, pool=pool,
      max_images=4, **kw)


def _params(model, batch, seed=0):
  return random_params(model, batch, train=False, seed=seed, scale=0.3)


def _apply(model, params, batch):
  return jax.jit(lambda p, b: model.apply({'params': p}, b, train=False))(
      params, batch)


# The key property: an image's logits do not depend on what it is packed with.


@pytest.mark.parametrize('pool', ['gap', 'map'])
@pytest.mark.parametrize('posemb', models_navit.POSEMBS)
def test_packed_equals_alone(posemb, pool):
  images = _images()
  a, b, c, d = images
  # Image i at slot (sequence, segment id) of the packed batch.
  packed = _pack([[a, b, c], [d, c, b]], tokens=32)
  where = {0: [(0, 1)], 1: [(0, 2), (1, 3)], 2: [(0, 3), (1, 2)],
           3: [(1, 1)]}
  model = _navit(posemb, pool)
  params = _params(model, packed)
  logits = np.asarray(_apply(model, params, packed))
  assert logits.shape == (2, 4, 3)
  np.testing.assert_array_equal(logits[0, 3], 0.)  # no fourth image
  alone = np.asarray(_apply(model, params, _pack([[x] for x in images], 16)))
  for i, slots in where.items():
    for seq, k in slots:
      np.testing.assert_allclose(logits[seq, k - 1], alone[i, 0],
                                 rtol=1e-5, atol=1e-5)
  # Without padding at all, too.
  exact = np.asarray(_apply(model, params, _pack([[a]], tokens=15)))
  np.testing.assert_allclose(exact[0, 0], alone[0, 0], rtol=1e-5, atol=1e-5)
  # The images differ: equal logits are not a constant output.
  assert np.abs(alone[0, 0] - alone[1, 0]).max() > 1e-2
