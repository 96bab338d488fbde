"""InternVL's pixel-shuffle connector against transformers (golden file of
scripts/make_internvl_tiles_golden.py) and numpy; tiles and their padding
through the captioner; Prismatic's fused encoder and projector against
numpy."""

import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from tests.models import test_captioning as helpers
from vit_jax.models import captioning
from vit_jax.models import decoding
from vit_jax.models import fusion

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data',
                      'internvl_tiles_golden.npz')


def _torch_pixel_shuffle(x):
  """transformers' view/permute sequence, in numpy (x: (n, w, h, c))."""
  n, w, h, c = x.shape
  x = x.reshape(n, w, h // 2, c * 2).transpose(0, 2, 1, 3)
  x = x.reshape(n, h // 2, w // 2, c * 4).transpose(0, 2, 1, 3)
  return x.reshape(n, -1, c * 4)


def test_pixel_shuffle_and_projector_equal_transformers():
  golden = np.load(GOLDEN)
  features = golden['features']
  np.testing.assert_array_equal(captioning.pixel_shuffle(features),
                                golden['shuffled'])
  grid = np.random.default_rng(0).normal(size=(2, 6, 6, 5))
  np.testing.assert_array_equal(
      captioning.pixel_shuffle(grid.reshape(2, 36, 5)),
      _torch_pixel_shuffle(grid))
  w = lambda name: golden[f'projector/{name}']
  params = {'LayerNorm': {'scale': w('layer_norm/weight'),
                          'bias': w('layer_norm/bias')},
            'Dense_0': {'kernel': w('linear_1/weight').T,
                        'bias': w('linear_1/bias')},
            'Dense_1': {'kernel': w('linear_2/weight').T,
                        'bias': w('linear_2/bias')}}
  got = captioning.PixelShuffleProjector(16).apply({'params': params},
                                                   features)
  np.testing.assert_allclose(got, golden['projected'], rtol=1e-4, atol=1e-4)


def _tiled_captioner():
  return captioning.Captioner(
      encoder=helpers._encoder(), connector='pixel_shuffle_mlp', block=-1,
      norm=False, decoder=dict(vocab_size=helpers.VOCAB, width=16,
                               num_layers=2, num_heads=2, mlp_dim=32,
                               max_len=4))


def test_padding_tiles_change_nothing_and_decode_alike():
  """Two tiles and a NaN one give the logits of the two tiles alone; the
  image is 2 tiles x 4 tokens (16 patches, shuffled) in the LM's prefix;
  decoding with the cache (the padding's mask kept in it) gives the same
  logits, at the first step and the next."""
  model = _tiled_captioner()
  tiles = jax.random.normal(jax.random.key(0), (2, 2, 28, 28, 3))
  tokens = jnp.array([[1, 3, 4, 2], [1, 4, 3, 3]])
  params = model.init(jax.random.key(1), tiles, tokens)['params']
  params['text']['head']['kernel'] = jax.random.normal(
      jax.random.key(2), params['text']['head']['kernel'].shape)
  padded = jnp.concatenate([tiles, jnp.full_like(tiles[:, :1], jnp.nan)], 1)
  memory = jax.jit(functools.partial(model.apply, method='encode'))(
      {'params': params}, padded)
  assert memory.shape == (2, 12, 16) and np.isnan(memory[:, 8:]).all()
  apply = jax.jit(model.apply)
  want = apply({'params': params}, tiles, tokens)
  got = apply({'params': params}, padded, tokens)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

  @jax.jit
  def two_steps(memory):
    first, state, step = decoding.cached_decoder(model, params, memory,
                                                 tokens[:, :1], max_len=4)
    return jnp.concatenate([first, step(tokens[:, 1:2], state)[0]], 1)

  np.testing.assert_allclose(two_steps(memory), want[:, :2], rtol=1e-5,
                             atol=1e-5)


def _gelu(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def test_fused_encoder_and_projector_against_numpy():
  """Two encoders, one fed 28 px in [-1, 1] and one 14 px with ImageNet's
  normalization, fused on the first's 4 x 4 grid (the second's 2 x 2
  tokens each repeated on 2 x 2 patches: `resize='nearest'`)."""
  enc = helpers._encoder()
  fused = fusion.FusedEncoder(
      encoders=(enc, helpers._encoder()), sizes=(28, 14), means=(None, (0.485, 0.456, 0.406)),
      stds=(None, (0.229, 0.224, 0.225)), grid=4, resize='nearest')
  images = jax.random.uniform(jax.random.key(3), (2, 28, 28, 3), minval=-1,
                              maxval=1)
  params = fused.init(jax.random.key(4), images, [-1],
                      method='forward_intermediates')['params']
  got = fused.apply({'params': params}, images, [-1],
                    method='forward_intermediates')[0]
  tokens = lambda p, x: enc.apply({'params': p}, x, [-1], output_fmt='NHWC',
                                  intermediates_only=True,
                                  method='forward_intermediates')[0]
  first = np.asarray(tokens(params['encoders_0'], images)).reshape(2, 16, 16)
  small = np.asarray(jax.image.resize(images, (2, 14, 14, 3), 'bilinear'))
  small = ((small + 1) / 2 - np.array([0.485, 0.456, 0.406])) / np.array(
      [0.229, 0.224, 0.225])
  second = np.asarray(tokens(params['encoders_1'], small))
  second = second.repeat(2, 1).repeat(2, 2).reshape(2, 16, 16)
  np.testing.assert_allclose(got, np.concatenate([first, second], -1),
                             rtol=1e-4, atol=1e-5)
  projector = captioning.FusedProjector(8)
  p = projector.init(jax.random.key(5), got)['params']
  x = np.asarray(got)
  for i in range(3):
    x = x @ np.asarray(p[f'Dense_{i}']['kernel']) + np.asarray(
        p[f'Dense_{i}']['bias'])
    x = _gelu(x) if i < 2 else x
  assert p['Dense_0']['kernel'].shape == (32, 128)  # 4x the fused width
  np.testing.assert_allclose(projector.apply({'params': p}, got), x,
                             rtol=1e-4, atol=1e-4)
