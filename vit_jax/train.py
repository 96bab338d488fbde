"""Training and evaluation: one jitted step on a device mesh, Orbax resume.

As flax's imagenet example: `create_train_state`, pure `train_step` and
`eval_step`, and `train_and_evaluate`, a short loop over small functions.
"""

import datetime
import functools
import signal
import threading
import time

from absl import logging
import chex
from clu import metric_writers
from flax.training import train_state
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm.auto

from vit_jax import checkpoint
from vit_jax import fewshot
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import sharding
from vit_jax import storage

TrainState = train_state.TrainState


def make_model(config, num_classes: int):
  return models.model_class(config.model_name)(
      num_classes=num_classes, **config.model)


def pretrained_path(config):
  """`pretrained_path`, else `{pretrained_dir}/{model_name}.npz`, else None."""
  if config.pretrained_path:
    return config.pretrained_path
  if config.pretrained_dir:
    return storage.join(config.pretrained_dir, f'{config.model_name}.npz')
  return None


def warmup_steps(config) -> int:
  """`warmup_steps`, or a tenth of a run too short for it (a debug run)."""
  if config.warmup_steps < config.total_steps:
    return config.warmup_steps
  return config.total_steps // 10


def make_schedule(config) -> optax.Schedule:
  """Linear warmup from 0 to base_lr, then cosine or linear decay to 0."""
  warmup = warmup_steps(config)
  if config.decay_type == 'cosine':
    return optax.warmup_cosine_decay_schedule(
        0.0, config.base_lr, warmup, config.total_steps)
  return optax.join_schedules([
      optax.linear_schedule(0.0, config.base_lr, warmup),
      optax.linear_schedule(config.base_lr, 0.0, config.total_steps - warmup),
  ], [warmup])


def make_optimizer(config) -> optax.GradientTransformation:
  """Clip by global norm -> SGD momentum or AdamW; accumulate micro-batches.

  The momentum (AdamW: the first moment) is kept in `config.momentum_dtype`;
  bfloat16, as the original release, halves its memory.
  """
  schedule = make_schedule(config)
  momentum_dtype = jnp.dtype(config.momentum_dtype)
  if config.optimizer == 'sgd':
    opt = optax.sgd(schedule, momentum=0.9, accumulator_dtype=momentum_dtype)
  else:
    opt = optax.adamw(schedule, b1=0.9, b2=0.999, mu_dtype=momentum_dtype,
                      weight_decay=config.weight_decay)
  if config.grad_norm_clip:
    opt = optax.chain(optax.clip_by_global_norm(config.grad_norm_clip), opt)
  if config.accum_steps == 1:
    return opt  # MultiSteps would keep a float32 copy of the gradients
  return optax.MultiSteps(opt, every_k_schedule=config.accum_steps)


def loss_fn(logits, labels, kind: str):
  if kind == 'sigmoid_xent':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  return optax.softmax_cross_entropy(logits, labels)


def train_step(state: TrainState, batch, *, rng, loss: str):
  """One micro-batch: gradients, then the (accumulating) optimizer update."""
  chex.assert_rank(batch['image'], 4)
  chex.assert_equal_shape_prefix([batch['image'], batch['label']], 1)
  dropout_rng = jax.random.fold_in(rng, state.step)

  def compute_loss(params):
    logits = state.apply_fn({'params': params}, batch['image'], train=True,
                            rngs={'dropout': dropout_rng})
    return loss_fn(logits, batch['label'], loss).mean()

  value, grads = jax.value_and_grad(compute_loss)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


def eval_step(state: TrainState, batch, *, loss: str):
  """Masked sums of correct predictions, loss and examples."""
  logits = state.apply_fn({'params': state.params}, batch['image'],
                          train=False)
  mask, labels = batch['mask'], batch['label']
  # Right if the top class is a label: one-hot, or a set (ImageNet ReaL).
  top = jnp.argmax(logits, -1)[:, None]
  correct = jnp.take_along_axis(labels, top, -1)[:, 0] > 0
  if loss == 'softmax_xent':  # a set of k labels: 1/k each
    labels = labels / jnp.maximum(labels.sum(-1, keepdims=True), 1)
  return {'correct': jnp.sum(correct * mask),
          'loss': jnp.sum(loss_fn(logits, labels, loss) * mask),
          'count': jnp.sum(mask)}


def validate_config(config, num_devices_data: int):
  """Fails fast, before any compilation, on inconsistent settings."""
  choices = {'optimizer': ('sgd', 'adamw'),
             'loss': ('softmax_xent', 'sigmoid_xent'),
             'decay_type': ('cosine', 'linear'),
             'trainer': ('train', 'inference_time', 'evaluate', 'fewshot',
                         'lit', 'zeroshot'),
             'sharding_strategy': sharding.STRATEGIES,
             'momentum_dtype': ('float32', 'bfloat16')}
  for key, allowed in choices.items():
    if config[key] not in allowed:
      raise ValueError(f'config.{key}={config[key]!r}; expected one of '
                       f'{allowed}.')
  if config.optimizer == 'sgd' and config.weight_decay:
    raise ValueError(f'config.weight_decay={config.weight_decay} needs '
                     "optimizer='adamw'; SGD has none (set it to 0).")
  if config.total_steps <= 0 or config.warmup_steps < 0:
    raise ValueError(f'Need total_steps ({config.total_steps}) > 0 and '
                     f'warmup_steps ({config.warmup_steps}) >= 0.')
  if config.warmup_steps >= config.total_steps:
    logging.warning('warmup_steps=%d is not shorter than total_steps=%d: '
                    'warming up for %d steps instead.', config.warmup_steps,
                    config.total_steps, warmup_steps(config))
  micro = config.batch // config.accum_steps
  if config.batch % config.accum_steps or micro % num_devices_data:
    raise ValueError(
        f'batch={config.batch} must split into accum_steps='
        f'{config.accum_steps} micro-batches divisible by the {num_devices_data}'
        ' devices on the mesh `data` axis.')
  if config.batch_eval % num_devices_data:
    raise ValueError(f'batch_eval={config.batch_eval} is not divisible by the '
                     f'{num_devices_data} devices on the `data` axis.')


# Building the state.


def _restore(manager, abstract, shardings):
  """The latest checkpoint, once its keys and shapes fit the model."""
  step = manager.latest_step()
  where = f'The checkpoint in {manager.directory}'
  try:
    checkpoint.inspect_params(
        params=manager.item_metadata(step).tree['params'],
        expected=abstract.params, source=where)
  except checkpoint.CheckpointError as e:
    raise checkpoint.CheckpointError(
        f'{e}\nUse a fresh --workdir, or the config that wrote this one.'
    ) from None
  target = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
      abstract, shardings)
  logging.info('Resuming from step %d in %s', step, manager.directory)
  return manager.restore(step, args=ocp.args.StandardRestore(target))


def _fine_tune_from(path, state, config, shardings):
  """`state` with the pretrained parameters of `path`, for this model."""
  params = checkpoint.load_pretrained(
      pretrained_path=path, init_params=jax.device_get(state.params),
      model_config=config.model, new_grid=models.token_grid(config))
  print(f'Fine-tuning from {path}.', flush=True)
  return state.replace(params=jax.device_put(params, shardings.params))


def create_train_state(config, model, mesh, manager):
  """(state, its shardings, steps done): restored, fine-tuned or fresh."""
  init_rng = jax.random.split(jax.random.key(config.seed))[0]
  image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init():
    variables = model.init(init_rng, jnp.zeros(image_shape), train=False)
    return TrainState.create(apply_fn=model.apply, params=variables['params'],
                             tx=make_optimizer(config))

  abstract = jax.eval_shape(init)  # raises on a bad image size
  shardings = sharding.tree_shardings(abstract, mesh, config.sharding_rules,
                                      config.sharding_strategy)
  if manager.latest_step() is not None:
    return (_restore(manager, abstract, shardings), shardings,
            manager.latest_step())
  path = pretrained_path(config)
  if path:
    storage.local_copy(path)  # fails fast; fetched once if remote
  state = jax.jit(init, out_shardings=shardings)()
  if path:
    state = _fine_tune_from(path, state, config, shardings)
  return state, shardings, 0


def make_step_fns(config, mesh, shardings):
  """The jitted train step (state donated) and eval step, on the mesh."""
  dropout_rng = jax.random.split(jax.random.key(config.seed))[1]
  batches = sharding.batch_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  train_fn = jax.jit(
      functools.partial(train_step, rng=dropout_rng, loss=config.loss),
      in_shardings=(shardings, batches), out_shardings=(shardings, replicated),
      donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, loss=config.loss),
                    in_shardings=(shardings, batches), out_shardings=replicated)
  return train_fn, eval_fn


# The loop's pieces.


def _global_batches(batches, mesh, batch_size):
  """Host batches -> global arrays split over the mesh's `data` axis."""
  data = sharding.batch_sharding(mesh)
  for batch in batches:
    yield jax.tree.map(lambda x: jax.make_array_from_process_local_data(
        data, x, (batch_size,) + x.shape[1:]), batch)


def _train_batches(info, config, mesh, start_step):
  """Global micro-batches from update `start_step` on."""
  micro_batch = config.batch // config.accum_steps
  return _global_batches(input_pipeline.train_iterator(
      info, config, batch_size=micro_batch,
      rows=sharding.process_rows(mesh, micro_batch),
      start_step=start_step * config.accum_steps), mesh, micro_batch)


class _Preemption:
  """A SIGTERM to any process makes every process save the same step, then stop.

  With several processes, JAX's preemption sync point names the step (the
  coordination service hears of the signal and picks a step all reach);
  alone, a SIGTERM handler sets a flag the loop checks.
  """

  def __init__(self):
    self._requested = False
    self._previous = None
    self._synced = jax.process_count() > 1

  def __enter__(self):
    if (not self._synced and
        threading.current_thread() is threading.main_thread()):
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM: saving a checkpoint, then stopping.')
    self._requested = True

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step`; called once per step."""
    if self._synced:
      return multihost_utils.reached_preemption_sync_point(step)
    return self._requested

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class Progress:
  """Collects losses on device; fetches, checks, prints and logs them.

  With `config.progress_bar` a tqdm bar (a widget in notebooks) replaces the
  printed lines.
  """

  def __init__(self, config, writer, start_step: int):
    self.config, self.writer = config, writer
    self.schedule = make_schedule(config)
    self.pending = []
    self.step, self.time = start_step, time.perf_counter()
    self.bar = tqdm.auto.tqdm(
        total=config.total_steps, initial=start_step, unit='step',
        disable=jax.process_index() > 0) if config.progress_bar else None

  def close(self):
    if self.bar is not None:
      self.bar.close()

  def add(self, loss):
    self.pending.append(loss)  # no host round-trip until `report`

  def restart_clock(self):
    """Leaves out of the speed what was not training (evaluation)."""
    self.time = time.perf_counter()

  def report(self, step: int):
    """Prints the mean loss since the last report; raises on a NaN."""
    losses = np.asarray(jax.device_get(self.pending), np.float64)
    self.pending = []
    if not np.all(np.isfinite(losses)):
      raise FloatingPointError(f'Loss became {losses[~np.isfinite(losses)][0]}'
                               f' by step {step}: training stopped.')
    config, now, loss = self.config, time.perf_counter(), float(losses.mean())
    img_s = (step - self.step) * config.batch / (now - self.time)
    lr = float(self.schedule(step - 1))
    eta = (config.total_steps - step) * config.batch / max(img_s, 1e-9)
    if self.bar is not None:
      self.bar.update(step - self.step)
      self.bar.set_postfix(loss=f'{loss:.4f}', lr=f'{lr:.3g}',
                           img_s=f'{img_s:.0f}')
    else:
      print(f'[{step}/{config.total_steps}] loss {loss:.4f}  '
            f'lr {lr:.3g}  {img_s:.0f} img/s  '
            f'ETA {datetime.timedelta(seconds=int(eta))}', flush=True)
    self.writer.write_scalars(step, {'train_loss': loss,
                                     'learning_rate': lr, 'img_per_sec': img_s})
    self.step, self.time = step, now


def _report(progress, step, manager):
  """A progress line; a NaN loss stops, naming the last good checkpoint."""
  try:
    progress.report(step)
  except FloatingPointError as e:
    manager.wait_until_finished()
    raise FloatingPointError(
        f'{e} The last good checkpoint is step {manager.latest_step()} in '
        f'{manager.directory}.') from None


def evaluate(eval_fn, state, info, config, mesh):
  """Accuracy and mean loss over every test example."""
  totals = None
  batches = input_pipeline.eval_batches(
      info, config,
      batch_size=input_pipeline.host_batch_size(config.batch_eval))
  for batch in _global_batches(batches, mesh, config.batch_eval):
    out = eval_fn(state, batch)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  totals = jax.device_get(totals)
  count = float(totals['count'])
  return {'accuracy': float(totals['correct']) / count,
          'loss': float(totals['loss']) / count, 'count': int(count)}


def _evaluate_and_report(eval_fn, state, info, config, mesh, writer, step):
  result = evaluate(eval_fn, state, info, config, mesh)
  print(f'[{step}/{config.total_steps}] test accuracy '
        f'{result["accuracy"]:.4f}  loss {result["loss"]:.4f}  '
        f'({result["count"]} examples)', flush=True)
  writer.write_scalars(step, {'eval_accuracy': result['accuracy'],
                              'eval_loss': result['loss']})
  return result


def _every(step: int, period: int) -> bool:
  return bool(period) and step % period == 0


def wrap_up(config, step, progress, manager, writer, finish_run):
  """After the loop: waits for the last save; `finish_run()` if the run is
  complete, else says how to continue."""
  progress.close()
  manager.wait_until_finished()
  manager.close()
  writer.flush()
  if step == config.total_steps:
    finish_run()
  else:
    print(f'Preempted: saved step {step} to {manager.directory}; rerun the '
          'same command to continue.', flush=True)


def finish(config, workdir, params, result, seconds):
  """Exports the final parameters as .npz and writes `results.json`."""
  export_npz(params, storage.join(workdir, f'{config.model_name}.npz'))
  step = config.total_steps
  write_results(config, workdir, result, step=step,
                 seconds_since_start=seconds)
  print(f'Done: {step} steps, test accuracy {result["accuracy"]:.4f}, '
        f'{seconds:.0f} s since start or resume.', flush=True)


def export_npz(params, path):
  """Writes params in the original release's .npz format (process 0)."""
  if not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
    params = multihost_utils.process_allgather(params, tiled=True)
  params = jax.device_get(params)
  if jax.process_index() == 0:
    checkpoint.save(params, path)


def _setup(config, workdir, max_to_keep=None):
  """The mesh, the dataset and the workdir's checkpoint manager of a run."""
  mesh = sharding.make_mesh(config.mesh)
  validate_config(config, mesh.shape['data'])
  info = input_pipeline.get_dataset_info(input_pipeline.get_builder(config),
                                         config)
  manager = ocp.CheckpointManager(
      storage.join(storage.absolute(workdir), 'checkpoints'),
      item_handlers=ocp.StandardCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep))
  return mesh, info, manager


def write_results(config, workdir, result, **extra):
  """`{workdir}/results.json` (process 0), naming the model, dataset and
  pretrained checkpoint for `scripts/collect_results.py` (`extra` wins)."""
  if jax.process_index() == 0:
    storage.write_json(storage.join(workdir, 'results.json'), {
        'model_name': config.model_name, 'dataset': config.dataset,
        'pretrained': pretrained_path(config), **result, **extra})


def _checkpoint_params(config, abstract_params, path):
  """A checkpoint's parameters, its head included, checked against the model."""
  params = checkpoint.scan_like(checkpoint.load(path), abstract_params)
  try:
    return checkpoint.inspect_params(params=params, expected=abstract_params,
                                     source=f'Checkpoint {path}')
  except checkpoint.CheckpointError as e:
    raise checkpoint.CheckpointError(
        f'{e}\nEvaluate with the model, number of classes and image size '
        f'(pp.crop={config.pp.crop}) the checkpoint was trained with.'
    ) from None


def evaluate_only(config: ml_collections.ConfigDict, workdir: str):
  """`trainer='evaluate'`: test accuracy and loss of a checkpoint, no training.

  The checkpoint is `pretrained_path` (or `{pretrained_dir}/{model_name}.npz`)
  with its own head, else the latest state in `workdir`. Writes
  `{workdir}/results.json`, as a training run does.
  """
  mesh, info, manager = _setup(config, workdir)
  model, path = make_model(config, info.num_classes), pretrained_path(config)
  if path is None and manager.latest_step() is None:
    raise FileNotFoundError(
        'Nothing to evaluate: set pretrained_path or pretrained_dir, or give '
        f'a workdir with checkpoints ({workdir} has none).')
  if path is None:
    state, shardings, step = create_train_state(config, model, mesh, manager)
  else:  # parameters only: no optimizer state to build
    image = jnp.zeros((1, config.pp.crop, config.pp.crop, 3))
    abstract = jax.eval_shape(lambda: model.init(
        jax.random.key(0), image, train=False))['params']
    state = TrainState.create(apply_fn=model.apply, tx=optax.identity(),
                              params=_checkpoint_params(config, abstract, path))
    shardings = sharding.tree_shardings(state, mesh, config.sharding_rules,
                                        config.sharding_strategy)
    state, step = jax.device_put(state, shardings), None
  manager.close()
  _, eval_fn = make_step_fns(config, mesh, shardings)
  result = evaluate(eval_fn, state, info, config, mesh)
  source = path or f'step {step} of {workdir}'
  print(f'{source}: test accuracy {result["accuracy"]:.4f}  loss '
        f'{result["loss"]:.4f}  ({result["count"]} examples)', flush=True)
  write_results(config, workdir, result, step=step, checkpoint=source)
  return result


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Trains (resuming from `workdir`), evaluates, returns the final params."""
  mesh, info, manager = _setup(config, workdir, config.max_to_keep)
  state, shardings, start = create_train_state(
      config, make_model(config, info.num_classes), mesh, manager)
  if start >= config.total_steps:
    print(f'{workdir} already holds the final step {start}; nothing to '
          'train.', flush=True)
    manager.close()
    return state.params

  train_fn, eval_fn = make_step_fns(config, mesh, shardings)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  if start == 0:
    writer.write_hparams(config.to_dict())
  fewshot_eval = (fewshot.Evaluator(config, mesh) if config.fewshot.every
                  else None)
  batches = _train_batches(info, config, mesh, start)
  progress, result = Progress(config, writer, start), {}
  t_start = time.perf_counter()
  with _Preemption() as preemption:
    for step in range(start + 1, config.total_steps + 1):
      for _ in range(config.accum_steps):
        state, metrics = train_fn(state, next(batches))
        progress.add(metrics['loss'])
      last, preempted = step == config.total_steps, preemption.reached(step)
      save = last or preempted or _every(step, config.checkpoint_every)
      if save or _every(step, config.progress_every):
        _report(progress, step, manager)
      if last or _every(step, config.eval_every):
        result = _evaluate_and_report(eval_fn, state, info, config, mesh,
                                      writer, step)
        progress.restart_clock()
      if fewshot_eval and (last or _every(step, config.fewshot.every)):
        result = dict(result, **fewshot_eval.report(state.params, writer,
                                                    step))
        progress.restart_clock()
      if save:
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
      if preempted:
        break

  wrap_up(config, step, progress, manager, writer, lambda: finish(
      config, workdir, state.params, result, time.perf_counter() - t_start))
  return state.params
