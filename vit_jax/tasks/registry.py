"""The tasks by `config.trainer` name: each registers itself where it is
defined (`@registry.register` on its `base.Task` subclass)."""

from typing import Dict, Type

from vit_jax.tasks import base

TASKS: Dict[str, Type[base.Task]] = {}


def register(cls: Type[base.Task]) -> Type[base.Task]:
  """Adds the task class `cls` under each of its `trainers` names."""
  for name in cls.trainers:
    if name in TASKS:
      raise ValueError(f"config.trainer={name!r} is registered twice.")
    TASKS[name] = cls
  return cls


def planned() -> tuple:
  """The trainers whose step `vit_jax.plan` builds without data."""
  return tuple(name for name, cls in TASKS.items() if cls.planned)


def evaluating(config) -> Type[base.Task]:
  """The task that evaluates the checkpoint of `config`: the first that
  says so (`evaluates`), else classification's."""
  return next((cls for cls in TASKS.values() if cls.evaluates(config)),
              TASKS['train'])
