"""What the loop asks of a task, in code: `Task`, with the defaults of the
tasks that need them not.

A task is built once per run, before anything compiles, from (config,
workdir, mesh, training=, info=); it says only what differs between runs:
its model and initial parameters, the optimizer's labels, its step and
batches. The loop (`vit_jax/run/loop.py`) owns the rest.
"""

from typing import Any, Callable, Optional, Sequence

from vit_jax.run import loop


class Task:
  """The contract. Subclasses set `config`, `mesh` and `model` and
  implement the methods that raise here; the others have defaults.

  Attributes:
    param_labels: params -> a tree of `optim.FROZEN`/`TRAINED` labels;
      None trains every parameter.
    frozen: parameters the step takes as an argument but never updates (a
      teacher), or None.
    evaluators: the task's own evaluators, run after `config.evals`' (NaViT's
      accuracy per resolution).
    tokenizer: texts -> token ids, for the zero-shot evaluators (LiT's).
  """

  param_labels: Optional[Callable[[Any], Any]] = None
  frozen: Optional[Any] = None
  evaluators: Sequence[Any] = ()
  tokenizer: Optional[Callable[[Any], Any]] = None

  def init_params(self, rng):
    """Fresh parameters of `model`."""
    raise NotImplementedError

  def check_initial_files(self) -> None:
    """Fails fast, before anything compiles, on a missing input file (by
    default `pretrained_path`'s)."""
    loop.check_pretrained_file(self.config)

  def initial_params(self, params):
    """The parameters to start from (a checkpoint's), or None: `params`."""
    del params

  def train_step(self, state, batch, *, rng, **frozen):
    """(state, metrics) after one micro-batch; `frozen=` if the task has
    `frozen` parameters."""
    raise NotImplementedError

  def batches(self, *, batch_size: int, rows, start_step: int):
    """This process's rows of the training micro-batches, from
    `start_step`."""
    raise NotImplementedError

  def abstract_batch(self, batch_size: int):
    """Shapes and dtypes of a training micro-batch (for `vit_jax.plan`)."""
    raise NotImplementedError(
        f'{type(self).__name__} has no abstract batch: its step is built '
        'only with data.')

  def checkpoint(self, path):
    """(model, params) of a checkpoint, to evaluate it."""
    raise NotImplementedError

  @property
  def exported_model(self):
    """The model that evaluators see and the exported .npz holds."""
    return self.model

  def exported_params(self, params):
    """`exported_model`'s part of the parameters (MAE: the encoder)."""
    return params

  def finish(self, params, workdir) -> None:
    """What the task writes at the end of training (MAE: a picture)."""
