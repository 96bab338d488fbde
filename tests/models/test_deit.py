"""DeiT (Touvron et al., 2021): the distillation token and its head,
against a numpy forward from the paper."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import layernorm
from tests.helpers import param_shapes
from tests.helpers import patch_embed
from tests.helpers import random_params
from tests.models.vit_reference import _apply
from tests.models.vit_reference import _msa
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import checkpoint  # the original's helpers: load_pretrained
from vit_jax import models
from vit_jax.models import posemb_resize
from vit_jax.models import vit as models_vit


def _gelu_exact(x):
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


def _deit(images, p, patch):
  """(class logits, distillation logits) of a DeiT, from the paper: tokens
  [class, distillation, patches] plus position embeddings, ViT blocks with
  the exact GELU, one head on each of the first two tokens."""
  n = images.shape[0]
  x = patch_embed(images, p['embedding'], patch)
  d = x.shape[-1]
  x = np.concatenate([np.broadcast_to(p['cls'], (n, 1, d)),
                      np.broadcast_to(p['dist'], (n, 1, d)), x], 1)
  t = p['Transformer']
  x = x + t['posembed_input']['pos_embedding']
  i = 0
  while f'encoderblock_{i}' in t:
    b = t[f'encoderblock_{i}']
    x = x + _msa(layernorm(x, b['LayerNorm_0']),
                 b['MultiHeadDotProductAttention_0'])
    m = b['MlpBlock_0']
    h = _gelu_exact(layernorm(x, b['LayerNorm_1']) @ m['Dense_0']['kernel'] +
                    m['Dense_0']['bias'])
    x = x + h @ m['Dense_1']['kernel'] + m['Dense_1']['bias']
    i += 1
  x = layernorm(x, t['encoder_norm'])
  return (x[:, 0] @ p['head']['kernel'] + p['head']['bias'],
          x[:, 1] @ p['head_dist']['kernel'] + p['head_dist']['bias'])


def _distilled(**kw):
  return models.get_model('DeiT-testing-distilled', **{'num_classes': 6, **kw})


def test_distilled_param_tree():
  params = param_shapes(_distilled(), jnp.zeros((1, 32, 32, 3)), train=False)
  assert set(params) == {'embedding', 'cls', 'dist', 'Transformer',
                         'head', 'head_dist'}
  assert params['cls'].shape == params['dist'].shape == (1, 1, 32)
  assert params['head_dist']['kernel'].shape == (32, 6)
  # The class and distillation tokens, then the 4x4 patches.
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1, 2 + 16, 32)
  assert models_vit.num_prefix_tokens('distilled') == 2
  assert models_vit.num_prefix_tokens(models.MODEL_CONFIGS['DeiT-testing']) == 1
  assert models_vit.num_prefix_tokens('gap') == 0
  assert models_vit.has_class_token('distilled')


@pytest.mark.parametrize('size', [(32, 32), (32, 48)])
def test_distilled_forward_matches_reference(size):
  """Evaluation: the mean of the two heads; training: both (no dropout in
  the preset, so the same values)."""
  model = _distilled()
  x = np.random.default_rng(6).uniform(-1, 1, (2, *size, 3))
  params = random_params(model, jnp.asarray(x, jnp.float32), train=False,
                         dtype=np.float64)
  cls, dist = _deit(x, params, 8)
  assert np.abs(cls - dist).min() > 1e-2  # the heads differ: the mean shows
  out = _apply(model, params, jnp.asarray(x, jnp.float32), train=False)
  np.testing.assert_allclose(out, (cls + dist) / 2, rtol=1e-3, atol=1e-3)
  pair = model.apply({'params': params}, jnp.asarray(x, jnp.float32),
                     train=True, rngs={'dropout': jax.random.key(0)})
  assert isinstance(pair, tuple) and len(pair) == 2
  np.testing.assert_allclose(pair[0], cls, rtol=1e-3, atol=1e-3)
  np.testing.assert_allclose(pair[1], dist, rtol=1e-3, atol=1e-3)


def test_distilled_without_head_gives_mean_of_tokens():
  """num_classes=0 (few-shot features): the mean of the class and
  distillation tokens, as timm's pre_logits."""
  model = _distilled(num_classes=0)
  x = jax.random.uniform(jax.random.key(3), (2, 32, 32, 3), minval=-1)
  params = random_params(model, x, train=False)
  out, state = model.apply(
      {'params': params}, x, train=False, mutable=['intermediates'],
      capture_intermediates=lambda mdl, _: mdl.name == 'Transformer')
  encoded = state['intermediates']['Transformer']['__call__'][0]
  assert encoded.shape == (2, 18, 32)
  np.testing.assert_allclose(out, (encoded[:, 0] + encoded[:, 1]) / 2,
                             rtol=1e-6, atol=1e-6)


def test_distilled_fine_tuning_keeps_both_prefix_entries(tmp_path):
  """At a new resolution the class and distillation entries are kept and
  only the 4x4 grid of patch entries is resized, to 6x6; both heads are the
  new model's."""
  params = random_params(_distilled(), jnp.zeros((1, 32, 32, 3)), train=False)
  path = tmp_path / 'deit.npz'
  files.save(params, path)
  config = models.MODEL_CONFIGS['DeiT-testing-distilled']
  assert loading.image_size(files.read_params(path), config) == 32
  model = _distilled(num_classes=3)
  x = jnp.ones((2, 48, 48, 3))
  init = jax.jit(lambda: model.init(jax.random.key(1), x, train=False))()[
      'params']
  loaded = checkpoint.load_pretrained(pretrained_path=str(path),
                                      init_params=init, model_config=config)
  old = params['Transformer']['posembed_input']['pos_embedding']
  new = loaded['Transformer']['posembed_input']['pos_embedding']
  assert new.shape == (1, 2 + 36, 32)
  np.testing.assert_array_equal(new[:, :2], old[:, :2])
  # DeiT's weights are timm's: resized as timm does by default.
  grid = posemb_resize.resize_posemb_grid(old[:, 2:], new_grid=(6, 6),
                                          has_class_token=False,
                                          method='bicubic_antialias')
  np.testing.assert_allclose(new[:, 2:], grid, rtol=1e-6)
  for head in ('head', 'head_dist'):
    np.testing.assert_array_equal(loaded[head]['kernel'], init[head]['kernel'])
    assert loaded[head]['kernel'].shape == (32, 3)
  assert _apply(model, loaded, x, train=False).shape == (2, 3)
