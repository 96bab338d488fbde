"""vit_jax.analysis against hand computations and numpy references."""

import json
import os
import subprocess
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

import helpers
from vit_jax import checkpoint
from vit_jax import models
from vit_jax.analysis import attention
from vit_jax.analysis import embeddings
from vit_jax.analysis import figures
from vit_jax.analysis import paper_figures
from vit_jax.convert import transform as preprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.parametrize('scan', [False, True])
def test_recorded_weights_match_numpy_attention(scan):
  model, params, images = _testing_model()
  block = params['Transformer']['encoderblock_0']
  if scan:  # the same parameters, stacked
    model = models.get_model('testing', num_classes=3, transformer=dict(
        models.MODEL_CONFIGS['testing'].transformer, scan=True))
    params = checkpoint.scan_like(params, helpers.param_shapes(
        model, images[:1], train=False))
  weights = attention.attention_weights(model, params, images)

  x = helpers.patch_embed(images, params['embedding'], 16)
  cls = np.broadcast_to(params['cls'], (2, 1, 10))
  x = np.concatenate([cls, x], 1) + params['Transformer']['posembed_input'][
      'pos_embedding']
  y = helpers.layernorm(x, block['LayerNorm_0'])
  mha = block['MultiHeadDotProductAttention_0']
  q = np.einsum('btd,dhk->bhtk', y, mha['query']['kernel']) + mha['query'][
      'bias'][None, :, None]
  k = np.einsum('btd,dhk->bhtk', y, mha['key']['kernel']) + mha['key'][
      'bias'][None, :, None]
  logits = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
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


def test_command_line(tmp_path):
  model, params, _ = _testing_model()
  checkpoint.save(params, tmp_path / 'testing.npz')
  # A backend that cannot load: the command must choose its own (Agg).
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu',
             MPLBACKEND='module://no_such_backend')
  out = subprocess.run(
      [sys.executable, '-m', 'vit_jax.analysis', '--model_name=testing',
       f'--checkpoint={tmp_path / "testing.npz"}', f'--out={tmp_path}',
       '--num_images=3'], capture_output=True, text=True, env=env, check=True)
  assert '3 Gaussian noise images' in out.stdout
  # Layers from 1, as in the figure; the testing model has one.
  assert 'layer 1: mean attention distance' in out.stdout
  assert 'layer 0' not in out.stdout and 'layer 2' not in out.stdout
  with open(tmp_path / 'analysis.json') as f:
    summary = json.load(f)
  assert summary['patch_pixels'] == [16, 16]
  assert summary['grid'] == [2, 2]  # the image side from the position table
  assert len(summary['figures']) == 4
  bad = subprocess.run(
      [sys.executable, '-m', 'vit_jax.analysis', '--model_name=nope',
       f'--checkpoint={tmp_path / "testing.npz"}', f'--out={tmp_path}'],
      capture_output=True, text=True, env=env)
  assert bad.returncode != 0 and "Unknown model preset 'nope'" in bad.stderr


def test_command_line_prepares_images_as_predict(tmp_path):
  """Image files go through the checkpoint's recorded transform and the
  flags, as in `predict`, and the choice is said on stderr."""
  _, params, _ = _testing_model()
  checkpoint.save(params, tmp_path / 'testing.npz')
  preprocess.save_transform(tmp_path / 'testing.npz', {
      'input_size': [3, 32, 32], 'crop_pct': 0.5, 'interpolation': 'bicubic',
      'mean': [0.485, 0.456, 0.406], 'std': [0.229, 0.224, 0.225]})
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  out = subprocess.run(
      [sys.executable, '-m', 'vit_jax.analysis', '--model_name=testing',
       f'--checkpoint={tmp_path / "testing.npz"}', f'--out={tmp_path}',
       '--crop_pct=0.8', os.path.join(ROOT, 'tests/data/predict_image.jpg')],
      capture_output=True, text=True, env=env, check=True)
  assert 'the 1 image files given' in out.stdout
  assert ('Preprocessing: resize short side to 40 (bicubic), center crop 32, '
          'mean (0.485, 0.456, 0.406)') in out.stderr
  assert '[from testing.transform.json; --crop_pct given]' in out.stderr
