"""Self-distillation without labels (`trainer='dino'`): DINO (Caron et al.,
2021), with DINOv2's options (Oquab et al., 2024).

A student sees every crop of an image (`data/multicrop.py`: two global,
`num_local` local) and learns to give, for each, the scores over K
prototypes that a teacher gives for the other global crop
(`losses.dino_loss`). The teacher is an exponential moving average of the
student, its momentum rising from `momentum_teacher` to 1 on a cosine;
its scores are sharpened (temperature warmed up from
`warmup_teacher_temp` to `teacher_temp`) and centred, by an EMA of their
batch mean (`centering='softmax'`) or by Sinkhorn-Knopp ('sinkhorn').
With `ibot_weight` the student's global crops have patches masked and it
matches the teacher's scores of the unmasked patches there (iBOT); with
`koleo_weight`, KoLeo spreads the student's class tokens. The head's last
layer is frozen for the first `freeze_last_layer_epochs`.

Teacher, centres and student are the train state's parameters (the
teacher and centres labelled frozen: no gradient, no optimizer state), so
they are checkpointed and sharded like any. The evaluators and the
exported `{workdir}/{model_name}.npz` see the teacher's encoder, a
published-layout ViT.
"""

import chex
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.data import multicrop
from vit_jax.data import pipeline
from vit_jax.models import dino as models_dino
from vit_jax.models import posemb
from vit_jax.models import vit as models_vit
from vit_jax.run import optim
from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.tasks import base
from vit_jax.tasks import registry

CENTERING = ('softmax', 'sinkhorn')
FROZEN_KEYS = ('teacher', 'center', 'ibot_center')


def check_settings(config):
  """Fails fast on `config.dino` and what DINO cannot train."""
  s = config.get('dino')
  if s is None:
    raise ValueError("config.trainer='dino' needs config.dino (see "
                     'configs/dino_fmnist.py).')
  missing = [k for k in models_dino.HEAD_KEYS if k not in s.head]
  if missing:
    raise ValueError(f'config.dino.head lacks {missing}.')
  if s.centering not in CENTERING:
    raise ValueError(f'config.dino.centering={s.centering!r}; expected one '
                     f'of {CENTERING}.')
  if not 0 <= s.momentum_teacher < 1 or not 0 <= s.center_momentum < 1:
    raise ValueError('config.dino: momentum_teacher and center_momentum must '
                     'be in [0, 1).')
  if min(s.student_temp, s.teacher_temp, s.warmup_teacher_temp) <= 0:
    raise ValueError('config.dino: temperatures must be positive.')
  lo, hi = s.mask_ratio
  if not 0 < lo <= hi < 1 or not 0 <= s.mask_probability <= 1:
    raise ValueError(f'config.dino: mask_ratio={tuple(s.mask_ratio)} needs '
                     '0 < min <= max < 1, mask_probability in [0, 1].')
  if config.accum_steps > 1:
    raise ValueError('config.trainer=\'dino\' takes accum_steps=1: the '
                     "teacher's average follows every optimizer update.")
  return s


def teacher_momentum(step, total_steps: int, base_momentum: float):
  """DINO's cosine schedule from `base_momentum` (step 0) to 1 (the end)."""
  progress = jnp.minimum(step / max(total_steps, 1), 1.)
  return 1 - (1 - base_momentum) * (jnp.cos(jnp.pi * progress) + 1) / 2


def teacher_temperature(step, settings, warmup_steps: int):
  """Linear from `warmup_teacher_temp` to `teacher_temp` over the warm-up,
  then constant."""
  progress = jnp.minimum(step / max(warmup_steps, 1), 1.)
  return settings.warmup_teacher_temp + progress * (
      settings.teacher_temp - settings.warmup_teacher_temp)


def ema(teacher, student, momentum):
  """teacher <- momentum * teacher + (1 - momentum) * student."""
  return jax.tree.map(lambda t, s: momentum * t + (1 - momentum) * s,
                      teacher, student)


def crop_major(views):
  """(B, V, H, W, C) -> (V * B, H, W, C): view 0 of every image first."""
  return jnp.swapaxes(views, 0, 1).reshape(-1, *views.shape[2:])


def by_view(x, batch: int):
  """(V * B, ...) -> (V, B, ...), B = `batch` images."""
  return x.reshape(-1, batch, *x.shape[1:])


def targets(scores, center, temperature, settings, valid=None):
  """The teacher's target distributions: centred softmax or Sinkhorn."""
  if settings.centering == 'sinkhorn':
    return losses.sinkhorn_knopp(scores, temperature,
                                 settings.sinkhorn_iterations, valid)
  return losses.centered_softmax(scores, center, temperature)


def new_center(center, scores, momentum, weight=None):
  """EMA of the scores' (weighted) mean over the global batch."""
  if weight is None:
    mean = jnp.mean(scores, axis=0, keepdims=True)
  else:
    w = (weight > 0).astype(scores.dtype)[:, None]
    mean = jnp.sum(scores * w, 0, keepdims=True) / jnp.maximum(jnp.sum(w), 1)
  return momentum * center + (1 - momentum) * mean


def keep_last_layer(new, old, frozen):
  """`new`, but the head's last layer from `old` while `frozen` (DINO's
  first epoch, which would otherwise collapse the prototypes early): its
  gradient is zeroed and the update undone, so that it gets neither
  momentum nor weight decay, as a PyTorch parameter without a gradient."""
  def keep(path, n, o):
    names = {getattr(k, 'key', None) for k in path}
    return jnp.where(frozen, o, n) if models_dino.LAST_LAYER in names else n
  return jax.tree_util.tree_map_with_path(keep, new, old)


def teacher_targets(params, teacher, temperature, settings, weight):
  """(class-token targets (2, B, K), masked-patch targets (2B, m, K) or
  None) of the teacher's outputs."""
  cls = targets(teacher['dino'], params['center'], temperature, settings)
  cls = by_view(cls, cls.shape[0] // 2)
  if 'ibot' not in teacher:
    return cls, None
  n, m, k = teacher['ibot'].shape
  patches = targets(teacher['ibot'].reshape(n * m, k), params['ibot_center'],
                    temperature, settings, valid=weight.reshape(-1) > 0)
  return cls, patches.reshape(n, m, k)


def student_loss(student, model, images, local_images, rngs, masks, cls,
                 patches, settings):
  """(weighted sum, its terms) of the student on the global crops (masked)
  and the local crops."""
  mask, masked, weight = masks
  out = model.apply({'params': student}, images, train=True, mask=mask,
                    masked=masked, rngs={'dropout': rngs[0]})
  batch = images.shape[0] // 2  # images: the two global crops of each
  views = [by_view(out['dino'], batch)]
  if local_images is not None:
    local = model.apply({'params': student}, local_images, train=True,
                        rngs={'dropout': rngs[1]})
    views.append(by_view(local['dino'], batch))
  terms = {'dino_loss': losses.dino_loss(jnp.concatenate(views), cls,
                                         settings.student_temp)}
  if patches is not None:
    terms['ibot_loss'] = losses.ibot_loss(out['ibot'], patches, weight,
                                          settings.student_temp)
  if settings.koleo_weight:
    terms['koleo_loss'] = sum(losses.koleo_loss(c)
                              for c in by_view(out['cls'], batch))
  weights = {'dino_loss': settings.dino_weight,
             'ibot_loss': settings.ibot_weight,
             'koleo_loss': settings.koleo_weight}
  return sum(weights[k] * v for k, v in terms.items()), terms


def train_step(state, batch, rng, *, model, settings, schedule):
  """One DINO update: the teacher's targets, the student's gradient step,
  then the teacher's average and the centres. `schedule`: the run's
  `total_steps`, and the warm-up and frozen last layer in steps."""
  chex.assert_rank(batch['global'], 5)
  params, step = state.params, state.step
  images = crop_major(batch['global'])
  local_images = crop_major(batch['local']) if 'local' in batch else None
  rng_mask, rng_global, rng_local = jax.random.split(
      jax.random.fold_in(rng, step), 3)
  masks = (None, None, None)
  if settings.ibot_weight:
    grid = posemb.token_grid(model.encoder, images.shape[1:3])
    masks = models_dino.random_masks(
        rng_mask, images.shape[0], grid[0] * grid[1],
        probability=settings.mask_probability, ratio=settings.mask_ratio)
  temperature = teacher_temperature(step, settings, schedule['warmup'])
  teacher = jax.lax.stop_gradient(model.apply(
      {'params': params['teacher']}, images, train=False, masked=masks[1]))
  cls, patches = teacher_targets(params, teacher, temperature, settings,
                                 masks[2])

  (value, terms), grads = jax.value_and_grad(
      lambda p: student_loss(p['student'], model, images, local_images,
                             (rng_global, rng_local), masks, cls, patches,
                             settings), has_aux=True)(params)
  frozen = step < schedule['freeze']
  grads = keep_last_layer(grads, jax.tree.map(jnp.zeros_like, grads), frozen)
  state = state.apply_gradients(grads=grads)
  momentum = teacher_momentum(step, schedule['total'],
                              settings.momentum_teacher)
  new = dict(state.params)
  new['student'] = keep_last_layer(new['student'], params['student'], frozen)
  new['teacher'] = ema(params['teacher'], new['student'], momentum)
  if settings.centering == 'softmax':
    m = settings.center_momentum
    new['center'] = new_center(params['center'], teacher['dino'], m)
    if patches is not None:
      n = teacher['ibot'].shape[0] * teacher['ibot'].shape[1]
      new['ibot_center'] = new_center(
          params['ibot_center'], teacher['ibot'].reshape(n, -1), m,
          masks[2].reshape(n))
  return state.replace(params=new), {
      'loss': value, **terms, 'teacher_momentum': momentum,
      'teacher_temp': temperature}


def param_labels(params):
  """The student is trained; teacher and centres are not."""
  return {k: optim.FROZEN if k in FROZEN_KEYS else optim.TRAINED
          for k in params}


@registry.register
class Task(base.Task):
  """DINO: a student, its EMA teacher; the teacher's encoder is exported."""

  trainers = ('dino',)

  param_labels = staticmethod(param_labels)

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del training, workdir
    self.settings = s = check_settings(config)
    self.config, self.mesh = config, mesh
    encoder = models_vit.pretrained_encoder_config(config.model.to_dict(),
                                                   'DINO')
    patch = models_vit.patch_size(config.model.patches)
    multicrop.check(s.crops, config.pp.crop, patch)
    self.grid = posemb.token_grid(config.model, (config.pp.crop,) * 2)
    self.info = info or pipeline.dataset_info(
        pipeline.get_builder(config), config)
    student = dict(encoder)
    if student.get('posemb', 'learn') == 'learn' and s.crops.num_local:
      # The local crops' grid is smaller: the table is resized to it.
      student['posemb_grid'] = student.get('posemb_grid') or self.grid
    self.model = models_dino.DinoModel(
        encoder=student, head=dict(s.head),
        ibot_head=dict(s.ibot_head) if s.get('ibot_head') else None)
    self.encoder = models_vit.VisionTransformer(num_classes=None, **encoder)
    epoch = max(self.info.num_train // config.batch, 1)
    self.schedule = dict(
        total=config.total_steps,
        warmup=round(s.warmup_teacher_temp_epochs * epoch),
        freeze=round(s.freeze_last_layer_epochs * epoch))
    self.image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init_params(self, rng):
    """Student and teacher equal (DINO's start), centres zero."""
    patches = self.grid[0] * self.grid[1]
    student = self.model.init(
        rng, jnp.zeros(self.image_shape), train=False,
        mask=jnp.zeros((1, patches), bool),
        masked=jnp.zeros((1, 1), jnp.int32))['params']
    k = self.settings.head.num_prototypes
    k_ibot = (self.settings.get('ibot_head') or self.settings.head)[
        'num_prototypes']
    return {'student': student,
            'teacher': jax.tree.map(jnp.copy, student),
            'center': jnp.zeros((1, k)), 'ibot_center': jnp.zeros((1, k_ibot))}

  @property
  def exported_model(self):
    return self.encoder

  def exported_params(self, params):
    return {k: v for k, v in params['teacher']['encoder'].items()
            if k != 'mask_token'}

  def initial_params(self, params):
    """Student and teacher from the encoder at `pretrained_path`, or None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    mask_token = params['student']['encoder']['mask_token']
    loaded = loading.load_params(
        path, init_params=self.exported_params(params),
        model_config=self.config.model, new_grid=self.grid)
    for key in ('student', 'teacher'):
      params[key]['encoder'] = {**loaded, 'mask_token': mask_token}
    print(f'DINO from the encoder {path}.', flush=True)
    return params

  def train_step(self, state, batch, *, rng):
    return train_step(state, batch, rng, model=self.model,
                      settings=self.settings, schedule=self.schedule)

  def batches(self, *, batch_size, rows, start_step):
    """This process's rows of the views of the training images."""
    return pipeline.train_iterator(
        self.info, self.config, batch_size=batch_size, start_step=start_step,
        rows=rows, example=multicrop.example_fn(self.config))
