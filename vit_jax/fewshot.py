"""Few-shot linear evaluation of frozen representations (paper, Sec. 4.1).

The protocol of big_vision's `evaluators/fewshot_lsr.py`, which the paper's
numbers come from: the pre-logits of `shots` training images per class,
drawn with numpy seeds 0 .. seeds-1, each feature whitened with the few-shot
set's mean and standard deviation, a constant feature of 100 appended (a
bias almost free of the penalty), and the closed-form L2-regularized
least-squares map to {-1, 1}^K targets; the predicted class is the largest
output. The regularization is fixed (big_vision's 2^10), as the paper did,
not tuned per task.
"""


from clu import metric_writers
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import sharding
from vit_jax import storage

BIAS_FEATURE = 100.


def fit_lsr(x, labels, num_classes, l2_reg):
  """The least-squares map of whitened `x` (plus a bias) to {-1, 1} targets.

  Returns:
    (mean, std, weights): apply with `predict_lsr`.
  """
  x = np.asarray(x, np.float64)
  mean, std = x.mean(0), x.std(0) + 1e-5
  x = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=BIAS_FEATURE)
  y = 2. * np.eye(num_classes)[labels] - 1.
  n, d = x.shape
  if n >= d:  # (X'X + l2 I)^-1 X'y
    weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ y)
  else:  # the same, as X' (XX' + l2 I)^-1 y: an n x n system
    weights = x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), y)
  return mean, std, weights


def predict_lsr(fit, x):
  mean, std, weights = fit
  x = (np.asarray(x, np.float64) - mean) / std
  x = np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_FEATURE)
  return np.argmax(x @ weights, axis=1)


def pick_shots(labels, num_classes, shots, seed):
  """Indices of `shots` examples of each class, drawn with `seed`."""
  rng = np.random.default_rng(seed)
  picked = []
  for c in range(num_classes):
    where = rng.permutation(np.flatnonzero(labels == c))
    if len(where) < shots:
      raise ValueError(f'Class {c} has {len(where)} training examples, '
                       f'fewer than {shots} shots.')
    picked.append(where[:shots])
  return np.concatenate(picked)


def accuracies(train, test, num_classes, shots, seeds, l2_reg):
  """{shots: [test accuracy per seed]} of `(features, labels)` pairs."""
  out = {}
  for k in shots:
    out[k] = []
    for seed in range(seeds):
      idx = pick_shots(train[1], num_classes, k, seed)
      fit = fit_lsr(train[0][idx], train[1][idx], num_classes, l2_reg)
      out[k].append(float(np.mean(predict_lsr(fit, test[0]) == test[1])))
  return out


def summarize(per_seed, prefix='fewshot'):
  """Flat metrics: mean accuracy per shot count, and the per-seed lists."""
  out = {}
  for k, accs in per_seed.items():
    out[f'{prefix}_{k}shot'] = float(np.mean(accs))
    out[f'{prefix}_{k}shot_per_seed'] = accs
  return out


def headless_model(config):
  """The config's model without its head: it outputs the pre-logits."""
  return models.model_class(config.model_name)(num_classes=0, **config.model)


class Evaluator:
  """Few-shot accuracies of a model's pre-logits on `config.fewshot`'s data.

  Checks the settings and the dataset at construction, before compilation;
  each call streams both splits through the model (no cached images).
  """

  def __init__(self, config, mesh=None):
    fs = config.fewshot
    shots = tuple(fs.shots)
    if not shots or any(int(k) != k or k < 1 for k in shots):
      raise ValueError(f'config.fewshot.shots={shots}: expected positive '
                       'integers.')
    if fs.seeds < 1 or fs.l2_reg <= 0 or fs.every < 0:
      raise ValueError(f'config.fewshot needs seeds ({fs.seeds}) >= 1, '
                       f'l2_reg ({fs.l2_reg}) > 0 and every ({fs.every}) '
                       '>= 0.')
    self.shots, self.seeds, self.l2_reg = shots, fs.seeds, fs.l2_reg
    self.name = fs.dataset or config.dataset
    self.model, self.mesh = headless_model(config), mesh
    self.infos = {}
    for split in (fs.train, fs.test):
      data = config.copy_and_resolve_references().unlock()
      data.dataset, data.pp.train, data.pp.test = self.name, split, split
      self.infos[split] = (input_pipeline.get_dataset_info(
          input_pipeline.get_builder(data), data), data)
    self.train, self.test = fs.train, fs.test
    self.num_classes = self.infos[fs.train][0].num_classes
    self.batch = config.batch_eval
    self._apply = jax.jit(lambda p, x: self.model.apply(
        {'params': p}, x, train=False))

  def features(self, params, split):
    """(pre-logits, labels) of every example of `split`."""
    info, data = self.infos[split]
    params = {k: v for k, v in params.items() if k != 'head'}
    feats, labels = [], []
    for batch in input_pipeline.eval_batches(
        info, data, batch_size=input_pipeline.host_batch_size(self.batch)):
      image = batch['image']
      if self.mesh is not None:
        image = jax.make_array_from_process_local_data(
            sharding.batch_sharding(self.mesh), image)
      out, mask, label = multihost_utils.process_allgather(
          (self._apply(params, image), batch['mask'], batch['label']),
          tiled=True)  # every process solves with every example
      keep = np.asarray(mask) > 0
      feats.append(np.asarray(out, np.float32)[keep])
      labels.append(np.argmax(label, -1)[keep])
    return np.concatenate(feats), np.concatenate(labels)

  def __call__(self, params):
    """{shots: [accuracy per seed]}."""
    return accuracies(self.features(params, self.train),
                      self.features(params, self.test), self.num_classes,
                      self.shots, self.seeds, self.l2_reg)

  def report(self, params, writer, step):
    """Runs, prints, writes the means to TensorBoard; returns `summarize`."""
    metrics = summarize(self(params))
    means = {k: v for k, v in metrics.items() if not k.endswith('_seed')}
    print(f'[{step}] few-shot linear accuracy on {self.name}: ' + '  '.join(
        f'{k}-shot {means[f"fewshot_{k}shot"]:.4f}' for k in self.shots),
          flush=True)
    writer.write_scalars(step, means)
    return metrics


def load_frozen(config, path):
  """Parameters of `path` for the headless model at `config.pp.crop`.

  The position table is resized as for fine-tuning; `pre_logits` is kept
  when the checkpoint has one (its representation is the paper's).
  """
  params = checkpoint.load(path)
  if 'kernel' in params.get('pre_logits', {}):
    config = config.copy_and_resolve_references().unlock()
    config.model.representation_size = params['pre_logits']['kernel'].shape[
        -1]
  model = headless_model(config)
  image = jnp.zeros((1, config.pp.crop, config.pp.crop, 3))
  abstract = jax.eval_shape(lambda: model.init(
      jax.random.key(0), image, train=False))['params']
  return config, checkpoint.load_pretrained(
      pretrained_path=path, init_params=abstract, model_config=config.model,
      new_grid=models.token_grid(config))


def evaluate_checkpoint(config, workdir):
  """`trainer='fewshot'`: few-shot accuracies of a checkpoint's pre-logits.

  The checkpoint is `pretrained_path` (or `{pretrained_dir}/{model_name}
  .npz`); the data `config.fewshot.dataset` (default: `config.dataset`).
  Writes `{workdir}/results.json`.
  """
  from vit_jax import train  # pylint: disable=g-import-not-at-top
  path = train.pretrained_path(config)
  try:
    storage.local_copy(path or '')  # fails fast; fetched once if remote
  except FileNotFoundError:
    raise FileNotFoundError(
        'trainer=fewshot evaluates a checkpoint: set pretrained_path or '
        f'pretrained_dir to an existing .npz (got {path!r}).') from None
  config, params = load_frozen(config, path)
  evaluator = Evaluator(config)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  metrics = evaluator.report(params, writer, 0)
  writer.flush()
  train.write_results(config, workdir, metrics, dataset=evaluator.name,
                      checkpoint=path, l2_reg=evaluator.l2_reg)
  return metrics

