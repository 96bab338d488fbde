"""Video classification (`trainer='video'`): a ViViT (Arnab et al., 2021,
`models.vivit`) or a TimeSformer (`models.timesformer`) trained on clips, on the shared loop (mesh, bf16, remat,
resume, export).

Settings under `config.video`: `frames` (the clip the model sees),
`stride` (between its frames), `test_views` (temporal crops whose logits
the test averages, `evaluators.video`) and `kernel_init`: how an image
checkpoint's patch kernel becomes the tubelet kernel when
`pretrained_path` is an image model's ('central_frame' or 'average',
`checkpoints.inflate`). A video checkpoint (a ViViT export) loads as it is.
"""

import chex
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.checkpoints import inflate
from vit_jax.checkpoints import pretrained
from vit_jax.data import mixing
from vit_jax.data import pipeline
from vit_jax.data import video as video_data
from vit_jax.tasks import base
from vit_jax.tasks import classification
from vit_jax.tasks import registry

SETTINGS = ('frames', 'stride', 'test_views', 'kernel_init')


def check_settings(config):
  """Fails fast on `config.video` and on a model that takes no clips."""
  settings = config.get('video')
  if settings is None:
    raise ValueError("config.trainer='video' needs config.video (see "
                     'configs/vivit_fmnist.py).')
  missing = [k for k in SETTINGS if k not in settings]
  if missing:
    raise ValueError(f'config.video lacks {missing}.')
  for key in ('frames', 'stride', 'test_views'):
    if not isinstance(settings[key], int) or settings[key] < 1:
      raise ValueError(f'config.video.{key}={settings[key]!r}: expected a '
                       'positive integer.')
  if settings.kernel_init not in inflate.KERNEL_INITS:
    raise ValueError(f'config.video.kernel_init={settings.kernel_init!r}: '
                     f'expected one of {inflate.KERNEL_INITS}.')
  model = config.model or {}
  # A TimeSformer (`attention_type`) embeds each frame: a tubelet of 1.
  tubelet = model.get('tubelet', 1 if 'attention_type' in model else None)
  if tubelet is None:
    raise ValueError(f"trainer='video' trains a video model (a ViViT or "
                     f'TimeSformer preset, or a config.model with a tubelet '
                     f'or an attention_type); '
                     f'{config.model_name!r} takes images.')
  if settings.frames % tubelet:
    raise ValueError(f'config.video.frames={settings.frames} is not a '
                     f'multiple of the tubelet\'s {tubelet} frames.')
  mixing.check_config(config)
  mixup = config.get('mixup') or {}
  if mixup.get('p') or mixup.get('cutmix_alpha'):
    raise ValueError("trainer='video' mixes no clips: set config.mixup.p and "
                     'config.mixup.cutmix_alpha to 0 (label_smoothing works).')


def train_step(state, batch, *, rng, config):
  """One micro-batch of clips: gradients, then the optimizer's update
  (labels smoothed if `config.label_smoothing`)."""
  chex.assert_rank(batch['video'], 5)
  dropout_rng = jax.random.fold_in(rng, state.step)
  clips, labels = mixing.augment(dropout_rng, batch['video'], batch['label'],
                                 config)

  def compute_loss(params):
    logits = state.apply_fn({'params': params}, clips, train=True,
                            rngs={'dropout': dropout_rng})
    return losses.classification(logits, labels, config.loss).mean()

  value, grads = jax.value_and_grad(compute_loss)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


@registry.register
class Task(base.Task):
  """A ViViT, its initial parameters (fresh, or an image or video
  checkpoint's), step and clips."""

  trainers = ('video',)
  planned = True

  @classmethod
  def check_config(cls, config, data_devices):
    check_settings(config)
    super().check_config(config, data_devices)
    inflate.check_source(pretrained.pretrained_path(config))  # before data

  @classmethod
  def evaluates(cls, config):
    """A video config evaluates a video checkpoint."""
    return config.get('video') is not None

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del workdir, training
    check_settings(config)
    self.config, self.mesh = config, mesh
    self.info = info or video_data.dataset_info(
        pipeline.get_builder(config), config)
    self.model = classification.make_model(config, self.info.num_classes)
    self.clip_shape = (1, config.video.frames, config.pp.crop,
                       config.pp.crop, 3)

  def init_params(self, rng):
    return self.model.init(rng, jnp.zeros(self.clip_shape),
                           train=False)['params']

  def initial_params(self, params):
    """An image or video checkpoint's parameters with a new head, or
    None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    side = self.config.pp.crop // self.config.model.patches.size[0]
    params = inflate.load_video_params(
        path, init_params=params, model_config=self.config.model,
        new_head=True, kernel_init=self.config.video.kernel_init,
        new_grid=(side, side), num_frames=self.config.video.frames)
    print(f'Fine-tuning from {path}.', flush=True)
    return params

  def train_step(self, state, batch, *, rng):
    return train_step(state, batch, rng=rng, config=self.config)

  def abstract_batch(self, batch_size):
    """The shapes and dtypes of a training micro-batch (`batches`)."""
    return {'video': jax.ShapeDtypeStruct(
                (batch_size, *self.clip_shape[1:]), jnp.float32),
            'label': jax.ShapeDtypeStruct(
                (batch_size, self.info.num_classes), jnp.float32)}

  def batches(self, *, batch_size, rows, start_step):
    return video_data.train_iterator(
        self.info, self.config, batch_size=batch_size, rows=rows,
        start_step=start_step)

  def checkpoint(self, path):
    """(model, params) of a video checkpoint: this config's model."""
    init = jax.eval_shape(self.init_params, jax.random.key(0))
    params = files.inspect_params(params=files.read_params(path),
                                  expected=init, source=f'Checkpoint {path}')
    return self.model, params
