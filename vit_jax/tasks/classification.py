"""Supervised classification (`trainer='train'`): images and labels, softmax
or sigmoid cross-entropy, from scratch or fine-tuned from a checkpoint; with
`model.patch_sizes`, a FlexiViT (each step at a random patch size)."""

import functools

import chex
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax import models
from vit_jax.data import mixing
from vit_jax.data import pipeline
from vit_jax.models import posemb
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.tasks import base
from vit_jax.tasks import registry


def make_model(config, num_classes: int):
  """The model of `config.model`; `patch_sizes` is training's, not its."""
  kwargs = {k: v for k, v in config.model.items() if k != 'patch_sizes'}
  cls = models.model_class(config.model_name, config.model)
  return cls(num_classes=num_classes, **kwargs)


def patch_index(rng, step, count: int):
  """Which of `count` patch sizes (FlexiViT) optimizer step `step` trains
  at: uniform, from (rng, step) alone, so that a resumed run draws the
  same sizes."""
  key = jax.random.fold_in(jax.random.fold_in(rng, step), count)
  return jax.random.randint(key, (), 0, count)


def train_step(state, batch, *, rng, config):
  """One micro-batch: gradients, then the (accumulating) optimizer update.
  `config` gives the loss, mixing and label smoothing."""
  chex.assert_rank(batch['image'], 4)
  chex.assert_equal_shape_prefix([batch['image'], batch['label']], 1)
  dropout_rng = jax.random.fold_in(rng, state.step)
  # Mixup/CutMix over the global batch, label smoothing (config.mixup,
  # config.label_smoothing); off: the batch as it came.
  images, labels = mixing.augment(dropout_rng, batch['image'], batch['label'],
                                  config)

  def compute_loss(params, **patch_size):
    logits = state.apply_fn({'params': params}, images, train=True,
                            rngs={'dropout': dropout_rng}, **patch_size)
    return losses.classification(logits, labels, config.loss).mean()

  sizes = (config.get('model') or {}).get('patch_sizes')
  if not sizes:
    value, grads = jax.value_and_grad(compute_loss)(state.params)
    return state.apply_gradients(grads=grads), {'loss': value}
  # Token counts differ between patch sizes, so each size is its own
  # program: all are branches of one lax.switch, drawn on the device. One
  # jitted step on the mesh, compiled once; only the drawn branch runs.
  # Micro-batches of one optimizer step share its size.
  index = patch_index(rng, state.step // config.accum_steps, len(sizes))
  value, grads = jax.lax.switch(index, [
      jax.value_and_grad(functools.partial(compute_loss, patch_size=p))
      for p in sizes], state.params)
  return state.apply_gradients(grads=grads), {
      'loss': value, 'patch_size': jnp.asarray(sizes)[index]}


@registry.register
class Task(base.Task):
  """The model, its initial parameters, step and batches of a classifier."""

  trainers = ('train', 'classification')
  planned = True
  trains_patch_sizes = True

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del workdir
    if config.loss not in losses.CLASSIFICATION:
      raise ValueError(f'config.loss={config.loss!r}; expected one of '
                       f'{losses.CLASSIFICATION}.')
    if (config.model.get('classifier') == 'distilled' and
        config.trainer in ('train', 'classification')):
      raise ValueError("A model with a distillation token trains with a "
                       "teacher: set config.trainer='distill' and "
                       'config.distill.teacher_path.')
    mixing.check_config(config)  # before anything compiles
    self.config, self.mesh = config, mesh
    num_classes = None  # evaluating a file: its head (`checkpoint`)
    self.info = info
    if info is None and (training or
                         not pretrained.pretrained_path(config)):
      self.info = pipeline.dataset_info(
          pipeline.get_builder(config), config)
    if self.info is not None:
      num_classes = self.info.num_classes
    self.model = make_model(config, num_classes)
    self.image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init_params(self, rng, model=None):
    model = model or self.model
    return model.init(rng, jnp.zeros(self.image_shape), train=False)['params']

  def initial_params(self, params):
    """The pretrained parameters with this model's head, or None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    # A ViT's table goes to the grid of `pp.crop` (other models have none,
    # or change it from stage to stage).
    grid = self.config.model.get('posemb_grid') or (
        posemb.token_grid(self.config.model, (self.config.pp.crop,) * 2)
        if isinstance(self.model, models.VisionTransformer) else None)
    params = loading.load_params(
        path, init_params=params, model_config=self.config.model,
        new_head=True, new_grid=grid)
    print(f'Fine-tuning from {path}.', flush=True)
    return params

  def drawn_keys(self):
    """Fine-tuning: only the new head (and `pre_logits`, for a file without
    them) is the model's initial one."""
    if not pretrained.pretrained_path(self.config):
      return None
    return ('head', 'head_dist', 'pre_logits')

  def train_step(self, state, batch, *, rng):
    return train_step(state, batch, rng=rng, config=self.config)

  def abstract_batch(self, batch_size):
    """The shapes and dtypes of a training micro-batch (`batches`)."""
    return {'image': jax.ShapeDtypeStruct(
                (batch_size, *self.image_shape[1:]), jnp.float32),
            'label': jax.ShapeDtypeStruct(
                (batch_size, self.info.num_classes), jnp.float32)}

  def batches(self, *, batch_size, rows, start_step):
    """This process's rows of the training micro-batches."""
    return pipeline.train_iterator(
        self.info, self.config, batch_size=batch_size, rows=rows,
        start_step=start_step)

  def checkpoint(self, path):
    """(model, params) of the checkpoint at `path` (an .npz or a workdir):
    its head and pre-logits, at `pp.crop`; a position table made for
    another resolution is resized as fine-tuning does (its note says so)."""
    try:
      model, params, _ = loading.load_model(self.config.model, path,
                                               self.config.pp.crop)
    except files.CheckpointError as e:
      raise files.CheckpointError(
          f'{e}\nEvaluate with the model and number of classes the '
          'checkpoint was trained with (--config.model_name=PRESET gives a '
          "preset's whole model).") from None
    return model, params
