"""How a visual tokenizer uses its codebook (BEiT's, `models.beit`).

Every example of a split is tokenized; of the K codes, `codebook_usage` is
the share that some patch takes, and `codebook_perplexity` exp(entropy) of
the codes' frequencies (K when all are equally used, 1 for a single code).
"""

import jax
from jax.experimental import multihost_utils
import numpy as np

from vit_jax.evaluators import common
from vit_jax.evaluators import registry


def usage(counts):
  """(share of codes used, perplexity) of code counts (K,)."""
  counts = np.asarray(counts, np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(np.mean(counts > 0)), float(np.exp(-np.sum(p * np.log(p))))


@registry.register('codebook')
class Evaluator(common.Evaluator):
  """`type='codebook'`: settings `dataset` ('' is the run's) and `split`
  (default: the run's test split); the model is a `VisualTokenizer`."""

  def __init__(self, name, settings, *, config, model, mesh, **_):
    super().__init__(name, settings)
    if not hasattr(model, 'codebook_size'):
      raise ValueError(f'config.evals.{name}: type=\'codebook\' evaluates a '
                       "visual tokenizer (trainer='beit_tokenizer'), not a "
                       f'{type(model).__name__}.')
    self.model, self.mesh = model, mesh
    self.info, self.data = common.split_data(
        config, settings.get('dataset', ''), settings.get('split', ''))
    self.tokens = jax.jit(lambda p, x: model.apply({'params': p}, x,
                                                   method='tokens'))

  def __call__(self, params):
    counts, count = np.zeros(self.model.codebook_size, np.int64), 0
    for batch in common.batches(self.info, self.data, self.mesh):
      tokens, mask = multihost_utils.process_allgather(
          (self.tokens(params, batch['image']), batch['mask']), tiled=True)
      real = np.asarray(tokens)[np.asarray(mask) > 0]
      counts += np.bincount(real.reshape(-1),
                            minlength=self.model.codebook_size)
      count += len(real)
    share, perplexity = usage(counts)
    return {'codebook_usage': share, 'codebook_perplexity': perplexity,
            'count': count}

  def summary(self, metrics):
    return (f'codebook usage {metrics["codebook_usage"]:.3f} '
            f'(perplexity {metrics["codebook_perplexity"]:.1f} of '
            f'{self.model.codebook_size} codes, {metrics["count"]} images)')
