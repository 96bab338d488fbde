"""NaViT on packed sequences, and the position schemes it shares with the ViT,
against numpy references written from the equations."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import layernorm
from tests.helpers import random_params
from vit_jax.checkpoints import files
from vit_jax.models import navit as models_navit
from vit_jax.models import posemb as vit_posemb
from vit_jax.models import vit as models_vit

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


# The position schemes, one token at a time.


def _positions(grids):
  """(rows, cols, heights, widths), (1, tokens), of the row-major tokens
  of images of `grids`, one after another."""
  out = [[], [], [], []]
  for h, w in grids:
    for r in range(h):
      for c in range(w):
        for v, x in zip(out, (r, c, h, w)):
          v.append(x)
  return tuple(np.array([v], np.int32) for v in out)


@pytest.mark.parametrize('fractional', [False, True])
def test_factorized_posemb_matches_reference(fractional):
  rng = np.random.default_rng(1)
  row, col = rng.normal(size=(2, 6, 4))
  rows, cols, heights, widths = _positions([(3, 5), (6, 2), (1, 1)])
  out = vit_posemb.factorized_posemb(row, col, rows, cols, heights, widths,
                                     fractional=fractional)
  for t in range(rows.shape[1]):
    r, c, h, w = rows[0, t], cols[0, t], heights[0, t], widths[0, t]
    if fractional:  # r / h * 6 exactly, e.g. row 1 of 3 -> 2
      r, c = int(np.floor(r / h * 6 + 1e-9)), int(np.floor(c / w * 6 + 1e-9))
    np.testing.assert_allclose(out[0, t], row[r] + col[c], rtol=1e-6)


def _keys(d, a=-0.75):
  """Keys' cubic convolution kernel, as torch's bicubic (a = -0.75)."""
  d = abs(d)
  if d <= 1:
    return (a + 2) * d**3 - (a + 3) * d**2 + 1
  if d < 2:
    return a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
  return 0.


def _bicubic_matrix(size, source):
  """(size, source) weights of torch's `interpolate(mode='bicubic',
  align_corners=False)` on one axis: output i samples source coordinate
  (i + 0.5) * source / size - 0.5 from its 4 neighbours, clamped."""
  m = np.zeros((size, source))
  for i in range(size):
    x = (i + 0.5) * source / size - 0.5
    x0 = int(np.floor(x))
    for k in range(x0 - 1, x0 + 3):
      m[i, min(max(k, 0), source - 1)] += _keys(x - k)
  return m


def test_interp2d_matches_torch_bicubic_reference():
  table = np.random.default_rng(2).normal(size=(5, 7, 3)).astype(np.float32)
  grids = [(3, 2), (8, 11), (5, 7), (1, 1), (13, 4)]
  out = jax.jit(vit_posemb.interp2d_posemb)(table, *_positions(grids))[0]
  start = 0
  for h, w in grids:
    expected = np.einsum('ih,jw,hwd->ijd', _bicubic_matrix(h, 5),
                         _bicubic_matrix(w, 7), table).reshape(h * w, 3)
    np.testing.assert_allclose(out[start:start + h * w], expected,
                               rtol=1e-5, atol=1e-5)
    start += h * w
  # At the table's own grid: the table itself, exactly.
  same = vit_posemb.interp2d_posemb(table, *models_vit.grid_positions((5, 7)))
  np.testing.assert_array_equal(same[0], table.reshape(35, 3))


def _bilinear_aa_matrix(size, source):
  """(size, source) matrix of torch's `interpolate(mode='bilinear',
  antialias=True, align_corners=False)` along one axis, as its
  `_compute_weights_aa` builds it: a triangle of half-width max(scale, 1)
  about each output's centre, over the taps [xmin, xmax), normalized."""
  scale = source / size
  support = max(scale, 1.)
  out = np.zeros((size, source))
  for i in range(size):
    centre = scale * (i + 0.5)
    xmin = max(int(centre - support + 0.5), 0)
    xmax = min(int(centre + support + 0.5), source)
    for j in range(xmin, xmax):
      out[i, j] = max(0., 1. - abs((j - centre + 0.5) / support))
    out[i] /= out[i].sum()
  return out


def test_learn_resized_matches_torch_bilinear_antialias():
  table = np.random.default_rng(3).normal(size=(6, 6, 3)).astype(np.float32)
  grids = [(3, 2), (8, 11), (6, 6), (1, 1), (13, 4), (2, 17)]
  out = jax.jit(vit_posemb.resized_posemb)(table, *_positions(grids))[0]
  start = 0
  for h, w in grids:
    expected = np.einsum('ih,jw,hwd->ijd', _bilinear_aa_matrix(h, 6),
                         _bilinear_aa_matrix(w, 6), table).reshape(h * w, 3)
    np.testing.assert_allclose(out[start:start + h * w], expected,
                               rtol=1e-5, atol=1e-5)
    start += h * w


def test_learn_resized_padded_equals_vit_on_the_image():
  """SigLIP 2's NaFlex tower two ways: a padded sequence of one image
  (NaViT) and the image itself (a ViT with `posemb_grid`), one checkpoint."""
  image, _ = _images()[0]  # 3 x 5 patches
  navit = _navit('learn_resized', 'map')
  params = _params(navit, _pack([[(image, None)]], tokens=20))
  vit = models_vit.VisionTransformer(
      num_classes=3, patches={'size': (PATCH, PATCH)}, hidden_size=16,
      transformer=navit.transformer, classifier='map', posemb_grid=(6, 6))
  dense = vit.apply({'params': params}, image[None], train=False)
  padded = _apply(navit, params, _pack([[(image, None)]], tokens=20))
  np.testing.assert_allclose(padded[0, 0], dense[0], rtol=1e-5, atol=1e-5)
  assert np.abs(dense).max() > 1e-2


def _rope_reference(x, rows, cols, theta=10_000.):
  """x (tokens, heads, d) rotated: pairs (x[2j], x[2j+1]) as complex
  numbers times exp(i angle_j); angle 2k = col f_k, 2k+1 = row f_k."""
  d = x.shape[-1]
  out = np.empty_like(x)
  for t in range(x.shape[0]):
    for j in range(d // 2):
      k, use_row = divmod(j, 2)
      angle = (rows[t] if use_row else cols[t]) * theta**(-4 * k / d)
      z = (x[t, :, 2 * j] + 1j * x[t, :, 2 * j + 1]) * np.exp(1j * angle)
      out[t, :, 2 * j], out[t, :, 2 * j + 1] = z.real, z.imag
  return out


def test_rope2d_matches_reference():
  rows, cols, _, _ = _positions([(3, 5), (2, 2)])
  x = np.random.default_rng(3).normal(size=(1, 19, 2, 8)).astype(np.float32)
  angles = models_vit.rope2d_angles(rows, cols, 8)
  assert angles.shape == (1, 19, 4)
  out = vit_posemb.apply_rope(jnp.asarray(x), angles)
  np.testing.assert_allclose(out[0], _rope_reference(x[0], rows[0], cols[0]),
                             rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(out[0, 0], x[0, 0])  # (0, 0): not rotated
  with pytest.raises(ValueError, match='divisible by 4, got 12 / 2'):
    models_vit.rope_head_dim(12, 2)


def _attention_reference(q, k, v, mask, rope=None):
  """softmax(q k^T / sqrt(d)) v per head where `mask`, after rotating q and
  k by `rope` (rows, cols) if given. q, k, v: (tokens, heads, d)."""
  if rope is not None:
    q, k = (_rope_reference(y, *rope) for y in (q, k))
  logits = np.einsum('qhd,khd->hqk', q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask, logits, -np.inf)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  w /= w.sum(-1, keepdims=True)
  return np.einsum('hqk,khd->qhd', w, v)


def test_attention_with_rope_and_mask_matches_reference():
  rows, cols, _, _ = _positions([(2, 3), (2, 2)])
  seg = np.array([1] * 6 + [2] * 4 + [0] * 2)
  rows, cols = (np.pad(v[0], (0, 2)) for v in (rows, cols))
  mask = seg[:, None] == seg[None, :]
  q, k, v = np.random.default_rng(4).normal(size=(3, 1, 12, 2, 8)).astype(
      np.float32)
  angles = models_vit.rope2d_angles(rows[None], cols[None], 8)
  out = jax.jit(models_vit.attention)(q, k, v, mask=mask[None, None],
                                      rope=angles)
  expected = _attention_reference(q[0], k[0], v[0], mask, (rows, cols))
  np.testing.assert_allclose(out[0], expected, rtol=1e-5, atol=1e-5)


# NaViT against numpy: embedding, position, pooling, head.


def test_navit_without_blocks_matches_reference():
  """GAP of LN(x_p E + row[r] + col[c]) over each image's tokens."""
  images = _images()
  batch = _pack([[images[0], images[3]], [images[1]]], tokens=24)
  model = _navit('factorized', transformer=dict(num_layers=0))
  params = _params(model, batch)
  out = np.asarray(_apply(model, params, batch))
  pe = params['Transformer']['posembed_input']
  kernel = params['embedding']['kernel'].reshape(-1, 16)
  for b in range(2):
    for k in range(4):
      at = batch['segment_ids'][b] == k + 1
      if not at.any():
        np.testing.assert_array_equal(out[b, k], 0.)
        continue
      x = (batch['patches'][b, at] @ kernel + params['embedding']['bias'] +
           pe['pos_embedding_row'][batch['rows'][b, at]] +
           pe['pos_embedding_col'][batch['cols'][b, at]])
      feature = layernorm(x, params['Transformer']['encoder_norm']).mean(0)
      expected = feature @ params['head']['kernel'] + params['head']['bias']
      np.testing.assert_allclose(out[b, k], expected, rtol=1e-5, atol=1e-5)


def test_navit_param_names():
  batch = _pack([_images()[:2]], tokens=24)
  shapes = jax.tree.map(np.shape, _params(_navit('factorized', 'map'), batch))
  assert set(shapes) == {'embedding', 'Transformer', 'MAPHead_0', 'head'}
  assert shapes['embedding']['kernel'] == (PATCH, PATCH, CHANNELS, 16)
  assert shapes['Transformer']['posembed_input'] == {
      'pos_embedding_row': (6, 16), 'pos_embedding_col': (6, 16)}
  assert set(shapes['Transformer']) == {
      'posembed_input', 'encoderblock_0', 'encoderblock_1', 'encoder_norm'}
  interp = jax.tree.map(np.shape, _params(_navit('interp2d'), batch))
  assert interp['Transformer']['posembed_input'] == {
      'pos_embedding_grid': (6, 6, 16)}
  rope = jax.tree.map(np.shape, _params(_navit('rope2d'), batch))
  assert 'posembed_input' not in rope['Transformer']


def test_scanned_and_rematted_blocks_match():
  batch = _pack([_images()[:3]], tokens=32)
  model = _navit('rope2d', 'map')
  params = _params(model, batch)
  scanned = _navit('rope2d', 'map', transformer=dict(scan=True,
                                                     remat_policy='dots'))
  out = _apply(scanned, files.scan_like(params, {'Transformer': {
      'encoderblock': {}}}), batch)
  np.testing.assert_allclose(out, _apply(model, params, batch), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('change,match', [
    (dict(posemb='rope'), "Unknown posemb 'rope'"),
    (dict(pool='token'), "Unknown pool 'token'"),
    (dict(hidden_size=20), r'divisible by 4, got 20 / 2'),
])
def test_bad_options(change, match):
  batch = _pack([_images()[:1]], tokens=16)
  model = _navit('rope2d').clone(**change)
  with pytest.raises(ValueError, match=match):
    model.init(jax.random.key(0), batch, train=False)


def _batch_with(**change):
  batch = _pack([_images()[:2]], tokens=24)
  batch.update(change)
  return batch


@pytest.mark.parametrize('batch,match', [
    (_batch_with(patches=np.zeros((1, 24, 40))), r'4\*4\*channels'),
    (_batch_with(rows=np.zeros((1, 23), np.int32)), r'rows must be \(1, 24\)'),
    ({'patches': np.zeros((1, 4, 48))}, 'lacks'),
    (_batch_with(segment_ids=np.full((1, 24), 5, np.int32)),
     'max_images=4'),
    (_batch_with(heights=np.full((1, 24), 7, np.int32)), 'max_grid=6'),
    (_batch_with(cols=np.full((1, 24), 5, np.int32)), 'outside their grid'),
])
def test_bad_batch(batch, match):
  with pytest.raises(ValueError, match=match):
    _navit('factorized').init(jax.random.key(0), batch, train=False)


# MoonViT's patch merger.


def test_merge_groups_order():
  x = np.random.default_rng(5).normal(size=(2, 4, 6, 3)).astype(np.float32)
  out = models_navit.merge_groups(jnp.asarray(x))
  assert out.shape == (2, 2, 3, 12)
  for i in range(2):
    for j in range(3):
      expected = np.concatenate([x[:, 2 * i, 2 * j], x[:, 2 * i, 2 * j + 1],
                                 x[:, 2 * i + 1, 2 * j],
                                 x[:, 2 * i + 1, 2 * j + 1]], axis=-1)
      np.testing.assert_array_equal(out[:, i, j], expected)
  with pytest.raises(ValueError, match='even grid, got 3x6'):
    models_navit.merge_groups(jnp.zeros((3, 6, 2)))


def test_packed_merge_groups_equals_per_image():
  rng = np.random.default_rng(6)
  grids = [(2, 4), (4, 2), (2, 2)]
  tokens = [rng.normal(size=(h, w, 3)).astype(np.float32) for h, w in grids]
  perm = rng.permutation(8)  # the first image's tokens in any order
  rows, cols, _, _ = (v[0] for v in _positions(grids))
  seg = np.repeat([1, 2, 3], [8, 8, 4])
  x = np.concatenate([t.reshape(-1, 3) for t in tokens])
  order = np.concatenate([perm, np.arange(8, 20)])
  pad = lambda v: np.pad(v[order], [(0, 4)] + [(0, 0)] * (v.ndim - 1))
  merged, ids = models_navit.packed_merge_groups(
      *(jnp.asarray(pad(v))[None] for v in (x, seg, rows, cols)))
  assert merged.shape == (1, 6, 12)
  np.testing.assert_array_equal(ids[0], [1, 1, 2, 2, 3, 0])
  expected = [models_navit.merge_groups(t).reshape(-1, 12) for t in tokens]
  first = merged[0, :2]  # its groups in the order of their top-left tokens
  np.testing.assert_array_equal(np.sort(first, 0), np.sort(expected[0], 0))
  np.testing.assert_array_equal(merged[0, 2:5], np.concatenate(expected[1:]))
  np.testing.assert_array_equal(merged[0, 5], 0.)


def test_navit_merge_patches():
  rng = np.random.default_rng(7)
  images = [(rng.normal(size=(h * PATCH, w * PATCH, CHANNELS)), None)
            for h, w in ((2, 4), (4, 2))]
  batch = _pack([images, images[1:]], tokens=20)
  model = _navit('interp2d', merge_patches=True, merge_dim=10)
  params = _params(model, batch)
  assert jax.tree.map(np.shape, params['patch_merger']) == {
      'pre_norm': {'scale': (16,), 'bias': (16,)},
      'linear_1': {'kernel': (64, 64), 'bias': (64,)},
      'linear_2': {'kernel': (64, 10), 'bias': (10,)}}
  merged, ids = _apply(model, params, batch)
  assert merged.shape == (2, 5, 10)
  np.testing.assert_array_equal(ids, [[1, 1, 2, 2, 0], [1, 1, 0, 0, 0]])
  # The second image's merged tokens, packed with the first or alone.
  np.testing.assert_allclose(merged[0, 2:4], merged[1, :2], rtol=1e-5,
                             atol=1e-5)
  dropped = _pack([[_images()[3]]], tokens=20)
  with pytest.raises(ValueError, match='whole images of even sides'):
    model.init(jax.random.key(0), dropped, train=False)


def test_patch_merger_on_one_image_matches_reference():
  x = np.random.default_rng(8).normal(size=(4, 2, 6)).astype(np.float32)
  merger = models_navit.PatchMerger(out_dim=5)
  params = random_params(merger, jnp.asarray(x), scale=0.3)
  out = merger.apply({'params': params}, x)
  groups = np.stack([np.concatenate([layernorm(x[2 * i + a, b],
                                               params['pre_norm'], 1e-6)
                                     for a in (0, 1) for b in (0, 1)])
                     for i in range(2)])
  hidden = groups @ params['linear_1']['kernel'] + params['linear_1']['bias']
  hidden = jax.nn.gelu(hidden, approximate=False)
  expected = hidden @ params['linear_2']['kernel'] + params['linear_2']['bias']
  np.testing.assert_allclose(out[:, 0], expected, rtol=1e-5, atol=1e-5)
