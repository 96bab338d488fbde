"""Entry points: `train_and_evaluate` and `evaluate`, for every task.

`config.trainer` picks the task ('train': supervised classification,
'distill': classification with a frozen teacher, 'lit', 'mae': masked
autoencoder pretraining, 'dino': self-distillation without labels, 'navit': NaViT on packed mixed-resolution
sequences, or its plain ViT baseline)
or evaluates a checkpoint without training ('evaluate'; 'fewshot' and
'zeroshot' run only that type of evaluator).
"""

from flax.training import train_state
import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import models
from vit_jax.run import config_checks
from vit_jax.run import loop
from vit_jax.run import run_record
from vit_jax.run import sharding
from vit_jax.tasks import classification
from vit_jax.tasks import dino
from vit_jax.tasks import distillation
from vit_jax.tasks import lit
from vit_jax.tasks import mae
from vit_jax.tasks import navit

TASKS = {'train': classification.Task, 'classification': classification.Task,
         'lit': lit.Task, 'distill': distillation.Task, 'mae': mae.Task,
         'dino': dino.Task,
         'navit': navit.make_task}
# Evaluating a checkpoint: the evaluator types run (None: those of training).
EVALUATIONS = {'evaluate': None, 'fewshot': ('fewshot',),
               'zeroshot': ('zeroshot',)}


def make_task(config, workdir, *, training=True, mesh=None, info=None):
  """The task of `config`, checked before anything compiles.

  `mesh`: default, every device of the run (`config.mesh`); `info`: the
  dataset's `input_pipeline.DatasetInfo`, default read from the dataset
  (`vit_jax.plan` gives one, and reads no data).
  """
  if config.trainer not in TASKS and config.trainer not in EVALUATIONS:
    raise ValueError(f'config.trainer={config.trainer!r}; expected one of '
                     f'{tuple(TASKS) + tuple(EVALUATIONS)} or '
                     "'inference_time'.")
  mesh = mesh or sharding.make_mesh(config.mesh)
  config_checks.validate(config, mesh.shape['data'])
  name = config.trainer
  if name not in TASKS:  # evaluate the model the config names
    is_lit = models.model_class(config.model_name) is models.LitModel
    name = 'lit' if is_lit else 'navit' if 'navit' in config else 'train'
  if info is None:
    return TASKS[name](config, workdir, mesh, training=training)
  if name not in config_checks.PLANNED:
    raise ValueError(f'config.trainer={config.trainer!r}: only the steps of '
                     f'{config_checks.PLANNED} are built without data.')
  return TASKS[name](config, workdir, mesh, training=training, info=info)


def train_and_evaluate(config, workdir, *, allow_config_change=False):
  """Trains (resuming from `workdir`), evaluates, returns the final params.

  Resuming a workdir whose recorded settings differ is refused unless
  `allow_config_change`; a run that fails before its first checkpoint
  leaves no workdir behind if it made it.
  """
  if not config.accum_steps:  # the original's 0: no accumulation
    config = config.copy_and_resolve_references()
    config.accum_steps = 1
  with run_record.removed_if_failed(workdir):
    if config.trainer in EVALUATIONS:
      return evaluate(config, workdir)
    run_record.check_config(config, workdir, allow_change=allow_config_change)
    return loop.run(make_task(config, workdir), config, workdir)


def evaluate(config, workdir):
  """Metrics of a checkpoint, no training; writes `{workdir}/results.json`."""
  task = make_task(config, workdir, training=False)
  return loop.evaluate(task, config, workdir, EVALUATIONS.get(config.trainer))


def make_update_fn(*, apply_fn, accum_steps, tx):
  """The original's data-parallel update: (params, opt_state, batch, rng) ->
  (params, opt_state, loss, rng), `jax.pmap`ped over the local devices
  (axis 'batch'), batches as `input_pipeline.get_data_from_tfds` gives them.

  It is the loop's own classification step (softmax cross-entropy), run on
  `accum_steps` micro-batches per device; their gradients are averaged over
  the devices, then over the micro-batches, before `tx` (optax) updates.
  """
  config = ml_collections.ConfigDict({'loss': 'softmax_xent'})
  # The state's optimizer around the caller's `tx`, whose state it keeps.
  mean_over_devices = optax.GradientTransformation(
      lambda params: optax.EmptyState(),
      lambda updates, state, params=None: (
          jax.lax.pmean(updates, 'batch'), state))
  step_tx = optax.chain(mean_over_devices,
                        optax.MultiSteps(tx, every_k_schedule=accum_steps))

  def update_fn(params, opt_state, batch, rng):
    _, new_rng = jax.random.split(rng)
    # Each device its own dropout (the index is unique across hosts).
    rng = jax.random.fold_in(rng, jax.lax.axis_index('batch'))
    state = train_state.TrainState(
        step=0, apply_fn=apply_fn, params=params, tx=step_tx,
        opt_state=(optax.EmptyState(), optax.MultiStepsState(
            mini_step=0, gradient_step=0, inner_opt_state=opt_state,
            acc_grads=jax.tree.map(jnp.zeros_like, params), skip_state=())))
    micro = jax.tree.map(
        lambda x: x.reshape(accum_steps, -1, *x.shape[1:]), batch)
    state, metrics = jax.lax.scan(
        lambda s, b: classification.train_step(s, b, rng=rng, config=config),
        state, micro)
    loss = jax.lax.pmean(metrics['loss'].mean(), 'batch')
    return (state.params, state.opt_state[1].inner_opt_state, loss, new_rng)

  return jax.pmap(update_fn, axis_name='batch', donate_argnums=(0,))
