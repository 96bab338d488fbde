"""vit_jax.analysis against hand computations and numpy references."""

import json
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import models
from vit_jax.analysis import attention
from vit_jax.analysis import embeddings
from vit_jax.analysis import figures
from vit_jax.analysis import paper_figures
from vit_jax.convert import transform

ROOT = helpers.ROOT
# One worker runs the tests of `cli`'s process, so that it starts once.
pytestmark = pytest.mark.xdist_group('analysis_cli')


def _testing_model(**kw):
  """The one-layer, two-head `testing` ViT (16 px patches), no dropout."""
  model = models.get_model('testing', num_classes=3, **kw)
  images = np.random.default_rng(1).normal(0, .5, (2, 32, 32, 3))
  return model, helpers.random_params(model, images[:1], train=False), images


# Mean attention distance.


def test_identity_attention_has_zero_distance():
  weights = np.broadcast_to(np.eye(5), (2, 3, 4, 5, 5))  # class token + 2x2
  distance = attention.mean_attention_distance(weights, (2, 2), (16, 16))
  np.testing.assert_allclose(distance, np.zeros((2, 4)))


def test_uniform_attention_distance_closed_form():
  # A 1x3 row of 2x5 px patches: centres 5 px apart; of the 9 ordered
  # pairs, 3 are 0, 4 are 5 and 2 are 10 px apart.
  weights = np.full((1, 1, 1, 3, 3), 1 / 3)
  distance = attention.mean_attention_distance(weights, (1, 3), (2, 5),
                                               prefix=0)
  np.testing.assert_allclose(distance, [[(4 * 5 + 2 * 10) / 9]])
  # A 2x2 grid of 1 px patches: 8 ordered pairs at 1, 4 at sqrt(2).
  weights = np.full((1, 1, 1, 4, 4), 1 / 4)
  distance = attention.mean_attention_distance(weights, (2, 2), (1, 1),
                                               prefix=0)
  np.testing.assert_allclose(distance, [[(8 + 4 * np.sqrt(2)) / 16]])


def test_class_token_left_out_not_renormalized():
  # Half of each patch query's weight on the class token, half on the
  # farthest patch of a 1x2 grid (10 px apart): 0.5 * 10.
  weights = np.array([[1., 0, 0], [.5, 0, .5], [.5, .5, 0]])[None, None,
                                                             None]
  distance = attention.mean_attention_distance(weights, (1, 2), (10, 10))
  np.testing.assert_allclose(distance, [[5.]])


def test_distance_rejects_mismatched_grid():
  with pytest.raises(ValueError, match='grid'):
    attention.mean_attention_distance(np.ones((1, 1, 1, 5, 5)), (3, 3),
                                      (1, 1))


# Recorded weights.


def _numpy_attention(y, mha):
  """(softmax(q k^T / sqrt(d)) per head, the attention's output) of the
  LayerNorm'd tokens `y`, from the parameters."""
  q, k, v = (np.einsum('btd,dhk->bhtk', y, mha[n]['kernel']) +
             mha[n]['bias'][None, :, None] for n in ('query', 'key', 'value'))
  logits = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = weights @ v  # (batch, heads, tokens, depth)
  out = np.einsum('bhtk,hkd->btd', heads, mha['out']['kernel'])
  return weights, out + mha['out']['bias']


@pytest.mark.parametrize('scan', [False, True])
def test_recorded_weights_match_numpy_attention(scan):
  model, params, images = _testing_model()
  block = params['Transformer']['encoderblock_0']
  if scan:  # the same parameters, stacked
    model = models.get_model('testing', num_classes=3, transformer=dict(
        models.MODEL_CONFIGS['testing'].transformer, scan=True))
    params = files.scan_like(params, helpers.param_shapes(
        model, images[:1], train=False))
  weights = attention.attention_weights(model, params, images)

  x = helpers.patch_embed(images, params['embedding'], 16)
  cls = np.broadcast_to(params['cls'], (2, 1, 10))
  x = np.concatenate([cls, x], 1) + params['Transformer']['posembed_input'][
      'pos_embedding']
  expected, _ = _numpy_attention(helpers.layernorm(x, block['LayerNorm_0']),
                                 block['MultiHeadDotProductAttention_0'])
  assert weights.shape == (1, 2, 2, 5, 5)
  np.testing.assert_allclose(weights[0], expected, rtol=1e-4, atol=1e-6)


def test_zero_queries_give_uniform_attention_distance():
  model, params, images = _testing_model()
  mha = params['Transformer']['encoderblock_0'][
      'MultiHeadDotProductAttention_0']
  mha['query'] = {k: np.zeros_like(v) for k, v in mha['query'].items()}
  weights = attention.attention_weights(model, params, images)
  distance = attention.mean_attention_distance(weights, (2, 2), (16, 16))
  # Each patch query keeps 4/5 of its weight on the 4 patches; the 16
  # ordered pairs of the 2x2 grid: 8 at 16 px, 4 at 16 sqrt(2) px.
  pairwise = (8 * 16 + 4 * 16 * np.sqrt(2)) / 16
  np.testing.assert_allclose(distance, np.full((1, 2), 4 / 5 * pairwise),
                             rtol=1e-5)
  assert paper_figures.uniform_distance((2, 2), (16, 16)) == pytest.approx(
      4 / 5 * pairwise)
  # Rollout of that one layer: (uniform + I) / 2, the class token's row.
  np.testing.assert_allclose(attention.rollout(weights), np.full((2, 4), .1),
                             rtol=1e-5)


# Rollout.


def test_rollout_one_layer_by_hand():
  head0 = np.array([[.5, .5, 0], [0, 1, 0], [.2, .2, .6]])
  head1 = np.array([[.1, .3, .6], [1, 0, 0], [0, 0, 1]])
  weights = np.stack([head0, head1])[None, None]
  # Mean of the heads: row 0 = [.3, .4, .3]; plus I: [1.3, .4, .3], sum 2.
  np.testing.assert_allclose(attention.rollout(weights), [[.2, .15]])
  # Without a class token: the mean of all rows of (mean + I) / 2.
  # Rows: [1.3, .4, .3]/2, [.5, 1.5, 0]/2, [.1, .1, 1.8]/2.
  np.testing.assert_allclose(attention.rollout(weights, prefix=0),
                             [[1.9 / 6, 2 / 6, 2.1 / 6]])


def test_rollout_multiplies_later_layers_on_the_left():
  first = np.array([[0., 1], [0, 1]])  # the class token reads token 1
  identity = np.eye(2)
  weights = np.stack([first, identity])[:, None, None]
  # Layer 1: [[.5, .5], [0, 1]]; layer 2: I; product row 0: [.5, .5].
  np.testing.assert_allclose(attention.rollout(weights), [[.5]])
  weights = np.stack([identity, first])[:, None, None]
  np.testing.assert_allclose(attention.rollout(weights), [[.5]])
  three = np.array([[0., 1, 0], [0, 0, 1], [0, 0, 1]])
  weights = np.stack([three, three])[:, None, None]
  # M = (A + I) / 2 = [[.5, .5, 0], [0, .5, .5], [0, 0, 1]]; M @ M row 0.
  np.testing.assert_allclose(attention.rollout(weights), [[.5, .25]])


def test_rollout_maps_upsample_to_the_image():
  weights = np.broadcast_to(np.eye(5), (1, 2, 1, 5, 5))
  maps = attention.rollout_maps(weights, (2, 2), (32, 32))
  assert maps.shape == (2, 32, 32)
  np.testing.assert_array_equal(maps, 0)  # the class token reads only itself
  weights = np.zeros((1, 1, 1, 5, 5))
  weights[..., 4] = 1.  # every token reads the last patch
  maps = attention.rollout_maps(weights, (2, 2), (2, 2))
  np.testing.assert_allclose(maps[0], [[0, 0], [0, 1]], atol=1e-6)


# The class token's last-layer attention (DINO, Caron et al., 2021).


def _numpy_last_layer_attention(images, p, patch):
  """The last block's attention, from the parameters: tokens [class,
  distillation, registers, patches] plus the position table, through the
  blocks before it (x + MSA(LN(x)), then x + MLP(LN(x)))."""
  x = helpers.patch_embed(images, p['embedding'], patch)
  n, _, d = x.shape
  prefix = [np.broadcast_to(p[name], (n, p[name].shape[1], d))
            for name in ('cls', 'dist', 'reg') if name in p]
  t = p['Transformer']
  x = np.concatenate(prefix + [x], 1) + t['posembed_input']['pos_embedding']
  blocks = []
  while f'encoderblock_{len(blocks)}' in t:
    blocks.append(t[f'encoderblock_{len(blocks)}'])
  for b in blocks[:-1]:
    x = x + _numpy_attention(helpers.layernorm(x, b['LayerNorm_0']),
                             b['MultiHeadDotProductAttention_0'])[1]
    x = x + helpers.mlp(helpers.layernorm(x, b['LayerNorm_1']),
                        b['MlpBlock_0'])
  return _numpy_attention(helpers.layernorm(x, blocks[-1]['LayerNorm_0']),
                          blocks[-1]['MultiHeadDotProductAttention_0'])[0]


def _dino_threshold(attentions, threshold):
  """DINO's `visualize_attention.py`, in numpy: (heads, patches) to the
  patches that hold `threshold` of each head's mass."""
  idx = np.argsort(attentions, axis=1)
  val = np.take_along_axis(attentions, idx, axis=1)
  val = val / np.sum(val, axis=1, keepdims=True)
  th_attn = np.cumsum(val, axis=1) > (1 - threshold)
  idx2 = np.argsort(idx, axis=1)
  return np.stack([th_attn[h][idx2[h]] for h in range(len(attentions))])


@pytest.mark.parametrize('classifier,registers,prefix', [
    ('token', 0, 1), ('token', 2, 3), ('distilled', 1, 3)])
def test_class_token_maps_match_numpy(classifier, registers, prefix):
  # Two layers, so that the last is not the first; a 2x3 grid, so that
  # rows and columns cannot be swapped unseen.
  model = models.get_model(
      'testing', num_classes=3, classifier=classifier,
      num_registers=registers, transformer=dict(
          models.MODEL_CONFIGS['testing'].transformer, num_layers=2))
  images = np.random.default_rng(2).normal(0, .5, (2, 32, 48, 3))
  params = helpers.random_params(model, images[:1], train=False)
  weights = attention.attention_weights(model, params, images)
  config = {'classifier': classifier, 'num_registers': registers}
  maps = attention.class_token_maps(weights, (2, 3), (32, 48), config)

  last = _numpy_last_layer_attention(images.astype(np.float64), params, 16)
  row = last[:, :, 0, prefix:]  # the class token's, over the patches
  assert row.shape == (2, 2, 6)
  expected = np.repeat(np.repeat(row.reshape(2, 2, 2, 3), 16, 2), 16, 3)
  assert maps.shape == (2, 2, 32, 48)
  np.testing.assert_allclose(maps, expected, rtol=1e-4, atol=1e-6)

  masks = attention.class_token_masks(weights, (2, 3), (32, 48), config,
                                      threshold=.6)
  kept = np.stack([_dino_threshold(r, .6) for r in row])
  np.testing.assert_array_equal(
      masks, np.repeat(np.repeat(kept.reshape(2, 2, 2, 3), 16, 2), 16, 3))


@pytest.mark.parametrize('config,prefix', [
    ({'classifier': 'token'}, 1),
    ({'classifier': 'token', 'num_registers': 2}, 3),
    ({'classifier': 'distilled'}, 2),
    ({'classifier': 'token_gap', 'num_registers': 1}, 2)])
def test_class_token_attention_skips_the_prefix(config, prefix):
  # The class token's row puts its largest weights on the prefix tokens:
  # none of them may reach the 1x2 grid.
  row = np.zeros(prefix + 2)
  row[:prefix] = .4 / prefix
  row[prefix:] = [.25, .35]
  weights = np.zeros((2, 1, 1, prefix + 2, prefix + 2))
  weights[-1, 0, 0, 0] = row
  weights[0, 0, 0, 0, -1] = 1.  # the first layer's must not be used
  np.testing.assert_allclose(
      attention.class_token_attention(weights, config), [[[.25, .35]]])
  maps = attention.class_token_maps(weights, (1, 2), (2, 4), config)
  np.testing.assert_allclose(maps[0, 0], [[.25] * 2 + [.35] * 2] * 2)


@pytest.mark.parametrize('classifier', ['gap', 'map', 'unpooled'])
def test_no_class_token_is_refused(classifier):
  weights = np.full((1, 1, 1, 6, 6), 1 / 6)
  for registers in (0, 2):  # registers alone are no class token
    with pytest.raises(ValueError, match=f"'{classifier}' classifier has no "
                       'class token'):
      attention.class_token_maps(weights, (2, 2), (4, 4), {
          'classifier': classifier, 'num_registers': registers})


def test_mass_mask_by_hand_and_as_dino():
  # Ascending 0.1, 0.15, 0.25, 0.5; cumulative 0.1, 0.25, 0.5, 1 > 0.4:
  # 0.25 and 0.5 (together 0.75) are kept.
  np.testing.assert_array_equal(
      attention.mass_mask([.1, .5, .15, .25], .6), [False, True, False, True])
  np.testing.assert_array_equal(  # unnormalized: the same
      attention.mass_mask([[2., 10, 3, 5]], .6), [[False, True, False, True]])
  attentions = np.random.default_rng(3).dirichlet(np.ones(20), size=(3, 4))
  for threshold in (.3, .6, .9):
    expected = np.stack([_dino_threshold(a, threshold) for a in attentions])
    np.testing.assert_array_equal(attention.mass_mask(attentions, threshold),
                                  expected)


def test_upsample_nearest_as_repeat():
  maps = np.arange(12.).reshape(2, 2, 3)
  np.testing.assert_array_equal(attention.upsample_nearest(maps, (4, 9)),
                                maps.repeat(2, 1).repeat(3, 2))


# Embeddings.


def test_position_similarity_of_a_known_embedding():
  table = np.array([[[9., 9], [1, 0], [0, 2], [3, 3], [-1, 0]]])
  params = {'Transformer': {'posembed_input': {'pos_embedding': table}}}
  e = embeddings.patch_position_embeddings(params, (2, 2))
  similarity = embeddings.position_similarity(e, (2, 2))
  r = 1 / np.sqrt(2)
  np.testing.assert_allclose(similarity[0, 0], [[1, 0], [r, -1]], atol=1e-12)
  np.testing.assert_allclose(similarity[1, 0], [[r, r], [1, -r]], atol=1e-12)
  assert similarity.shape == (2, 2, 2, 2)


def test_learn2d_embeddings_concatenate_row_and_column():
  row = np.array([[[1., 0], [0, 1]]])
  col = np.array([[[5.], [6], [7]]])
  params = {'Transformer': {'posembed_input': {
      'pos_embedding_row': row, 'pos_embedding_col': col}}}
  e = embeddings.patch_position_embeddings(params, (2, 3), 'learn2d')
  np.testing.assert_array_equal(e[4], [0, 1, 6])  # patch (1, 1)
  with pytest.raises(ValueError, match='relative'):
    embeddings.patch_position_embeddings(params, (2, 3), 'relative')


def test_filter_components_recover_the_directions():
  u = np.zeros(8)
  u[[0, 1]] = [1, -1]  # pixel 0: channel 0 minus channel 1
  u /= np.linalg.norm(u)
  v = np.zeros(8)
  v[[2, 4, 6]] = [-3, 1, 1]  # pixels 1, 2, 3, channel 0
  v /= np.linalg.norm(v)
  a = np.array([3., -3, 3, -3])  # zero-mean, orthogonal coefficients
  b = np.array([1., 1, -1, -1])
  filters = a[:, None] * u + b[:, None] * v + 0.5
  kernel = filters.T.reshape(2, 2, 2, 4)
  components, variance = embeddings.filter_components(kernel, count=2)
  np.testing.assert_allclose(variance, [.9, .1])
  np.testing.assert_allclose(components[0].ravel(), u, atol=1e-12)
  np.testing.assert_allclose(components[1].ravel(), -v, atol=1e-12)
  # Gray: summed over the channels, u cancels; v alone is left.
  components, variance = embeddings.filter_components(kernel, count=1,
                                                      gray=True)
  assert components.shape == (1, 2, 2, 1)
  np.testing.assert_allclose(variance, [1.])
  np.testing.assert_allclose(components[0].ravel(),
                             np.array([0, 3, -1, -1]) / np.sqrt(11),
                             atol=1e-12)


# The figures and the command line.


def test_analyze_and_write(tmp_path):
  model, params, images = _testing_model()
  results = paper_figures.analyze(model, params, images)
  paths = paper_figures.write(results, str(tmp_path))
  assert [os.path.basename(p) for p in paths] == [
      f'{name}.png' for name in paper_figures.FIGURES]
  with open(tmp_path / 'analysis.json') as f:
    summary = json.load(f)
  assert np.array(summary['mean_attention_distance']).shape == (1, 2)
  assert results['filters'].shape == (10, 16, 16, 3)


def test_analyze_skips_class_token_attention_without_a_class_token(tmp_path):
  model, params, images = _testing_model(classifier='gap')
  results = paper_figures.analyze(model, params, images)
  assert "'gap' classifier has no class token" in results['skipped'][
      'class_token_attention']
  paths = paper_figures.write(results, str(tmp_path))
  assert 'class_token_attention.png' not in os.listdir(tmp_path)
  assert len(paths) == len(paper_figures.FIGURES) - 1
  with open(tmp_path / 'analysis.json') as f:
    assert 'class_token_attention' in json.load(f)['skipped']


def test_analyze_a_registers_model_without_prefix_positions(tmp_path):
  # DINOv2 with 4 registers: 5 prefix tokens, none in the position table.
  model = models.get_model('DINOv2-testing-reg4', num_classes=3)
  images = np.random.default_rng(1).normal(0, .5, (2, 28, 28, 3))
  params = helpers.random_params(model, images[:1], train=False)
  results = paper_figures.analyze(model, params, images)
  weights = attention.attention_weights(model, params, images)
  assert weights.shape[-1] == 5 + 4
  np.testing.assert_array_equal(
      results['class_token_maps'],
      weights[-1, :, :, 0, 5:].reshape(2, -1, 2, 2).repeat(14, 2).repeat(
          14, 3))
  table = params['Transformer']['posembed_input']['pos_embedding'][0]
  assert table.shape[0] == 4  # the patches' alone
  np.testing.assert_allclose(results['position_similarity'],
                             embeddings.position_similarity(table, (2, 2)))
  paper_figures.write(results, str(tmp_path))
  assert os.path.exists(tmp_path / 'class_token_attention.png')


def test_class_token_figure_has_a_row_per_image():
  images = np.ones((2, 4, 4, 3))
  maps = np.random.default_rng(0).uniform(size=(2, 3, 4, 4))
  fig = figures.class_token_attention(images, maps)
  axes = np.array(fig.axes).reshape(2, 4)  # the input, then 3 heads
  assert [ax.get_title(loc='left') for ax in axes[0]] == [
      'input', 'head 1', 'head 2', 'head 3']
  for k in range(2):
    np.testing.assert_array_equal(axes[k, 0].get_images()[0].get_array(),
                                  images[k])
    for h in range(3):  # each head scaled to its own maximum
      shown = axes[k, h + 1].get_images()[0].get_array()
      np.testing.assert_allclose(shown, maps[k, h] / maps[k, h].max())
  plt.close(fig)


def test_distance_plot_shows_every_dot_whole():
  # Close values, as in practice: autoscaling's 5% margins of their
  # range are then too thin for the dots.
  distance = np.array([[13.1, 13.4], [13.3, 12.9], [13.2, 13.0]])
  for uniform in (13.2, 13.5):
    fig = figures.attention_distance(distance, uniform)
    ax = fig.axes[0]
    fig.canvas.draw()
    # A dot's radius in pixels: its area is in points^2.
    radius = np.sqrt(figures.MARKER_AREA) / 2 * fig.dpi / 72
    box = ax.get_window_extent()
    layers = np.repeat(np.arange(1, 4), 2)
    dots = ax.transData.transform(np.stack([layers, distance.ravel()], 1))
    assert np.all(dots[:, 1] + radius <= box.y1)
    assert np.all(dots[:, 1] - radius >= box.y0)
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > uniform
    assert [t.get_text() for t in ax.get_xticklabels()] == ['1', '2', '3']
    plt.close(fig)


def test_rollout_figure_shows_each_map_alone():
  images = np.ones((2, 4, 4, 3))  # white: an overlay alone would wash out
  maps = np.random.default_rng(0).uniform(size=(2, 4, 4))
  fig = figures.rollout(images, maps)
  assert len(fig.axes) == 6  # input, map, overlay for each image
  for k in range(2):
    shown = fig.axes[2 + k].get_images()  # the second row
    np.testing.assert_array_equal(shown[0].get_array(), maps[k])
    under = fig.axes[4 + k].get_images()[0].get_array()
    assert np.max(under) < 1  # the image is darkened under the overlay
  plt.close(fig)


def test_similarity_matrix_has_a_colorbar():
  fig = figures.similarity_matrix(np.eye(3)[:2], ['a', 'b', 'c'], ['a', 'b'])
  labels = [ax.get_label() for ax in fig.axes]
  assert labels.count('<colorbar>') == 1 and len(labels) == 2
  plt.close(fig)


def test_figures_module_keeps_the_callers_backend():
  # A notebook's inline backend must survive the import; 'svg' stands in.
  code = ('import matplotlib; matplotlib.use("svg"); '
          'from vit_jax.analysis import figures; '
          'print(matplotlib.get_backend())')
  out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT),
                       check=True)
  assert out.stdout.strip() == 'svg'


@pytest.fixture(scope='module')
def cli(tmp_path_factory):
  """{name: (exit code, stdout, stderr, its folder)} of the command lines
  below, in one process (`helpers.cli_runs`) whose matplotlib backend
  cannot load: the command must choose its own (Agg)."""
  dirs = {name: tmp_path_factory.mktemp(name)
          for name in ('testing', 'unpooled', 'prepared')}
  _, params, _ = _testing_model()
  for name in ('testing', 'prepared'):
    files.save(params, dirs[name] / 'testing.npz')
  transform.save_transform(dirs['prepared'] / 'testing.npz', {
      'input_size': [3, 32, 32], 'crop_pct': 0.5, 'interpolation': 'bicubic',
      'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]})
  model = models.get_model('testing-unpooled', num_classes=3)
  params = helpers.random_params(model, np.zeros((1, 32, 32, 3)),
                                 train=False)
  files.save(params, dirs['unpooled'] / 'unpooled.npz')
  analysis = lambda name, npz, *args: ('vit_jax.analysis', [
      f'--model_name={name}', f'--checkpoint={dirs[npz[0]] / npz[1]}',
      f'--out={dirs[npz[0]]}', *args])
  runs = {
      'testing': analysis('testing', ('testing', 'testing.npz'),
                          '--num_images=3'),
      'nope': analysis('nope', ('testing', 'testing.npz')),
      'unpooled': analysis('testing-unpooled', ('unpooled', 'unpooled.npz'),
                           '--num_images=2'),
      'prepared': analysis('testing', ('prepared', 'testing.npz'),
                           '--crop_pct=0.8',
                           os.path.join(ROOT, 'tests/data/predict_image.jpg')),
  }
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             MPLBACKEND='module://no_such_backend')
  results = helpers.cli_runs(runs.values(), env=env)
  return {name: (r['code'], r['stdout'], r['stderr'],
                 dirs['testing' if name == 'nope' else name])
          for name, r in zip(runs, results)}


def test_command_line(cli):
  code, stdout, stderr, tmp_path = cli['testing']
  assert code == 0, stderr
  assert '3 Gaussian noise images' in stdout
  # Layers from 1, as in the figure; the testing model has one.
  assert 'layer 1: mean attention distance' in stdout
  assert 'layer 0' not in stdout and 'layer 2' not in stdout
  with open(tmp_path / 'analysis.json') as f:
    summary = json.load(f)
  assert summary['patch_pixels'] == [16, 16]
  assert summary['grid'] == [2, 2]  # the image side from the position table
  assert len(summary['figures']) == 5
  assert 'class_token_attention.png' in summary['figures']
  assert os.path.exists(tmp_path / 'class_token_attention.png')
  assert 'skipped' not in summary
  code, _, stderr, _ = cli['nope']
  assert code != 0 and "Unknown model preset 'nope'" in stderr


def test_command_line_skips_class_token_attention_with_a_note(cli):
  code, stdout, stderr, tmp_path = cli['unpooled']
  assert code == 0, stderr
  assert ("No class_token_attention.png: The 'unpooled' classifier has no "
          'class token') in stdout
  assert os.path.exists(tmp_path / 'rollout.png')
  assert not os.path.exists(tmp_path / 'class_token_attention.png')


def test_command_line_prepares_images_as_predict(cli):
  """Image files go through the checkpoint's recorded transform and the
  flags, as in `predict`, and the choice is said on stderr."""
  code, stdout, stderr, _ = cli['prepared']
  assert code == 0, stderr
  assert 'the 1 image files given' in stdout
  assert ('Preprocessing: resize short side to 40 (bicubic), center crop 32, '
          'mean (0.485, 0.456, 0.406)') in stderr
  assert '[from testing.transform.json; --crop_pct given]' in stderr
