"""The evaluators by `type`, built from `config.evals`."""

from vit_jax.evaluators import classification
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import knn
from vit_jax.evaluators import zeroshot

EVALUATORS = {'classification': classification.Evaluator,
              'fewshot': fewshot.Evaluator,
              'knn': knn.Evaluator,
              'zeroshot': zeroshot.Evaluator}


def from_config(config, *, model, mesh, tokenizer=None, types=None):
  """The evaluators of `config.evals`, checked and built, in order: each
  sees the `model`, the `mesh` and (zero-shot) the task's `tokenizer`.

  Those with an `every` (those training runs), or all those of `types`
  (e.g. ('fewshot', 'knn')).
  """
  out = []
  for name, settings in config.evals.items():
    kind = settings.get('type')
    if kind not in EVALUATORS:
      raise ValueError(f'config.evals.{name}.type={kind!r}; expected one of '
                       f'{tuple(EVALUATORS)}.')
    if (kind in types) if types else settings.get('every') is not None:
      out.append(EVALUATORS[kind](name, settings, config=config, model=model,
                                  mesh=mesh, tokenizer=tokenizer))
  if types and not out:
    raise ValueError(f'config.evals lists no evaluator of type {types}.')
  return out
