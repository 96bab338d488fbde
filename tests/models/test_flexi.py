"""FlexiViT: PI-resize, a ViT at any patch size."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vit_jax.models import flexi
from vit_jax.models import vit as models_vit


def numpy_bilinear(old, new):
  """(new, old): linear interpolation at half-pixel centres, ends clamped."""
  b = np.zeros((new, old))
  for i in range(new):
    x = np.clip((i + 0.5) * old / new - 0.5, 0, old - 1)
    lo = int(np.floor(x))
    hi = min(lo + 1, old - 1)
    b[i, lo] += 1 - (x - lo)
    b[i, hi] += x - lo
  return b


def numpy_pi_resize(kernel, new):
  """pinv(B^T) w with B the whole 2-D resize of a flattened patch."""
  (h, w, c, d), (nh, nw) = kernel.shape, new
  b = np.kron(numpy_bilinear(h, nh), numpy_bilinear(w, nw))
  return (np.linalg.pinv(b.T) @ kernel.reshape(h * w, c * d)).reshape(
      nh, nw, c, d)


def random_kernel(shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


@pytest.mark.parametrize('old,new', [(8, 16), (4, 14), (7, 14), (14, 4),
                                     (16, 7)])
def test_resize_matrix_is_bilinear(old, new):
  np.testing.assert_allclose(flexi.resize_matrix(old, new),
                             numpy_bilinear(old, new), atol=1e-6)


@pytest.mark.parametrize('old,new', [((8, 8), (16, 16)), ((16, 16), (4, 4)),
                                     ((16, 16), (7, 7)), ((16, 16), (14, 14)),
                                     ((6, 8), (3, 12))])
def test_pi_resize_is_numpy_pinv(old, new):
  kernel = random_kernel((*old, 3, 5))
  out = flexi.pi_resize_patch_embed(jnp.asarray(kernel), new)
  assert out.shape == (*new, 3, 5) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, numpy_pi_resize(kernel, new), atol=1e-4)


def test_same_size_is_the_kernel():
  kernel = jnp.asarray(random_kernel((7, 7, 3, 4)))
  assert flexi.pi_resize_patch_embed(kernel, 7) is kernel


def test_upsampled_patches_give_the_same_tokens():
  kernel = random_kernel((8, 8, 3, 6))
  x = np.random.default_rng(1).normal(size=(5, 8, 8, 3)).astype(np.float32)
  big = jax.image.resize(x, (5, 16, 16, 3), 'bilinear', antialias=False)
  new = flexi.pi_resize_patch_embed(jnp.asarray(kernel), 16)
  np.testing.assert_allclose(jnp.einsum('nhwc,hwcd->nd', big, new),
                             np.einsum('nhwc,hwcd->nd', x, kernel),
                             rtol=1e-4, atol=1e-4)


def test_resize_posemb_keeps_the_prefix():
  table = jnp.concatenate([jnp.full((1, 1, 4), 9.), jnp.ones((1, 49, 4))], 1)
  out = flexi.resize_posemb(table, (7, 7), (2, 2), prefix=1)
  assert out.shape == (1, 5, 4) and float(out[0, 0, 0]) == 9.
  np.testing.assert_allclose(out[0, 1:], 1., rtol=1e-6)
  assert flexi.resize_posemb(table, (7, 7), (7, 7), 1) is table


def tiny_vit(patch=7, **kw):
  return models_vit.VisionTransformer(
      num_classes=3, patches={'size': (patch, patch)}, hidden_size=16,
      transformer=dict(mlp_dim=16, num_heads=2, num_layers=1,
                       dropout_rate=0., attention_dropout_rate=0.), **kw)


def random_variables(model, side=28):
  """Initialized, then every leaf random (the head is zeros at init)."""
  variables = model.init(jax.random.key(0), jnp.zeros((1, side, side, 3)),
                         train=False)
  rng = np.random.default_rng(1)
  return jax.tree.map(
      lambda x: (0.3 * rng.normal(size=x.shape)).astype(np.float32),
      variables)


def test_vit_at_its_own_patch_size_is_unchanged():
  model, x = tiny_vit(), jax.random.normal(jax.random.key(2), (2, 28, 28, 3))
  init = lambda **kw: model.init(jax.random.key(0), x, train=False, **kw)
  chex.assert_trees_all_equal(init(patch_size=7), init())  # nn.Conv's
  variables = random_variables(model)
  apply = jax.jit(functools.partial(model.apply, train=False),
                  static_argnames='patch_size')
  np.testing.assert_allclose(apply(variables, x, patch_size=7),
                             apply(variables, x), rtol=1e-5, atol=1e-6)
  for p, tokens in ((4, 49), (14, 4)):
    _, out = jax.eval_shape(functools.partial(
        model.apply, train=False, patch_size=p, capture_intermediates=True,
        mutable=['intermediates']), variables, x)
    embedded = out['intermediates']['embedding']['__call__'][0]
    assert embedded.shape[1] * embedded.shape[2] == tokens


def upsample_each_patch(x, patch, new):
  """Every (patch x patch) patch of `x` resized on its own to (new x new)."""
  n, h, w, c = x.shape
  gh, gw = h // patch, w // patch
  patches = x.reshape(n, gh, patch, gw, patch, c).transpose(0, 1, 3, 2, 4, 5)
  patches = jax.image.resize(patches, (n, gh, gw, new, new, c), 'bilinear',
                             antialias=False)
  return patches.transpose(0, 1, 3, 2, 4, 5).reshape(n, gh * new, gw * new, c)


def test_twice_the_patch_on_upsampled_patches():
  """PI-resize 7 -> 14 on each patch upsampled to 14x14: the same tokens,
  the same 4x4 grid (so the same table), the same logits."""
  model, x = tiny_vit(), jax.random.normal(jax.random.key(3), (2, 28, 28, 3))
  variables = random_variables(model)
  big = upsample_each_patch(x, 7, 14)
  np.testing.assert_allclose(
      model.apply(variables, big, train=False, patch_size=14),
      model.apply(variables, x, train=False), rtol=1e-4, atol=1e-4)


def test_flexivit_keeps_its_table_grid():
  model = tiny_vit(14, posemb_grid=(7, 7))
  variables = random_variables(model)
  table = variables['params']['Transformer']['posembed_input']
  assert table['pos_embedding'].shape == (1, 50, 16)
  assert variables['params']['embedding']['kernel'].shape == (14, 14, 3, 16)
  x = jnp.ones((1, 28, 28, 3))
  for p in (4, 7, 14):
    assert jax.eval_shape(functools.partial(
        model.apply, train=False, patch_size=p), variables, x).shape == (1, 3)
