"""The evaluators by `type`: each registers itself where it is defined
(`@registry.register('type')`); `from_config` builds those of
`config.evals`."""

from typing import Dict

EVALUATORS: Dict[str, type] = {}


def register(kind: str):
  """A class decorator: the evaluator of `config.evals.NAME.type=kind`."""
  def add(cls):
    if kind in EVALUATORS:
      raise ValueError(f'Evaluator type {kind!r} is registered twice.')
    EVALUATORS[kind] = cls
    return cls
  return add


def config_types() -> tuple:
  """The types that `config.evals` names (NaViT's are its task's own)."""
  return tuple(k for k, cls in EVALUATORS.items() if cls.in_config)


def feature_types() -> tuple:
  """The types that evaluate a model's features, needing no head."""
  return tuple(k for k, cls in EVALUATORS.items() if cls.features)


def build(kind, name, settings, *, config, model, mesh, tokenizer=None):
  """The evaluator of type `kind`, by its one constructor."""
  return EVALUATORS[kind](name, settings, config=config, model=model,
                          mesh=mesh, tokenizer=tokenizer)


def from_config(config, *, model, mesh, tokenizer=None, types=None):
  """The evaluators of `config.evals`, checked and built, in order: each
  sees the `model`, the `mesh` and (zero-shot) the task's `tokenizer`.

  Those with an `every` (those training runs), or all those of `types`
  (e.g. `feature_types()`).
  """
  out = []
  for name, settings in config.evals.items():
    kind = settings.get('type')
    if kind not in config_types():
      raise ValueError(f'config.evals.{name}.type={kind!r}; expected one of '
                       f'{config_types()}.')
    if (kind in types) if types else settings.get('every') is not None:
      out.append(build(kind, name, settings, config=config, model=model,
                       mesh=mesh, tokenizer=tokenizer))
  if types and not out:
    raise ValueError(f'config.evals lists no evaluator of type {types}.')
  return out
