"""Multi-view video classification: a stand-in model's accuracy and loss
against numpy's, from the stored clips, the views and the averages worked
out by hand."""

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

from vit_jax.data import local_datasets
from vit_jax.data import pipeline
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.platform import sharding

FRAMES, STRIDE, CLASSES = 3, 2, 10


class FrameMeans(nn.Module):
  """Logits: each frame's mean pixel less the window's, weighed per frame
  and class (the item's share of a frame changes as it leaves it)."""
  num_classes: int = CLASSES

  @nn.compact
  def __call__(self, video, *, train):
    del train
    w = self.param('w', nn.initializers.zeros, (FRAMES, self.num_classes))
    means = video.mean((2, 3, 4))
    return jnp.einsum('bt,tk->bk', means - means.mean(1, keepdims=True), w)


@pytest.fixture
def config(tiny_config, tmp_path, monkeypatch):
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TRAIN', 8)
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TEST', 11)
  tiny_config.tfds_data_dir = str(tmp_path)
  tiny_config.dataset = 'moving_fashion_mnist/frames8_size32'
  tiny_config.pp.crop = 32  # the frames as they are
  tiny_config.video = ml_collections.ConfigDict(dict(
      frames=FRAMES, stride=STRIDE, test_views=3))
  return tiny_config


def _expected(config, w, offsets, average):
  """Accuracy, loss and the per-view predictions, in numpy."""
  builder = pipeline.get_builder(config)
  clips, labels = zip(*((ex['video'], ex['label']) for ex in tfds.as_numpy(
      builder.as_dataset(split='test'))))
  pixels = np.asarray(clips, np.float64) / 127.5 - 1  # (N, 8, 32, 32, 1)
  means = pixels.mean((2, 3, 4))  # 3 equal channels: the gray mean
  windows = np.array(offsets)[:, None] + STRIDE * np.arange(FRAMES)
  means = means[:, windows]  # (N, views, frames)
  logits = (means - means.mean(-1, keepdims=True)) @ w
  if average == 'logits':
    scores = logits.mean(1)
  else:
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    scores = np.log(probs.mean(1))
  labels = np.array(labels)
  log_probs = scores - np.log(np.exp(scores).sum(-1, keepdims=True))
  loss = -log_probs[np.arange(len(labels)), labels]
  return (np.mean(scores.argmax(-1) == labels), loss.mean(),
          logits.argmax(-1))


@pytest.mark.parametrize('views,offsets,average', [
    # A window spans 5 of 8 frames: starts 0..3, evenly (1.5 rounds to 2).
    (3, [0, 2, 3], 'logits'), (3, [0, 2, 3], 'probabilities'),
    (1, [1], 'logits')])  # the centre one (3 // 2)
def test_views_averaged(config, views, offsets, average):
  w = np.random.default_rng(0).normal(0, 100, (FRAMES, CLASSES))
  settings = ml_collections.ConfigDict(dict(
      type='video_classification', every=0, views=views, average=average))
  evaluator = registry.build(
      'video_classification', 'video', settings, config=config,
      model=FrameMeans(), mesh=sharding.make_mesh(config.mesh))
  metrics = evaluator({'w': jnp.asarray(w, jnp.float32)})
  accuracy, loss, per_view = _expected(config, w, offsets, average)
  assert metrics['count'] == 11  # 2 batches of 8, 5 of them padding
  np.testing.assert_allclose(metrics['accuracy'], accuracy, atol=1e-6)
  np.testing.assert_allclose(metrics['loss'], loss, rtol=1e-4)
  if views > 1:  # the views disagree: which of them counts matters
    assert (per_view != per_view[:, :1]).any()
  assert f'({views} views)' in evaluator.summary(metrics)


def test_settings_refused(config):
  mesh = sharding.make_mesh(config.mesh)
  build = lambda model=FrameMeans(), **kw: registry.build(
      'video_classification', 'video', ml_collections.ConfigDict(
          dict(type='video_classification', every=0, **kw)),
      config=config, model=model, mesh=mesh)
  with pytest.raises(ValueError, match="average='mean'; expected one of"):
    build(average='mean')
  with pytest.raises(common.HeadMismatch, match='10 classes; the model has '
                     'a head of 5'):
    build(FrameMeans(num_classes=5))
  with pytest.raises(ValueError, match='spans 9 frames; the clips have 8'):
    config.video.stride = 4
    build()
