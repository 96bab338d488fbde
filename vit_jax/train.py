"""Training and evaluation: one jitted step on a device mesh, Orbax resume."""

import functools
import json
import os
import signal
import threading
import time

from absl import logging
import chex
from clu import metric_writers
import flax
from flax.training import train_state
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import sharding

TrainState = train_state.TrainState


def make_model(config, num_classes: int):
  return models.model_class(config.model.model_name)(
      num_classes=num_classes, **config.model)


def pretrained_path(config):
  """`pretrained_path`, else `{pretrained_dir}/{model_name}.npz`, else None."""
  if config.pretrained_path:
    return config.pretrained_path
  if config.pretrained_dir:
    return os.path.join(config.pretrained_dir, f'{config.model_name}.npz')
  return None


def _token_grid(model, image_shape):
  """The (h, w) grid of patch tokens the model makes of `image_shape`."""
  def embed(x):
    return model.apply(
        model.init(jax.random.key(0), x, train=False), x, train=False,
        capture_intermediates=lambda mdl, _: mdl.name == 'embedding')
  _, inter = jax.eval_shape(embed, jnp.zeros(image_shape))
  if 'embedding' not in inter['intermediates']:
    return None  # a Mixer: its token count is fixed
  return tuple(inter['intermediates']['embedding']['__call__'][0].shape[1:3])


def make_schedule(config) -> optax.Schedule:
  """Linear warmup from 0 to base_lr, then cosine or linear decay to 0."""
  if config.decay_type == 'cosine':
    return optax.warmup_cosine_decay_schedule(
        0.0, config.base_lr, config.warmup_steps, config.total_steps)
  return optax.join_schedules([
      optax.linear_schedule(0.0, config.base_lr, config.warmup_steps),
      optax.linear_schedule(config.base_lr, 0.0,
                            config.total_steps - config.warmup_steps),
  ], [config.warmup_steps])


def make_optimizer(config) -> optax.GradientTransformation:
  """Clip by global norm -> SGD momentum or AdamW; accumulate micro-batches."""
  schedule = make_schedule(config)
  if config.optimizer == 'sgd':
    opt = optax.sgd(schedule, momentum=0.9)
  else:
    opt = optax.adamw(schedule, b1=0.9, b2=0.999,
                      weight_decay=config.weight_decay)
  if config.grad_norm_clip:
    opt = optax.chain(optax.clip_by_global_norm(config.grad_norm_clip), opt)
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
  mask = batch['mask']
  correct = jnp.argmax(logits, -1) == jnp.argmax(batch['label'], -1)
  return {'correct': jnp.sum(correct * mask),
          'loss': jnp.sum(loss_fn(logits, batch['label'], loss) * mask),
          'count': jnp.sum(mask)}


def validate_config(config, num_devices_data: int):
  """Fails fast, before any compilation, on inconsistent settings."""
  choices = {'optimizer': ('sgd', 'adamw'), 'loss': ('softmax_xent',
                                                     'sigmoid_xent'),
             'decay_type': ('cosine', 'linear'),
             'trainer': ('train', 'inference_time')}
  for key, allowed in choices.items():
    if config[key] not in allowed:
      raise ValueError(f'config.{key}={config[key]!r}; expected one of '
                       f'{allowed}.')
  if config.total_steps <= 0 or not 0 <= config.warmup_steps < (
      config.total_steps):
    raise ValueError(f'Need 0 <= warmup_steps ({config.warmup_steps}) < '
                     f'total_steps ({config.total_steps}).')
  micro = config.batch // config.accum_steps
  if config.batch % config.accum_steps or micro % num_devices_data:
    raise ValueError(
        f'batch={config.batch} must split into accum_steps='
        f'{config.accum_steps} micro-batches divisible by the {num_devices_data}'
        ' devices on the mesh `data` axis.')
  if config.batch_eval % num_devices_data:
    raise ValueError(f'batch_eval={config.batch_eval} is not divisible by the '
                     f'{num_devices_data} devices on the `data` axis.')


class _Preemption:
  """Turns SIGTERM into a flag the loop checks, so it can save first."""

  def __init__(self):
    self.requested = False
    self._previous = None

  def __enter__(self):
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
    return self

  def _handle(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM: saving a checkpoint, then stopping.')
    self.requested = True

  def __exit__(self, *exc):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def _flat_shapes(tree):
  flat = flax.traverse_util.flatten_dict(tree, sep='/')
  return {k: tuple(v.shape) for k, v in flat.items() if v is not None}


def check_checkpoint_fits(metadata_params, expected_params, where: str):
  """Raises a ValueError listing keys/shapes where a checkpoint differs."""
  have, want = _flat_shapes(metadata_params), _flat_shapes(expected_params)
  problems = [f'  {k}: checkpoint {have[k]} vs model {want[k]}'
              for k in sorted(set(have) & set(want)) if have[k] != want[k]]
  problems += [f'  {k}: missing from the checkpoint'
               for k in sorted(set(want) - set(have))]
  problems += [f'  {k}: not in the model'
               for k in sorted(set(have) - set(want))]
  if problems:
    raise ValueError(
        f'The checkpoint in {where} does not fit the configured model '
        f'({len(problems)} differences; first ones):\n' +
        '\n'.join(problems[:10]) +
        '\nUse a fresh --workdir, or the config that wrote this one.')


def _fetch_losses(pending, step):
  losses = np.asarray(jax.device_get(pending), np.float64)
  if not np.all(np.isfinite(losses)):
    raise FloatingPointError(f'Loss became {losses[~np.isfinite(losses)][0]}'
                             f' by step {step}: training stopped.')
  return float(losses.mean())


def evaluate(eval_fn, state, info, config, mesh):
  """Accuracy and mean loss over every test example."""
  totals = None
  bsh = sharding.batch_sharding(mesh)
  for batch in input_pipeline.eval_batches(
      info, config, batch_size=input_pipeline.host_batch_size(
          config.batch_eval)):
    batch = jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(bsh, x), batch)
    out = eval_fn(state, batch)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  totals = jax.device_get(totals)
  count = float(totals['count'])
  return {'accuracy': float(totals['correct']) / count,
          'loss': float(totals['loss']) / count, 'count': int(count)}


def _format_eta(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  return f'{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}'


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Trains (resuming from `workdir`), evaluates, returns the final params."""
  mesh = sharding.make_mesh(config.mesh)
  validate_config(config, mesh.shape['data'])
  path = pretrained_path(config)
  builder = input_pipeline.get_builder(config)
  info = input_pipeline.get_dataset_info(builder, config)
  model = make_model(config, info.num_classes)
  tx = make_optimizer(config)
  rng = jax.random.key(config.seed)
  init_rng, dropout_rng = jax.random.split(rng)
  image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init_state():
    variables = model.init(init_rng, jnp.zeros(image_shape), train=False)
    return TrainState.create(apply_fn=model.apply, params=variables['params'],
                             tx=tx)

  abstract = jax.eval_shape(init_state)  # raises on a bad image size
  state_sh = sharding.tree_shardings(abstract, mesh, config.sharding_rules)
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  bsh = sharding.batch_sharding(mesh)

  ckpt_dir = os.path.join(os.path.abspath(workdir), 'checkpoints')
  mngr = ocp.CheckpointManager(
      ckpt_dir, item_handlers=ocp.StandardCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.max_to_keep))
  latest = mngr.latest_step()
  if latest is None and path and not os.path.exists(path):
    raise FileNotFoundError(f'Pretrained checkpoint {path} does not exist.')
  if latest is not None:
    check_checkpoint_fits(mngr.item_metadata(latest).tree['params'],
                          abstract.params, ckpt_dir)
    target = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract, state_sh)
    state = mngr.restore(latest, args=ocp.args.StandardRestore(target))
    logging.info('Resumed from step %d in %s', latest, ckpt_dir)
  else:
    state = jax.jit(init_state, out_shardings=state_sh)()
    if path:
      params = checkpoint.load_pretrained(
          pretrained_path=path, init_params=jax.device_get(state.params),
          model_config=config.model,
          new_grid=_token_grid(model, image_shape))
      state = state.replace(params=jax.device_put(params, state_sh.params))
      print(f'Fine-tuning from {path}.', flush=True)
  start_step = latest or 0
  if start_step >= config.total_steps:
    print(f'{workdir} already holds the final step {start_step}; '
          'nothing to train.', flush=True)
    mngr.close()
    return state.params

  step_fn = jax.jit(
      functools.partial(train_step, rng=dropout_rng, loss=config.loss),
      in_shardings=(state_sh, bsh), out_shardings=(state_sh, repl),
      donate_argnums=0)
  eval_fn = jax.jit(functools.partial(eval_step, loss=config.loss),
                    in_shardings=(state_sh, bsh), out_shardings=repl)

  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  if start_step == 0:
    flat = flax.traverse_util.flatten_dict(config.to_dict(), sep='.')
    writer.write_hparams({k: v for k, v in flat.items()
                          if isinstance(v, (int, float, str, bool))})
  schedule = make_schedule(config)
  micro_batch = config.batch // config.accum_steps
  batches = input_pipeline.train_iterator(
      info, config, batch_size=input_pipeline.host_batch_size(micro_batch),
      start_step=start_step * config.accum_steps)

  t_start = t_mark = time.perf_counter()
  step_mark, pending, result = start_step, [], {}
  with _Preemption() as preemption:
    for step in range(start_step + 1, config.total_steps + 1):
      for _ in range(config.accum_steps):
        batch = jax.tree.map(
            lambda x: jax.make_array_from_process_local_data(bsh, x),
            next(batches))
        state, metrics = step_fn(state, batch)
        pending.append(metrics['loss'])

      last = step == config.total_steps
      save = (config.checkpoint_every and step % config.checkpoint_every == 0
              ) or last or preemption.requested
      if step % config.progress_every == 0 or save:
        try:
          loss = _fetch_losses(pending, step)
        except FloatingPointError as e:
          mngr.wait_until_finished()
          raise FloatingPointError(
              f'{e} The last good checkpoint is step {mngr.latest_step()} in '
              f'{ckpt_dir}.') from None
        pending = []
        now = time.perf_counter()
        img_s = (step - step_mark) * config.batch / (now - t_mark)
        lr = float(schedule(step - 1))
        eta = (config.total_steps - step) * config.batch / max(img_s, 1e-9)
        print(f'[{step}/{config.total_steps}] loss {loss:.4f}  lr {lr:.3g}  '
              f'{img_s:.0f} img/s  ETA {_format_eta(eta)}', flush=True)
        writer.write_scalars(step, {'train_loss': loss, 'learning_rate': lr,
                                    'img_per_sec': img_s})
        t_mark, step_mark = now, step

      if (config.eval_every and step % config.eval_every == 0) or last:
        result = evaluate(eval_fn, state, info, config, mesh)
        print(f'[{step}/{config.total_steps}] test accuracy '
              f'{result["accuracy"]:.4f}  loss {result["loss"]:.4f}  '
              f'({result["count"]} examples)', flush=True)
        writer.write_scalars(step, {'eval_accuracy': result['accuracy'],
                                    'eval_loss': result['loss']})
        t_mark = time.perf_counter()  # eval time is not training speed

      if save:
        mngr.save(step, args=ocp.args.StandardSave(state), force=True)
      if preemption.requested and not last:
        mngr.wait_until_finished()
        print(f'Preempted: saved step {step} to {ckpt_dir}; rerun the same '
              'command to continue.', flush=True)
        break

  mngr.wait_until_finished()
  mngr.close()
  writer.flush()
  if step == config.total_steps:
    export_npz(state.params, os.path.join(workdir, f'{config.model_name}.npz'))
    secs = time.perf_counter() - t_start
    if jax.process_index() == 0:
      with open(os.path.join(workdir, 'results.json'), 'w') as f:
        json.dump(dict(result, step=step, seconds_since_start=secs), f)
    print(f'Done: {config.total_steps} steps, test accuracy '
          f'{result["accuracy"]:.4f}, {secs:.0f} s since start or resume.',
          flush=True)
  return state.params


def export_npz(params, path):
  """Writes params in the original release's .npz format (process 0)."""
  if not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
    params = multihost_utils.process_allgather(params, tiled=True)
  params = jax.device_get(params)
  if jax.process_index() == 0:
    checkpoint.save(params, path)
