"""What every evaluator shares: its data, and masked means over a split.

An evaluator is built once from its entry in `config.evals` (`type`,
`every` and its own settings) and called with parameters; it returns a
flat dict of metrics, says them in one line (`summary`) and names its
TensorBoard scalars (`scalars`). `every`: evaluate every that many steps
and at the end of training; 0: at the end only; None: never in training,
only when a checkpoint is evaluated by type (`trainer='fewshot'`,
`'zeroshot'`; `'evaluate'` runs those training runs).
"""

from clu import metrics as clu_metrics
import jax
from jax.experimental import multihost_utils
import numpy as np

from vit_jax.data import pipeline
from vit_jax.data import video as video_data
from vit_jax.platform import sharding


class Evaluator:
  """The interface: `every`, `__call__(params) -> metrics`, `summary`,
  `scalars`; `headline`: its summary ends the run's last line; `features`:
  it evaluates the model's features, so needs no head; `in_config`:
  `config.evals` can name it (else a task builds it, `registry.build`)."""

  headline = True
  features = False
  in_config = True

  def __init__(self, name, settings):
    self.name = name
    self.every = settings.get('every')
    if self.every is not None and self.every < 0:
      raise ValueError(f'config.evals.{name}.every={self.every}: expected a '
                       'number of steps >= 0, or None.')

  def __call__(self, params):
    raise NotImplementedError

  def summary(self, metrics) -> str:
    raise NotImplementedError

  def scalars(self, metrics) -> dict:
    return {k: v for k, v in metrics.items() if isinstance(v, float)}


class HeadMismatch(ValueError):
  """The model's head does not classify the evaluator's data."""


def split_data(config, dataset, split, label=None):
  """(DatasetInfo, config) reading `split` of `dataset` (default: the run's)
  as the test split, checked now; `label`: its `pp.label` (default the
  run's; '' for another dataset's feature 'label')."""
  data = config.copy_and_resolve_references().unlock()
  data.dataset = dataset or config.dataset
  data.pp.train = data.pp.test = split or config.pp.test
  if label is not None:
    data.pp.label = label
  builder = pipeline.get_builder(data)
  if is_clips(builder):
    return video_data.dataset_info(builder, data), data
  return pipeline.dataset_info(builder, data), data


def is_clips(builder) -> bool:
  """Whether the dataset of `builder` holds clips (a 'video' feature)."""
  return 'video' in builder.info.features


def batches(info, data, mesh, example=None):
  """Every example of the test split, as global batches on the mesh, with
  a `mask` of the real (not padding) examples; `example` as
  `pipeline.eval_dataset`'s. Of clips: `video_data.eval_batches`', their
  `config.video.test_views` windows each."""
  size = pipeline.host_batch_size(data.batch_eval)
  if is_clips(info.builder):
    host = video_data.eval_batches(info, data, batch_size=size)
  else:
    host = pipeline.eval_batches(info, data, batch_size=size,
                                 example=example)
  return sharding.global_batches(host, mesh, data.batch_eval)


def pre_logits_fn(model):
  """A jitted (params, images) -> `model`'s pre-logits (its output without
  the head); a head in `params` is ignored."""
  headless = model.clone(num_classes=0)
  apply = jax.jit(lambda p, x: headless.apply({'params': p}, x, train=False))
  return lambda params, images: apply(
      {k: v for k, v in params.items() if k != 'head'}, images)


def features(apply_fn, params, info, data, mesh):
  """(`apply_fn(params, images)`, argmax labels) of every example of the
  split, as numpy arrays on every process; of a clip, the mean of its
  views' `apply_fn(params, clips)`."""
  feats, labels = [], []
  for batch in batches(info, data, mesh):
    if 'video' in batch:  # (B, views, frames, H, W, C)
      clips = batch['video']
      out = apply_fn(params, clips.reshape((-1,) + clips.shape[2:]))
      out = out.reshape(clips.shape[:2] + out.shape[1:]).mean(1)
    else:
      out = apply_fn(params, batch['image'])
    out, mask, label = multihost_utils.process_allgather(
        (out, batch['mask'], batch['label']), tiled=True)
    keep = np.asarray(mask) > 0
    feats.append(np.asarray(out, np.float32)[keep])
    labels.append(np.argmax(label, -1)[keep])
  return np.concatenate(feats), np.concatenate(labels)


def masked_means(step, params, info, data, mesh, *args):
  """Means of `step(params, batch, *args)`'s clu metrics over the split,
  and the number of examples they count."""
  totals = None
  for batch in batches(info, data, mesh):
    out = step(params, batch, *args)
    totals = out if totals is None else jax.tree.map(
        lambda a, b: a.merge(b), totals, out,
        is_leaf=lambda x: isinstance(x, clu_metrics.Metric))
  totals = jax.device_get(totals)
  result = {k: float(v.compute()) for k, v in totals.items()}
  result['count'] = int(np.asarray(next(iter(totals.values())).count))
  return result


def masked_average(values, mask):
  return clu_metrics.Average.from_model_output(values, mask=mask > 0)
