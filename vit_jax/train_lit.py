"""LiT training (`trainer='lit'`): a text tower learns to match a locked image
tower, with the softmax or sigmoid contrastive loss (`config.lit.loss`).

The image tower is locked three ways: its embeddings are computed outside
the gradient (under `stop_gradient`), the optimizer gives its parameters no
update and keeps no state for them (`optax.multi_transform` with
`set_to_zero`), and it runs in inference mode (no dropout; a ViT has no
batch statistics). The loop is `train.train_and_evaluate`'s, with the
zero-shot accuracy as the evaluation.
"""

import functools
import time

from clu import metric_writers
from etils import epath
from flax import traverse_util
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp

from vit_jax import caption_data
from vit_jax import checkpoint
from vit_jax import contrastive_losses
from vit_jax import input_pipeline
from vit_jax import models_bert
from vit_jax import models_lit
from vit_jax import sharding
from vit_jax import storage
from vit_jax import tokenizers
from vit_jax import train
from vit_jax import zeroshot


def make_lit_model(config):
  return models_lit.LitModel(**config.model)


def validate_lit_config(config, num_devices_data: int):
  """Fails fast on settings a LiT run cannot use."""
  if config.lit.loss not in contrastive_losses.LOSSES:
    raise ValueError(f'config.lit.loss={config.lit.loss!r}; expected one of '
                     f'{tuple(contrastive_losses.LOSSES)}.')
  if config.lit.loss == 'sigmoid' and config.model.bias_init is None:
    raise ValueError("config.lit.loss='sigmoid' needs a learned bias: set "
                     'config.model.bias_init (SigLIP uses -10).')
  zeroshot.check_templates(config.zeroshot.templates)
  if config.model.pp.tokenizer_name not in tokenizers.TOKENIZERS:
    raise ValueError(f'config.model.pp.tokenizer_name='
                     f'{config.model.pp.tokenizer_name!r}; expected one of '
                     f'{tokenizers.TOKENIZERS}.')
  train.validate_config(config, num_devices_data)


def abstract_params(config, model):
  """The model's parameter shapes, for the configured image and text sizes.

  Raises if the towers' embeddings differ in width (`out_dim`).
  """
  images = jnp.zeros((1, config.pp.crop, config.pp.crop, 3))
  tokens = jnp.zeros((1, config.model.pp.max_len), jnp.int32)
  (zimg, ztxt, _), variables = jax.eval_shape(lambda: model.init_with_output(
      jax.random.key(0), images=images, tokens=tokens))
  if zimg.shape[-1] != ztxt.shape[-1]:
    raise ValueError(
        f'The image tower embeds in {zimg.shape[-1]} dimensions, the text '
        f'tower in {ztxt.shape[-1]}: set config.model.out_dim (image, text) '
        'so that they agree.')
  return variables['params']


def get_tokenizer(config, workdir):
  """The configured vocabulary; without one, SentencePiece fitted to the
  training captions once, in `{workdir}/vocab.model`."""
  path = zeroshot.vocab_path(config, workdir)
  if not config.lit.vocab_path and not epath.Path(path).exists():
    if config.model.pp.tokenizer_name != 'sentencepiece':
      raise ValueError('Only a SentencePiece vocabulary can be fitted here; '
                       'set config.lit.vocab_path to a BERT vocab.txt.')
    if jax.process_count() > 1:  # each process would fit its own
      raise ValueError('Fit the vocabulary in a one-process run, or set '
                       'config.lit.vocab_path, for a multi-process run.')
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    tokenizers.train_sentencepiece(caption_data.all_captions(config), path,
                                   config.model.text.vocab_size)
  tokenizer = tokenizers.get_tokenizer(config.model.pp.tokenizer_name, path,
                                       config.model.pp.max_len)
  text = config.model.text
  if config.model.text_model == 'bert':
    vocab = models_bert.BERT_CONFIGS[text.get('config', 'base')][4]
  else:
    vocab = text.get('vocab_size', models_lit.TextTransformer.vocab_size)
  if tokenizer.vocab_size > vocab:
    raise ValueError(f'The vocabulary {path} has {tokenizer.vocab_size} '
                     f'tokens, the text tower only {vocab} embeddings.')
  return tokenizer


def _locked(params):
  """Optimizer labels: the image tower 'locked', the rest 'trained'."""
  flat = traverse_util.flatten_dict(params)
  return traverse_util.unflatten_dict(
      {k: 'locked' if k[0] == 'img' else 'trained' for k in flat})


def make_lit_optimizer(config):
  return optax.multi_transform(
      {'trained': train.make_optimizer(config), 'locked': optax.set_to_zero()},
      _locked)


def _image_tower(path, expected):
  """The image tower's parameters from an image-model or a LiT `.npz`."""
  params = checkpoint.load(path)
  params = params.get('img', params)  # a LiT file holds the tower under img
  if 'head' not in expected:
    params.pop('head', None)  # a classifier's head: not a projection here
  return checkpoint.inspect_params(
      params=checkpoint.scan_like(params, expected), expected=expected,
      source=f'Image tower {path}')


def create_lit_state(config, model, mesh, manager):
  """(state, shardings, steps done): restored, or fresh with the locked
  tower from `config.lit.image_init` (or all from `pretrained_path`)."""
  init_rng = jax.random.key(config.seed)
  images = jnp.zeros((1, config.pp.crop, config.pp.crop, 3))
  tokens = jnp.zeros((1, config.model.pp.max_len), jnp.int32)

  def init():
    params = model.init(init_rng, images=images, tokens=tokens)['params']
    return train.TrainState.create(apply_fn=model.apply, params=params,
                                   tx=make_lit_optimizer(config))

  abstract = jax.eval_shape(init)
  shardings = sharding.tree_shardings(abstract, mesh, config.sharding_rules,
                                      config.sharding_strategy)
  if manager.latest_step() is not None:
    return (train._restore(manager, abstract, shardings), shardings,  # pylint: disable=protected-access
            manager.latest_step())
  full = train.pretrained_path(config)
  if not (full or config.lit.image_init):
    raise ValueError('A locked image tower needs weights: set '
                     'config.lit.image_init (an image model .npz) or '
                     'pretrained_path (a LiT .npz).')
  for path in (full, config.lit.image_init):
    if path:
      storage.local_copy(path)  # fails fast; fetched once if remote
  state = jax.jit(init, out_shardings=shardings)()
  params = jax.device_get(state.params)
  if full:
    params = checkpoint.inspect_params(params=checkpoint.load(full),
                                       expected=abstract.params,
                                       source=f'Checkpoint {full}')
  else:
    params['img'] = _image_tower(config.lit.image_init, abstract.params['img'])
  return (state.replace(params=jax.device_put(params, shardings.params)),
          shardings, 0)


def lit_train_step(state, batch, *, rng, loss):
  """One step on the text tower (and t, b) against locked image embeddings."""
  params = state.params
  zimg, _, _ = state.apply_fn({'params': params}, images=batch['image'])
  zimg = jax.lax.stop_gradient(zimg)
  loss_fn = contrastive_losses.LOSSES[loss]

  def compute_loss(params):
    _, ztxt, out = state.apply_fn(
        {'params': params}, tokens=batch['tokens'], train=True,
        rngs={'dropout': jax.random.fold_in(rng, state.step)})
    b = out['b'][0] if 'b' in out else None
    return loss_fn(zimg, ztxt, out['t'][0], b), (ztxt, out['t'][0])

  (value, (ztxt, t)), grads = jax.value_and_grad(
      compute_loss, has_aux=True)(params)
  metrics = {'loss': value, 'temperature': t,
             'retrieval': contrastive_losses.retrieval_accuracy(zimg, ztxt)}
  return state.apply_gradients(grads=grads), metrics


def _evaluate_and_report(evaluate, state, writer, step, config):
  result = evaluate(state.params)
  print(f'[{step}/{config.total_steps}] zero-shot accuracy '
        f'{result["zeroshot_accuracy"]:.4f} ({result["count"]} examples)',
        flush=True)
  writer.write_scalars(step, {'zeroshot_accuracy':
                              result['zeroshot_accuracy']})
  return result


def _setup(config, workdir):
  """Mesh, dataset, class names, model, tokenizer and checkpoint manager,
  after every check that needs no compilation."""
  mesh = sharding.make_mesh(config.mesh)
  validate_lit_config(config, mesh.shape['data'])
  eval_config = zeroshot.eval_config(config)
  info = input_pipeline.get_dataset_info(
      input_pipeline.get_builder(eval_config), eval_config)
  names = zeroshot.class_names(eval_config, info)
  caption_data.check_class_captions(config)
  model = make_lit_model(config)
  abstract_params(config, model)  # checks the towers' widths agree
  manager = ocp.CheckpointManager(
      storage.join(storage.absolute(workdir), 'checkpoints'),
      item_handlers=ocp.StandardCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(max_to_keep=config.max_to_keep))
  tokenizer = get_tokenizer(config, workdir)  # reads the training captions
  return mesh, info, names, model, tokenizer, manager


def _make_step_fn(config, mesh, shardings):
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(
      functools.partial(lit_train_step, rng=jax.random.key(config.seed + 1),
                        loss=config.lit.loss),
      in_shardings=(shardings, sharding.batch_sharding(mesh)),
      out_shardings=(shardings, replicated), donate_argnums=0)


def _finish(config, workdir, params, result, seconds):
  train.export_npz(params, storage.join(workdir, f'{config.model_name}.npz'))
  train.write_results(config, workdir, result, step=config.total_steps,
                      seconds_since_start=seconds)
  print(f'Done: {config.total_steps} steps, zero-shot accuracy '
        f'{result["zeroshot_accuracy"]:.4f}, {seconds:.0f} s.', flush=True)


def train_lit(config, workdir):
  """Trains the text tower (resuming from `workdir`); exports the LiT .npz
  and writes results.json with the final zero-shot accuracy."""
  mesh, info, names, model, tokenizer, manager = _setup(config, workdir)
  state, shardings, start = create_lit_state(config, model, mesh, manager)
  if start >= config.total_steps:
    print(f'{workdir} already holds the final step {start}.', flush=True)
    manager.close()
    return state.params
  step_fn = _make_step_fn(config, mesh, shardings)
  evaluate = zeroshot.make_evaluator(model, tokenizer, names, info,
                                     zeroshot.eval_config(config), mesh)
  writer = metric_writers.create_default_writer(
      workdir, just_logging=jax.process_index() > 0)
  batches = train._global_batches(caption_data.train_iterator(  # pylint: disable=protected-access
      config, tokenizer, batch_size=config.batch, start_step=start,
      rows=sharding.process_rows(mesh, config.batch)), mesh, config.batch)
  progress, result = train.Progress(config, writer, start), {}
  t_start = time.perf_counter()
  every = train._every  # pylint: disable=protected-access
  with train._Preemption() as preemption:  # pylint: disable=protected-access
    for step in range(start + 1, config.total_steps + 1):
      state, metrics = step_fn(state, next(batches))
      progress.add(metrics['loss'])
      last, preempted = step == config.total_steps, preemption.reached(step)
      save = last or preempted or every(step, config.checkpoint_every)
      if save or every(step, config.progress_every):
        train._report(progress, step, manager)  # pylint: disable=protected-access
        writer.write_scalars(step, {k: float(metrics[k])
                                    for k in ('temperature', 'retrieval')})
      if last or every(step, config.eval_every):
        result = _evaluate_and_report(evaluate, state, writer, step, config)
        progress.restart_clock()
      if save:
        manager.save(step, args=ocp.args.StandardSave(state), force=True)
      if preempted:
        break
  train.wrap_up(config, step, progress, manager, writer, lambda: _finish(
      config, workdir, state.params, result, time.perf_counter() - t_start))
  return state.params
