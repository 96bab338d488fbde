"""From a config to a run: the task that `config.trainer` names, checked,
then trained (`train_and_evaluate`) or evaluated (`evaluate`).

`config.trainer` names a registered task (`vit_jax/tasks`: 'train' or
'classification', 'distill', 'lit', 'siglip2', 'mae', 'dino',
'beit_tokenizer', 'beit', 'navit', 'segmentation', 'captioning', 'video',
'videomae', 'inference_time'; `trainers()` lists them) or evaluates a checkpoint
without training ('evaluate'; 'fewshot' and 'zeroshot' run only that type
of evaluator).
"""

from absl import logging
import jax

from vit_jax import cli
from vit_jax.analysis import figures
from vit_jax.platform import sharding
from vit_jax.platform import target
from vit_jax.run import checks
from vit_jax.run import loop
from vit_jax.run import run_record
from vit_jax.tasks import registry

# Evaluating a checkpoint: the evaluator types run (None: those of training).
EVALUATIONS = {'evaluate': None, 'fewshot': ('fewshot',),
               'zeroshot': ('zeroshot',)}


def trainers() -> tuple:
  """Every `config.trainer`: the registered tasks, then the evaluations."""
  return tuple(registry.TASKS) + tuple(EVALUATIONS)


def _task_class(config):
  if config.trainer in registry.TASKS:
    return registry.TASKS[config.trainer]
  if config.trainer in EVALUATIONS:
    return registry.evaluating(config)
  hint = cli.closest(config.trainer, trainers(), 'config.trainer')
  raise ValueError(f'config.trainer={config.trainer!r}; expected one of '
                   f'{trainers()}; {hint.split("; ")[-1]}')


def check(config, mesh=None):
  """Every check that needs only the config and the devices, before the
  data stack loads; returns the mesh (default: `config.mesh`'s)."""
  cls = _task_class(config)
  mesh = mesh or sharding.make_mesh(config.mesh)
  cls.check_config(config, mesh.shape['data'])
  checks.check_files(cls.input_files(config))
  return mesh


def _settled_dtype(config, mesh, training):
  """`config` with `model.dtype='auto'` made the dtype that the mesh's
  devices run fastest (`target.compute_dtype`), once, before any trace."""
  if (config.get('model') or {}).get('dtype') != 'auto':
    return config
  config = config.copy_and_resolve_references()
  config.model.dtype = target.compute_dtype(mesh, training)
  logging.info('config.model.dtype=auto: %s on %s, for %s.',
               config.model.dtype, mesh.devices.flat[0].device_kind,
               'training' if training else 'inference')
  return config


def make_task(config, workdir, *, training=True, mesh=None, info=None,
              checked=False):
  """The task of `config`, checked (unless `checked`: by `check`, on
  `mesh`) before anything compiles.

  `mesh`: default, every device of the run (`config.mesh`); `info`: the
  dataset's `pipeline.DatasetInfo`, default read from the dataset
  (`vit_jax.plan` gives one, and reads no data). `model.dtype='auto'` is
  settled for the mesh's devices, for `training` or inference.
  """
  if not checked:
    mesh = check(config, mesh)
  config = _settled_dtype(config, mesh, training)
  cls = _task_class(config)
  if info is None:
    return cls.create(config, workdir, mesh, training=training)
  if not cls.planned:
    raise ValueError(f'config.trainer={config.trainer!r}: only the steps of '
                     f'{registry.planned()} are built without data.')
  return cls.create(config, workdir, mesh, training=training, info=info)


def train_and_evaluate(config, workdir, *, allow_config_change=False,
                       mesh=None):
  """Trains (resuming from `workdir`), evaluates, returns the final params.

  Resuming a workdir whose recorded settings differ is refused unless
  `allow_config_change`; a run that fails before its first checkpoint
  leaves no workdir behind if it made it. `mesh`: from `check`, which then
  is not repeated.
  """
  if not config.accum_steps:  # the original's 0: no accumulation
    config = config.copy_and_resolve_references()
    config.accum_steps = 1
  checked = mesh is not None
  with run_record.removed_if_failed(workdir):
    if config.trainer in EVALUATIONS:
      return evaluate(config, workdir, mesh=mesh)
    if _task_class(config).standalone:  # timing the forward pass
      return make_task(config, workdir, training=False, mesh=mesh,
                       checked=checked).run(workdir)
    run_record.check_config(config, workdir, allow_change=allow_config_change)
    params = loop.run(make_task(config, workdir, mesh=mesh, checked=checked),
                      config, workdir)
  if jax.process_index() == 0:
    figures.draw_run_figures(workdir)  # e.g. MAE's reconstructions
  return params


def evaluate(config, workdir, *, mesh=None):
  """Metrics of a checkpoint, no training; writes `{workdir}/results.json`."""
  task = make_task(config, workdir, training=False, mesh=mesh,
                   checked=mesh is not None)
  return loop.evaluate(task, config, workdir, EVALUATIONS.get(config.trainer))
