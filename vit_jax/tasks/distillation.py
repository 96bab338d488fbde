"""Distillation (`trainer='distill'`): a classifier that also learns from a
frozen teacher, as DeiT (Touvron et al., 2021).

A student with a distillation token returns two heads' logits in training:
the class head learns the labels, the distillation head the teacher's
predictions, each with weight 1/2 (DeiT's hard distillation: the teacher's
argmax; soft: its softened distribution, temperature T, scaled by T^2). A
student with one head learns both on it, weighted `1 - alpha` and `alpha`.
The teacher is any checkpoint a preset can load (`config.distill`), or the
`.npz` of a vit_jax run (its model from the run's `config.json`), run in
inference mode inside the same jitted step on the same (mixed) images; its
parameters are an argument of the step, never updated.
"""

import json

import chex
from etils import epath
import jax
import jax.numpy as jnp
import optax

from vit_jax import losses
from vit_jax import models
from vit_jax.data import mixing
from vit_jax.run import run_record
from vit_jax.checkpoints import loading
from vit_jax.tasks import classification
from vit_jax.tasks import registry

KINDS = ('hard', 'soft')


def distillation_loss(student, teacher, kind: str, temperature: float):
  """Per-example loss of `student` logits against `teacher` logits."""
  if kind == 'hard':
    target = jax.nn.one_hot(jnp.argmax(teacher, -1), teacher.shape[-1])
    return optax.softmax_cross_entropy(student, target)
  t = temperature
  return optax.kl_divergence(jax.nn.log_softmax(student / t),
                             jax.nn.softmax(teacher / t)) * t**2


def teacher_config(settings):
  """The teacher's model config: the preset `teacher_model`, else the model
  that the vit_jax run which wrote `teacher_path` recorded."""
  if settings.teacher_model:
    return models.MODEL_CONFIGS[settings.teacher_model].to_dict()
  record = epath.Path(settings.teacher_path).parent / run_record.CONFIG
  if not record.exists():
    raise ValueError(
        f'No {record}: set config.distill.teacher_model to the preset of '
        f'{settings.teacher_path}.')
  return json.loads(record.read_text())['model']


def load_teacher(config, num_classes: int):
  """(model, params) of `config.distill.teacher_path` (`teacher_config`),
  at the run's image size."""
  settings = config.distill
  model, params, _ = loading.load_model(
      teacher_config(settings), settings.teacher_path, config.pp.crop)
  if model.num_classes != num_classes:
    raise ValueError(
        f'The teacher {settings.teacher_path} has a head of '
        f'{model.num_classes} classes, the dataset {num_classes}.')
  return model, params


@registry.register
class Task(classification.Task):
  """Classification with a frozen teacher's predictions as a second target."""

  trainers = ('distill',)
  planned = False
  trains_patch_sizes = False

  @classmethod
  def input_files(cls, config):
    return super().input_files(config) + [
        ('distill.teacher_path', config.distill.teacher_path)]

  def __init__(self, config, workdir, mesh, *, training=True):
    super().__init__(config, workdir, mesh, training=training)
    settings = config.distill
    if settings.kind not in KINDS:
      raise ValueError(f'config.distill.kind={settings.kind!r}; expected one '
                       f'of {KINDS}.')
    if not 0. <= settings.alpha <= 1. or settings.temperature <= 0:
      raise ValueError('config.distill needs 0 <= alpha <= 1 and a positive '
                       f'temperature, got {settings.alpha}, '
                       f'{settings.temperature}.')
    if training:
      if not settings.teacher_path:
        raise ValueError('Distillation needs a teacher: set '
                         'config.distill.teacher_path (and teacher_model).')
      self.teacher, self.frozen = load_teacher(config, self.info.num_classes)

  def loss(self, outputs, labels, teacher_logits):
    """Per-example loss of the student's `outputs` (one head, or the class
    and distillation heads)."""
    settings = self.config.distill
    if isinstance(outputs, tuple):
      logits, distill_logits, alpha = *outputs, 0.5
    else:
      logits = distill_logits = outputs
      alpha = settings.alpha
    return ((1 - alpha) * losses.classification(logits, labels,
                                                      self.config.loss) +
            alpha * distillation_loss(distill_logits, teacher_logits,
                                      settings.kind, settings.temperature))

  def train_step(self, state, batch, *, rng, frozen):
    """One micro-batch: the teacher's logits, then the student's step."""
    chex.assert_rank(batch['image'], 4)
    dropout_rng = jax.random.fold_in(rng, state.step)  # as classification's
    # The teacher sees the student's images, mixed or not (as DeiT's).
    images, labels = mixing.augment(dropout_rng, batch['image'],
                                    batch['label'], self.config)
    teacher_logits = jax.lax.stop_gradient(self.teacher.apply(
        {'params': frozen}, images, train=False))

    def compute_loss(params):
      outputs = state.apply_fn({'params': params}, images, train=True,
                               rngs={'dropout': dropout_rng})
      return self.loss(outputs, labels, teacher_logits).mean()

    value, grads = jax.value_and_grad(compute_loss)(state.params)
    return state.apply_gradients(grads=grads), {'loss': value}
