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

import numpy as np

from vit_jax.data import pipeline
from vit_jax.evaluators import common
from vit_jax.evaluators import registry

BIAS_FEATURE = 100.


def fit_lsr(x, labels, num_classes, l2_reg):
  """The least-squares map of whitened `x` (plus a bias) to {-1, 1} targets:
  (mean, std, weights), to apply with `predict_lsr`."""
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


def check_shots(info, data, shots, where):
  """Every class of the split has `shots` examples; read from the labels
  alone, before any feature is computed."""
  counts = pipeline.label_counts(info, data)
  if counts is None:
    return  # label sets: `pick_shots` checks the argmax labels
  few = np.flatnonzero(counts < shots)
  if few.size:
    raise ValueError(
        f'{where}: class {few[0]} has {counts[few[0]]} examples, fewer than '
        f'{shots} shots ({few.size} of {len(counts)} classes have fewer); '
        'take a larger split or fewer config.evals.*.shots.')


def accuracies(train, test, num_classes, shots, seeds, l2_reg):
  """{shots: [test accuracy per seed]} of `(features, labels)` pairs."""
  out = {k: [] for k in shots}
  for k in shots:
    for seed in range(seeds):
      idx = pick_shots(train[1], num_classes, k, seed)
      fit = fit_lsr(train[0][idx], train[1][idx], num_classes, l2_reg)
      out[k].append(float(np.mean(predict_lsr(fit, test[0]) == test[1])))
  return out


@registry.register('fewshot')
class Evaluator(common.Evaluator):
  """`type='fewshot'`: few-shot accuracies of a model's pre-logits.

  Settings: `dataset` ('' is the run's), `train` and `test` splits, `shots`,
  `seeds`, `l2_reg`. Checks them and the data at construction, before
  compilation; each call streams both splits through the model.
  """

  features = True

  headline = False  # a line of its own

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    shots = tuple(settings.shots)
    if not shots or any(int(k) != k or k < 1 for k in shots):
      raise ValueError(f'config.evals.{name}.shots={shots}: expected positive '
                       'integers.')
    if settings.seeds < 1 or settings.l2_reg <= 0:
      raise ValueError(f'config.evals.{name} needs seeds ({settings.seeds}) '
                       f'>= 1 and l2_reg ({settings.l2_reg}) > 0.')
    self.shots, self.seeds, self.l2_reg = shots, settings.seeds, settings.l2_reg
    self.dataset = settings.dataset or config.dataset
    self.splits = {s: common.split_data(config, self.dataset, s)
                   for s in (settings.train, settings.test)}
    self.train, self.test = settings.train, settings.test
    self.num_classes = self.splits[self.train][0].num_classes
    check_shots(*self.splits[self.train], max(shots), f'{self.dataset}:'
                f'{self.train} (config.evals.{name}.train)')
    self.mesh = mesh
    self._apply = common.pre_logits_fn(model)

  def features(self, params, split):
    """(pre-logits, labels) of every example of `split`, on every process."""
    return common.features(self._apply, params, *self.splits[split],
                           self.mesh)

  def __call__(self, params):
    """Mean accuracy per shot count, and the per-seed lists."""
    out = {}
    for k, accs in accuracies(
        self.features(params, self.train), self.features(params, self.test),
        self.num_classes, self.shots, self.seeds, self.l2_reg).items():
      out[f'fewshot_{k}shot'] = float(np.mean(accs))
      out[f'fewshot_{k}shot_per_seed'] = accs
    return out

  def summary(self, metrics):
    return f'few-shot linear accuracy on {self.dataset}: ' + '  '.join(
        f'{k}-shot {metrics[f"fewshot_{k}shot"]:.4f}' for k in self.shots)
