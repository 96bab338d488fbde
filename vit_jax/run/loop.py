"""The one run loop: whatever a task trains, a run goes the same way.

The loop owns the mesh and shardings, the Orbax manager (resume, periodic
and final saves, agreed preemption, a NaN that stops with the last good
checkpoint kept), the batch stream's position, progress and TensorBoard,
the evaluators, `results.json` and the exported `.npz`. A task
(`vit_jax/tasks`) says what is trained: its model and initial parameters,
its optimizer labels, its step and its batches; and, where it differs from
the whole, what is evaluated and exported (`exported`), evaluators of its
own (`evaluators`, run after those of `config.evals`), and anything else
it writes at the end (`finish`).
"""

import contextlib
import functools
import signal
import sys
import threading
import time

from absl import logging
from etils import epy
from flax.training import train_state
import jax
from jax.experimental import multihost_utils
import orbax.checkpoint as ocp

with epy.lazy_imports():  # clu's TensorBoard writer loads TensorFlow
  from clu import metric_writers  # pylint: disable=g-import-not-at-top
  from vit_jax.run import progress  # pylint: disable=g-import-not-at-top

from vit_jax.checkpoints import files
from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import record
from vit_jax.checkpoints import storage
from vit_jax.evaluators import common as evaluators_common
from vit_jax.evaluators import registry
from vit_jax.platform import sharding
from vit_jax.platform import target
from vit_jax.run import optim
from vit_jax.run import run_record

TrainState = train_state.TrainState
# Its module, not checkpoint_managers: that re-exports the preemption policy
# only from orbax 0.11.26, which needs jax 0.6.
_POLICIES = ocp.checkpoint_managers.save_decision_policy


# Orbax writes a replicated array in slices, one per replica, so that the
# hosts share the writing; each slice's shape and offset is a program that
# the first save compiles (88 to 320 of them for a small model on 8
# devices, a fifth of its run's compile time). A slice under 1 MiB is not
# worth its program: such arrays are written whole by one replica.
MIN_SLICE_BYTES = 1 << 20


def _write_small_arrays_whole():
  """Registers Orbax's array handler with MIN_SLICE_BYTES, once."""
  handler = ocp.type_handlers.get_type_handler(jax.Array)
  if getattr(handler, '_min_slice_bytes_for_replica_parallel', 1):
    return  # set already, or an orbax without the setting
  ocp.type_handlers.register_type_handler(
      jax.Array, ocp.type_handlers.ArrayHandler(
          min_slice_bytes_for_replica_parallel=MIN_SLICE_BYTES,
          # The default handler's store of array metadata, kept.
          array_metadata_store=handler._array_metadata_store),  # pylint: disable=protected-access
      override=True)


def make_manager(config, workdir, max_to_keep=None):
  """The workdir's Orbax manager: saves every `checkpoint_every` steps (0:
  only at the end) and when a preemption is agreed."""
  _write_small_arrays_whole()
  policies = [_POLICIES.PreemptionCheckpointingPolicy()]
  if config.checkpoint_every:
    policies.append(_POLICIES.FixedIntervalPolicy(config.checkpoint_every))
  return ocp.CheckpointManager(
      storage.join(storage.absolute(workdir), 'checkpoints'),
      item_handlers=ocp.StandardCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(
          max_to_keep=max_to_keep,
          save_decision_policy=_POLICIES.AnySavePolicy(policies)))


# Building the state.


def _restore(manager, abstract, shardings):
  """The latest checkpoint, once its keys and shapes fit the model."""
  step = manager.latest_step()
  try:
    files.inspect_params(
        params=manager.item_metadata(step).tree['params'],
        expected=abstract.params,
        source=f'The checkpoint in {manager.directory}')
  except files.CheckpointError as e:
    raise files.CheckpointError(
        f'{e}\nUse a fresh --workdir, or the config that wrote this one.'
    ) from None
  wanted = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, shardings)
  if jax.process_index() == 0:
    print(f'Resuming from step {step} in {manager.directory}.', flush=True)
  return manager.restore(step, args=ocp.args.StandardRestore(wanted))


def abstract_state(task, config, mesh):
  """(`init`, the state it makes, as shapes, and their shardings on `mesh`):
  nothing is computed."""
  init_rng = jax.random.split(jax.random.key(config.seed))[0]

  def init():
    params = task.init_params(init_rng)
    return TrainState.create(
        apply_fn=task.model.apply, params=params,
        tx=optim.make_optimizer(config, task.param_labels))

  abstract = jax.eval_shape(init)  # raises on a bad image size
  return init, abstract, sharding.tree_shardings(
      abstract, mesh, config.sharding_rules, config.sharding_strategy)


def create_state(task, config, mesh, manager):
  """(state, its shardings, steps done): restored, or the task's initial
  parameters (pretrained, or fresh) with a new optimizer."""
  init, abstract, shardings = abstract_state(task, config, mesh)
  if manager.latest_step() is not None:
    return (_restore(manager, abstract, shardings), shardings,
            manager.latest_step())
  task.check_initial_files()  # fails fast, before compiling `init`
  drawn = task.drawn_keys()
  if drawn is not None:
    return _fine_tuning_state(task, init, abstract, shardings, drawn), \
        shardings, 0
  state = jax.jit(init, out_shardings=shardings)()
  params = task.initial_params(jax.device_get(state.params))
  if params is not None:
    state = state.replace(params=jax.device_put(params, shardings.params))
  return state, shardings, 0


def _fine_tuning_state(task, init, abstract, shardings, drawn):
  """The state of `task.initial_params` given shapes, but for the top-level
  parameters `drawn` (a new head) from `init`: the rest are never drawn
  (XLA drops them), as compiling all the draws costs as much as a step.
  The same values as drawing all and keeping those."""
  fresh = jax.device_get(jax.jit(
      lambda: {k: v for k, v in init().params.items() if k in drawn})())
  params = task.initial_params({**abstract.params, **fresh})
  return jax.jit(lambda p: TrainState.create(
      apply_fn=abstract.apply_fn, params=p, tx=abstract.tx),
                 out_shardings=shardings)(params)


def jit_train_step(task, config, mesh, shardings, platform=None):
  """The task's step, jitted on the mesh with the state donated.

  A task's `frozen` parameters (a teacher), if it has any, are an argument
  of the step, placed on the mesh by the sharding rules: never constants
  baked into the program, never updated. The model's implementations are
  those of `platform`, default the mesh's (`target`).
  """
  rng = jax.random.split(jax.random.key(config.seed))[1]
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  train_step = target.traced_for(platform or mesh, task.train_step)
  frozen = task.frozen
  if frozen is None:
    return jax.jit(functools.partial(train_step, rng=rng),
                   in_shardings=(shardings, sharding.batch_sharding(mesh)),
                   out_shardings=(shardings, replicated), donate_argnums=0)
  frozen_shardings = sharding.tree_shardings(
      frozen, mesh, config.sharding_rules, config.sharding_strategy)
  step = jax.jit(
      lambda state, batch, frozen: train_step(state, batch, rng=rng,
                                              frozen=frozen),
      in_shardings=(shardings, sharding.batch_sharding(mesh),
                    frozen_shardings),
      out_shardings=(shardings, replicated), donate_argnums=0)
  placed = jax.device_put(frozen, frozen_shardings)
  return lambda state, batch: step(state, batch, placed)


# The loop's pieces.


@contextlib.contextmanager
def preemption(manager):
  """Yields `reached(step)`: whether to save and stop after `step`.

  A SIGTERM to any process makes every process save the same step: with
  several processes Orbax asks JAX's preemption sync point, which names a
  step all reach; alone, a SIGTERM handler sets a flag.
  """
  if jax.process_count() > 1:
    yield manager.reached_preemption
    return
  requested = []

  def handle(signum, frame):
    del frame
    logging.warning('SIGTERM: saving a checkpoint, then stopping.')
    requested.append(signum)

  main = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, handle) if main else None
  try:
    yield lambda step: bool(requested)
  finally:
    if main:
      signal.signal(signal.SIGTERM, previous)


def _due(every, step: int, last: bool) -> bool:
  """An evaluator's turn: every `every` steps and at the end (0: the end
  only; None: never in training)."""
  return every is not None and (last or (every > 0 and step % every == 0))


def _evaluators(task, config, model, types=None):
  """`config.evals`' evaluators of `model`, with what the task gives them."""
  return registry.from_config(config, model=model, mesh=task.mesh,
                              tokenizer=task.tokenizer, types=types)


def run_evaluators(evaluators, params, writer, step, prefix=''):
  """Runs each evaluator; prints its line, writes its scalars; returns the
  metrics of all."""
  result = {}
  for evaluator in evaluators:
    metrics = evaluator(params)
    print(f'{prefix}{evaluator.summary(metrics)}', flush=True)
    writer.write_scalars(step or 0, evaluator.scalars(metrics))
    result.update(metrics)
  return result


def write_results(config, workdir, result, name='results.json', **extra):
  """`{workdir}/{name}` (process 0), naming the model, dataset and
  pretrained checkpoint for `scripts/collect_results.py` (`extra` wins)."""
  if jax.process_index() == 0:
    storage.write_json(storage.join(workdir, name), {
        'model_name': config.model_name, 'dataset': config.dataset,
        'pretrained': pretrained.pretrained_path(config), **result, **extra})


def export_npz(params, path):
  """Writes params in the original release's .npz format (process 0)."""
  if not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
    params = multihost_utils.process_allgather(params, tiled=True)
  params = jax.device_get(params)
  if jax.process_index() == 0:
    files.save(params, path)


def _finish(config, workdir, exports, records, result, seconds, evaluators):
  """Exports the final parameters as .npz files (`{model_name}{suffix}.npz`
  of the task's `exported_files`), each after its record (`records`, the
  task's `exported_records`: a .npz present has its record), and writes
  `results.json`."""
  for suffix, params in exports.items():
    path = storage.join(workdir, f'{config.model_name}{suffix}.npz')
    if suffix in records and jax.process_index() == 0:
      record.write(path, records[suffix])
    export_npz(params, path)
  write_results(config, workdir, result, step=config.total_steps,
                seconds_since_start=seconds)
  summary = ''.join(f'{e.summary(result)}, ' for e in evaluators
                    if e.headline)
  print(f'Done: {config.total_steps} steps, {summary}{seconds:.0f} s since '
        'start or resume.', flush=True)


def exported(task):
  """(model, params -> its params): what the evaluators see and the .npz
  holds (MAE: its encoder alone)."""
  return task.exported_model, task.exported_params


def _writer(workdir):
  return metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)


def _train(config, state, train_fn, batches, manager, evaluators, writer,
           start, view):
  """The steps from `start` on: (state, last step, last metrics); the
  evaluators see `view(params)`."""
  reporter, result, step = progress.Progress(config, writer, start), {}, start
  try:
    with preemption(manager) as reached_preemption:
      for step in range(start + 1, config.total_steps + 1):
        for _ in range(config.accum_steps):
          state, metrics = train_fn(state, next(batches))
          reporter.add(metrics)
        reporter(step)
        last, preempted = step == config.total_steps, reached_preemption(step)
        save = last or preempted or manager.should_save(step)
        if save:
          reporter.report_now(step)  # a NaN never reaches a checkpoint
        due = [e for e in evaluators if _due(e.every, step, last)]
        if due:
          result.update(run_evaluators(
              due, view(state.params), writer, step,
              prefix=f'[{step}/{config.total_steps}] '))
          reporter.restart_clock()
        if save:
          manager.save(step, args=ocp.args.StandardSave(state), force=True)
        if preempted:
          break
  except FloatingPointError as e:
    manager.wait_until_finished()
    raise FloatingPointError(
        f'{e} The last good checkpoint is step {manager.latest_step()} in '
        f'{manager.directory}.') from None
  except BaseException:
    # Any other failure (the data, a KeyboardInterrupt): a save in flight
    # is finished, not lost, nor raced by a cleanup of the workdir.
    manager.wait_until_finished()
    raise
  finally:
    reporter.close()
  return state, step, result


def run(task, config, workdir):
  """Trains `task` (resuming from `workdir`), evaluates, exports; returns
  the final parameters."""
  mesh = task.mesh
  model, view = exported(task)
  evaluators = _evaluators(task, config, model)
  evaluators += list(task.evaluators)  # the task's own, if any
  manager = make_manager(config, workdir, config.max_to_keep)
  state, shardings, start = create_state(task, config, mesh, manager)
  if start >= config.total_steps:
    print(f'{workdir} already holds the final step {start}; nothing to '
          'train.', flush=True)
    manager.close()
    return state.params
  run_record.record_config(config, workdir)
  train_fn = jit_train_step(task, config, mesh, shardings)
  writer = _writer(workdir)
  if start == 0:
    writer.write_hparams(config.to_dict())
  micro = config.batch // config.accum_steps
  batches = sharding.global_batches(task.batches(
      batch_size=micro, rows=sharding.process_rows(mesh, micro),
      start_step=start * config.accum_steps), mesh, micro)
  t_start = time.perf_counter()
  state, step, result = _train(config, state, train_fn, batches, manager,
                               evaluators, writer, start, view)
  manager.wait_until_finished()
  manager.close()
  writer.flush()
  if step == config.total_steps:
    _finish(config, workdir, task.exported_files(view(state.params)),
            task.exported_records(), result,
            time.perf_counter() - t_start, evaluators)
    task.finish(state.params, workdir)  # e.g. MAE's picture
  else:
    print(f'Preempted: saved step {step} to {manager.directory}; rerun the '
          'same command to continue.', flush=True)
  return state.params


def evaluate(task, config, workdir, types=None):
  """A checkpoint's metrics, no training: `pretrained_path` (or
  `{pretrained_dir}/{model_name}.npz`), else the latest state in `workdir`.

  Runs the evaluators of `config.evals` that training would run (those of
  `types` only, if given) and writes `{workdir}/results.json`, or
  `eval_results.json` beside a training run's results.
  """
  path = pretrained.pretrained_path(config)
  manager = make_manager(config, workdir)
  empty = manager.latest_step() is None
  manager.close()
  if path is None and empty:
    raise FileNotFoundError(
        'Nothing to evaluate: set pretrained_path or pretrained_dir, or give '
        f'a workdir with checkpoints ({workdir} has none).')
  model, params = task.checkpoint(path or workdir)
  source = path or f'the latest checkpoint in {workdir}'
  try:
    evaluators = _evaluators(task, config, model, types)
  except evaluators_common.HeadMismatch as e:
    if types is not None:
      raise
    # A checkpoint without a head for this data (a pre-trained encoder):
    # its features are what can be evaluated.
    print(f'Note: {source}: {e} The few-shot and k-NN evaluators run '
          'instead.', file=sys.stderr, flush=True)
    evaluators = _evaluators(task, config, model, registry.feature_types())
  if types is None:  # the evaluators training runs, the task's own too
    evaluators += list(task.evaluators)
  params = jax.device_put(params, sharding.tree_shardings(
      params, task.mesh, config.sharding_rules, config.sharding_strategy))
  writer = _writer(workdir)
  result = run_evaluators(evaluators, params, writer, 0, prefix=f'{source}: ')
  writer.flush()
  write_results(config, workdir, result, run_record.results_name(workdir),
                checkpoint=source)
  return result
