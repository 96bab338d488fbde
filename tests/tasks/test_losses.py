"""The LiT and SigLIP losses against numpy loops over the papers' sums."""

import jax
import numpy as np
import pytest

from vit_jax import losses


def _embeddings(n=5, d=7, seed=0):
  rng = np.random.default_rng(seed)
  z = [rng.normal(size=(n, d)) for _ in range(2)]
  return [x / np.linalg.norm(x, axis=1, keepdims=True) for x in z]


def _softmax_reference(zimg, ztxt, t):
  """-1/2N sum_i [log p(txt_i | img_i) + log p(img_i | txt_i)], loops."""
  n = len(zimg)
  total = 0.
  for i in range(n):
    sim_row = [t * zimg[i] @ ztxt[j] for j in range(n)]
    sim_col = [t * zimg[j] @ ztxt[i] for j in range(n)]
    total -= sim_row[i] - np.log(np.sum(np.exp(sim_row)))
    total -= sim_col[i] - np.log(np.sum(np.exp(sim_col)))
  return total / (2 * n)


def _sigmoid_reference(zimg, ztxt, t, b):
  """-1/N sum_ij log(1 / (1 + exp(-z_ij (t x_i.y_j + b)))), loops."""
  n = len(zimg)
  total = 0.
  for i in range(n):
    for j in range(n):
      label = 1. if i == j else -1.
      total += np.log1p(np.exp(-label * (t * zimg[i] @ ztxt[j] + b)))
  return total / n


@pytest.mark.parametrize('t', [1., 10.])
def test_softmax_loss_matches_numpy(t):
  zimg, ztxt = _embeddings()
  got = losses.softmax_loss(zimg, ztxt, t)
  np.testing.assert_allclose(got, _softmax_reference(zimg, ztxt, t),
                             rtol=1e-5)


@pytest.mark.parametrize('t,b', [(1., 0.), (10., -10.), (3., 2.)])
def test_sigmoid_loss_matches_numpy(t, b):
  zimg, ztxt = _embeddings(seed=1)
  got = losses.sigmoid_loss(zimg, ztxt, t, b)
  np.testing.assert_allclose(got, _sigmoid_reference(zimg, ztxt, t, b),
                             rtol=1e-5)


def test_softmax_loss_is_symmetric_in_images_and_captions():
  # Images and captions swapped: the symmetric loss is unchanged.
  zimg, ztxt = _embeddings(seed=2)
  np.testing.assert_allclose(losses.softmax_loss(zimg, ztxt, 5.),
                             losses.softmax_loss(ztxt, zimg, 5.),
                             rtol=1e-6)


def test_perfect_pairs_give_low_loss_and_full_retrieval():
  zimg, _ = _embeddings(n=4, d=4, seed=3)
  eye = np.eye(4)
  assert losses.retrieval_accuracy(eye, eye) == 1.
  assert losses.softmax_loss(eye, eye, 100.) < 1e-6
  assert losses.sigmoid_loss(eye, eye, 100., -50.) < 1e-6
  assert losses.softmax_loss(zimg, zimg[::-1], 100.) > 1.


def test_gradients_reach_temperature_and_bias():
  zimg, ztxt = _embeddings(seed=4)
  grads = jax.grad(losses.sigmoid_loss, argnums=(2, 3))(
      zimg, ztxt, 10., -10.)
  assert all(np.isfinite(g) and g != 0 for g in grads)
