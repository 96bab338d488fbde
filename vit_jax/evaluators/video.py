"""Video classification with several views per test clip (ViViT's test).

Each test clip gives `views` windows spaced evenly in time
(`data.video.test_offsets`); the model classifies each, and the clip's
scores are the mean of its views' logits, as Scenic's ViViT tests by default
(`average='probabilities'`: the log of the mean softmax, its other option).
Accuracy and loss are those of the averaged scores, over every clip.
"""

import functools

from clu import metrics as clu_metrics
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.data import pipeline
from vit_jax.data import video as video_data
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.platform import sharding

AVERAGES = ('logits', 'probabilities')


def view_scores(logits, average: str):
  """(B, V, K) logits of each view -> (B, K) scores of each clip."""
  if average == 'logits':
    return logits.mean(1)
  # log of the mean probability: softmax cross-entropy of the average.
  return jax.nn.logsumexp(jax.nn.log_softmax(logits), 1) - jnp.log(
      logits.shape[1])


def eval_step(params, batch, *, apply_fn, loss: str, average: str):
  """Masked clu averages of correctness and loss of the clips' scores."""
  clips = batch['video']  # (B, views, frames, H, W, 3)
  logits = apply_fn({'params': params}, clips.reshape((-1,) + clips.shape[2:]),
                    train=False)
  scores = view_scores(logits.reshape(clips.shape[:2] + logits.shape[1:]),
                       average)
  labels = batch['label']
  correct = jnp.take_along_axis(
      labels, jnp.argmax(scores, -1)[:, None], -1)[:, 0] > 0
  return {'accuracy': common.masked_average(correct, batch['mask']),
          'loss': common.masked_average(
              losses.classification(scores, labels, loss), batch['mask'])}


@registry.register('video_classification')
class Evaluator(common.Evaluator):
  """`type='video_classification'`: settings `dataset` and `split`
  (default: the run's dataset and `pp.test`), `views` (default
  `config.video.test_views`), `average` ('logits' or 'probabilities');
  metrics `accuracy`, `loss`, `count`."""

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    data = config.copy_and_resolve_references().unlock()
    data.dataset = settings.get('dataset') or config.dataset
    data.pp.train = data.pp.test = settings.get('split') or config.pp.test
    self.info = video_data.dataset_info(pipeline.get_builder(data), data)
    self.data, self.mesh = data, mesh
    frames, stride = video_data.window(self.info, data)
    self.views = settings.get('views')
    if self.views is None:
      self.views = data.video.test_views
    average = settings.get('average') or 'logits'
    if average not in AVERAGES:
      raise ValueError(f'config.evals.{name}.average={average!r}; expected '
                       f'one of {AVERAGES}.')
    if average == 'probabilities' and config.loss != 'softmax_xent':
      raise ValueError(f"config.evals.{name}.average='probabilities' scores "
                       f"a softmax; config.loss is {config.loss!r}.")
    if self.info.num_classes != model.num_classes:
      raise common.HeadMismatch(
          f'config.evals.{name}: the test data has {self.info.num_classes} '
          f'classes; the model has a head of {model.num_classes}.')
    # Fails now, not after training.
    video_data.test_offsets(video_data.clip_length(self.info), frames, stride,
                            self.views)
    self.step = jax.jit(functools.partial(
        eval_step, apply_fn=model.apply, loss=config.loss, average=average))

  def __call__(self, params):
    host = video_data.eval_batches(
        self.info, self.data, views=self.views,
        batch_size=pipeline.host_batch_size(self.data.batch_eval))
    totals = None
    for batch in sharding.global_batches(host, self.mesh,
                                         self.data.batch_eval):
      out = self.step(params, batch)
      totals = out if totals is None else jax.tree.map(
          lambda a, b: a.merge(b), totals, out,
          is_leaf=lambda x: isinstance(x, clu_metrics.Metric))
    totals = jax.device_get(totals)
    metrics = {k: float(v.compute()) for k, v in totals.items()}
    metrics['count'] = int(totals['accuracy'].count)
    return metrics

  def summary(self, metrics):
    return (f'test accuracy ({self.views} views) {metrics["accuracy"]:.4f}  '
            f'loss {metrics["loss"]:.4f}  ({metrics["count"]} clips)')

  def scalars(self, metrics):
    return {'eval_accuracy': metrics['accuracy'],
            'eval_loss': metrics['loss']}
