"""Weighted k-nearest-neighbour classification of frozen representations.

DINO's protocol (Caron et al., 2021; `eval_knn.py` of facebookresearch/dino):
the pre-logits of a `train` split are the memory bank; each `test` example
takes its `k` nearest bank features by cosine similarity, each weighted by
exp(similarity / temperature), and predicts the class of the largest sum of
weights. Every test example counts once.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.evaluators import common
from vit_jax.evaluators import registry

# Test features per call of `knn_predict`: its (CHUNK, bank size)
# similarities are what must fit beside the bank (DINO's imgs_per_chunk).
CHUNK = 128


@functools.partial(jax.jit, static_argnames=('num_classes', 'k'))
def knn_predict(bank, bank_labels, queries, num_classes, k, temperature):
  """(queries, num_classes) shares of the weighted vote of each query's `k`
  nearest `bank` rows by cosine similarity; argmax is the prediction."""
  # Neighbour ranks hang on small differences of similarity: full float32.
  sims = jnp.matmul(queries, bank.T, precision=jax.lax.Precision.HIGHEST)
  # Cosine: the norms scale the (chunk, bank) matrix, no normalised copy of
  # the bank is made.
  sims *= jax.lax.rsqrt(jnp.maximum(
      jnp.sum(jnp.square(queries), -1, keepdims=True), 1e-12))
  sims *= jax.lax.rsqrt(jnp.maximum(jnp.sum(jnp.square(bank), -1), 1e-12))
  top, idx = jax.lax.top_k(sims, k)
  # Relative to the nearest neighbour's, the weights cannot overflow at a
  # small temperature; the shares are the same.
  weights = jnp.exp((top - top[:, :1]) / temperature)
  votes = jnp.einsum('qk,qkc->qc', weights,
                     jax.nn.one_hot(bank_labels[idx], num_classes))
  return votes / jnp.sum(votes, -1, keepdims=True)


def scores(bank, bank_labels, queries, num_classes, k, temperature):
  """`knn_predict` of all `queries` (numpy), CHUNK at a time against the
  bank kept on the device; the last chunk padded to the same shape."""
  bank, bank_labels = jnp.asarray(bank), jnp.asarray(bank_labels)
  n = len(queries)
  padded = np.pad(queries, ((0, -n % CHUNK), (0, 0)))
  return np.concatenate([
      np.asarray(knn_predict(bank, bank_labels, padded[i:i + CHUNK],
                             num_classes, k, temperature))
      for i in range(0, n, CHUNK)])[:n]


def top5_correct(votes, labels):
  """Whether each label is among the 5 classes of the largest votes; a
  class without a vote never is."""
  mine = votes[np.arange(len(labels)), labels]
  return (mine > 0) & (np.sum(votes > mine[:, None], -1) < 5)


@registry.register('knn')
class Evaluator(common.Evaluator):
  """`type='knn'`: weighted k-NN accuracy of a model's pre-logits.

  Settings: `dataset` ('' is the run's), `train` (the memory bank) and
  `test` splits, `k`, `temperature`. Checks them at construction, before
  compilation; each call streams both splits through the model.
  """

  features = True

  headline = False  # a line of its own

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    k, temperature = settings.k, settings.temperature
    if isinstance(k, bool) or int(k) != k or k < 1:
      raise ValueError(f'config.evals.{name}.k={k}: expected a positive '
                       'integer.')
    if not temperature > 0:
      raise ValueError(f'config.evals.{name}.temperature={temperature}: '
                       'expected > 0.')
    self.dataset = settings.dataset or config.dataset
    self.train = common.split_data(config, self.dataset, settings.train)
    self.test = common.split_data(config, self.dataset, settings.test)
    bank = self.train[0].num_test
    if k > bank:
      raise ValueError(
          f'config.evals.{name}.k={k}: more than the {bank} examples of the '
          f'memory bank {self.dataset}:{settings.train} '
          f'(config.evals.{name}.train).')
    self.k, self.temperature = int(k), float(temperature)
    self.num_classes = self.train[0].num_classes
    self.mesh = mesh
    self._apply = common.pre_logits_fn(model)

  def __call__(self, params):
    """Top-1 (and, of 5 classes or more, top-5) accuracy; the count."""
    bank, bank_labels = common.features(self._apply, params, *self.train,
                                        self.mesh)
    test, labels = common.features(self._apply, params, *self.test,
                                   self.mesh)
    votes = scores(bank, bank_labels, test, self.num_classes, self.k,
                   self.temperature)
    out = {'knn_accuracy': float(np.mean(votes.argmax(-1) == labels)),
           'knn_count': len(labels)}
    if self.num_classes >= 5:
      out['knn_top5_accuracy'] = float(np.mean(top5_correct(votes, labels)))
    return out

  def summary(self, metrics):
    top5 = metrics.get('knn_top5_accuracy')
    return (f'{self.k}-NN accuracy on {self.dataset}: top-1 '
            f'{metrics["knn_accuracy"]:.4f}'
            + (f'  top-5 {top5:.4f}' if top5 is not None else '')
            + f'  (T={self.temperature:g}, {metrics["knn_count"]} examples)')
