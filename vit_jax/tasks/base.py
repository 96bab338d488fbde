"""What the loop asks of a task, in code: `Task`, with the defaults of the
tasks that need them not.

A task is built once per run, before anything compiles, from (config,
workdir, mesh, training=, info=); it says only what differs between runs:
its model and initial parameters, the optimizer's labels, its step and
batches. The loop (`vit_jax/run/loop.py`) owns the rest.
"""

from typing import Any, Callable, Optional, Sequence

from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import record
from vit_jax.checkpoints import storage
from vit_jax.run import checks


class Task:
  """The contract. Subclasses set `config`, `mesh` and `model` and
  implement the methods that raise here; the others have defaults.

  Class attributes, read before the task is built (`tasks.registry`):
    trainers: the `config.trainer` names that build it (registered with
      `registry.register`).
    planned: whether `vit_jax.plan` builds its step without data.
    trains_patch_sizes: whether it trains at random patch sizes (FlexiViT).
    standalone: it runs by itself (`run(workdir)`), not in the loop.

  Attributes:
    param_labels: params -> a tree of `optim.FROZEN`/`TRAINED` labels;
      None trains every parameter.
    frozen: parameters the step takes as an argument but never updates (a
      teacher), or None.
    evaluators: the task's own evaluators, run after `config.evals`' (NaViT's
      accuracy per resolution).
    tokenizer: texts -> token ids, for the zero-shot evaluators (LiT's).
  """

  trainers: Sequence[str] = ()
  planned: bool = False
  trains_patch_sizes: bool = False
  standalone: bool = False
  param_labels: Optional[Callable[[Any], Any]] = None
  frozen: Optional[Any] = None
  evaluators: Sequence[Any] = ()
  tokenizer: Optional[Callable[[Any], Any]] = None

  @classmethod
  def check_config(cls, config, data_devices: int) -> None:
    """Fails fast on settings, before the data stack loads or anything
    compiles: by default those that every training run shares."""
    if (config.model or {}).get('patch_sizes') and not cls.trains_patch_sizes:
      raise ValueError('config.model.patch_sizes trains a FlexiViT with '
                       f"trainer='train', not {config.trainer!r}.")
    checks.validate(config, data_devices)

  @classmethod
  def input_files(cls, config):
    """(config key, path) of the files that the run reads, where set."""
    path = pretrained.pretrained_path(config)
    key = 'pretrained_path' if config.pretrained_path else 'pretrained_dir'
    return [(key, path)] if path else []

  @classmethod
  def evaluates(cls, config) -> bool:
    """Whether it, rather than classification, evaluates the checkpoint
    of `config` (`trainer='evaluate'`)."""
    del config
    return False

  @classmethod
  def create(cls, config, workdir, mesh, **kw):
    """The task of `config` (NaViT: its plain-ViT baseline, unpacked)."""
    return cls(config, workdir, mesh, **kw)

  def init_params(self, rng):
    """Fresh parameters of `model`."""
    raise NotImplementedError

  def check_initial_files(self) -> None:
    """Fails fast, before anything compiles, on a missing input file (by
    default `pretrained_path`'s)."""
    path = pretrained.pretrained_path(self.config)
    if path:
      storage.local_copy(path)  # a remote one is fetched once, now

  def initial_params(self, params):
    """The parameters to start from (a checkpoint's), or None: `params`."""
    del params

  def drawn_keys(self):
    """The top-level parameters that `initial_params` takes from the
    initialization (the others as shapes), or None: it takes them all."""
    return None

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

  def exported_files(self, params):
    """{suffix: parameters} of the `{model_name}{suffix}.npz` files that
    the run exports, from `exported_params`' (a captioner: the encoder,
    and its decoder beside)."""
    return {'': params}

  def exported_records(self):
    """{suffix: record} written beside `exported_files`' .npz files: what
    rebuilds each (its model and eval transform), so that every tool opens
    it by its path alone (`checkpoints/record.py`)."""
    return {'': record.of_run(self.config, self.exported_model)}

  def run(self, workdir):
    """A `standalone` task's whole run."""
    raise NotImplementedError

  def finish(self, params, workdir) -> None:
    """What the task writes at the end of training (MAE: a picture)."""
