"""VideoMAE pretraining (`trainer='videomae'`, Tong et al., 2022): MAE
(`tasks/mae.py`) on clips, with tube masking.

Settings: `config.mae` as MAE's (`mask_ratio`, the paper's 0.9;
`norm_pix_loss`: per-tubelet, per-channel normalized targets; the
`decoder`), `config.video` as the video classifier's (`frames`, `stride`:
the clip sampled for training; `test_views`: the evaluators' windows).
`config.model` is the encoder: a ViViT with VideoMAE's settings
(`models.videomae.encoder_config`: unfactorised, temporal_posemb='sincos',
classifier='gap'). Labels are not used. The evaluators (`knn` on the
clips' pooled features) and the exported `{workdir}/{model_name}.npz` see
the encoder alone, a ViViT checkpoint that `trainer='video'` fine-tunes
(`pretrained_path`; configs/videomae_fmnist.py:finetune).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints import files
from vit_jax.checkpoints import pretrained
from vit_jax.data import pipeline
from vit_jax.data import video as video_data
from vit_jax.models import mae as models_mae
from vit_jax.models import videomae
from vit_jax.models import vivit
from vit_jax.models.posemb import patch_size
from vit_jax.tasks import base
from vit_jax.tasks import mae
from vit_jax.tasks import registry
from vit_jax.tasks import video

ENCODER = dict(encoder='unfactorised', temporal_posemb='sincos',
               classifier='gap')


def check_settings(config):
  """Fails fast on `config.mae`, `config.video` and an encoder that is not
  VideoMAE's."""
  if config.get('mae') is None:
    raise ValueError("config.trainer='videomae' needs config.mae: "
                     'mask_ratio, norm_pix_loss and decoder (see '
                     'configs/videomae_fmnist.py).')
  settings = mae.check_settings(config)
  video.check_settings(config)
  model = config.model
  wrong = {k: model.get(k) for k, v in ENCODER.items() if model.get(k) != v}
  if wrong or model.get('representation_size') is not None:
    raise ValueError(f"trainer='videomae' trains VideoMAE's encoder, a ViViT "
                     f'with {ENCODER} and no representation_size; '
                     f'config.model has {wrong or "a representation_size"}.')
  side = config.pp.crop // patch_size(model.patches)[0]
  videomae.num_masked(side * side, settings.mask_ratio)  # a usable ratio
  return settings


def unit_pixels(pp):
  """(clips -> their pixels in [0, 1]): undoes `pipeline.normalize`, as
  VideoMAE computes its targets from unnormalized frames."""
  if pp.get('mean') is None and pp.get('std') is None:
    return lambda x: (x + 1) / 2
  mean = np.asarray(pp.get('mean') or (0.5,) * 3, np.float32)
  std = np.asarray(pp.get('std') or (0.5,) * 3, np.float32)
  return lambda x: x * std + mean


def train_step(state, clips, rng, *, model, ratio, norm_pix, to_unit):
  """One VideoMAE update: a fresh tube mask per clip (`tube_keep`), the
  loss on the masked tubelets (`tubelet_targets`, `mae.mae_loss`)."""
  grid = vivit.video_grid(clips.shape, model.tubelet, model.patch)
  mask_rng, dropout_rng = jax.random.split(rng)
  keep, mask = videomae.tube_keep(mask_rng, clips.shape[0], grid, ratio)
  target = videomae.tubelet_targets(to_unit(clips), model.tubelet,
                                    model.patch, norm_pix)

  def compute_loss(params):
    pred = state.apply_fn({'params': params}, clips, keep, train=True,
                          rngs={'dropout': dropout_rng})
    return models_mae.mae_loss(pred, target, mask, norm_pix=False)

  value, grads = jax.value_and_grad(compute_loss)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


@registry.register
class Task(base.Task):
  """A video masked autoencoder: its encoder is the model exported."""

  trainers = ('videomae',)
  planned = True

  @classmethod
  def check_config(cls, config, data_devices):
    check_settings(config)
    super().check_config(config, data_devices)

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del training, workdir
    self.settings = check_settings(config)
    self.config, self.mesh = config, mesh
    self.info = info or video_data.dataset_info(
        pipeline.get_builder(config), config)
    encoder = videomae.encoder_config(config.model.to_dict())
    self.model = videomae.VideoMaskedAutoencoder(
        encoder=encoder, decoder=dict(self.settings.decoder))
    self.encoder = vivit.ViViT(num_classes=None, **encoder)
    self.clip_shape = (1, config.video.frames, config.pp.crop,
                       config.pp.crop, 3)

  def init_params(self, rng):
    clips = jnp.zeros(self.clip_shape)
    slots, h, w = vivit.video_grid(clips.shape, self.model.tubelet,
                                   self.model.patch)
    keep = jnp.arange(slots * h * w)[None]
    return self.model.init(rng, clips, keep, train=False)['params']

  @property
  def exported_model(self):
    return self.encoder

  def exported_params(self, params):
    return params['encoder']

  def initial_params(self, params):
    """The encoder of a ViViT checkpoint at `pretrained_path` (continued
    pretraining), or None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    params['encoder'] = files.inspect_params(
        params=files.read_params(path), expected=params['encoder'],
        source=f'Checkpoint {path}')
    print(f'VideoMAE from the encoder {path}.', flush=True)
    return params

  def train_step(self, state, batch, *, rng):
    chex.assert_rank(batch['video'], 5)
    return train_step(state, batch['video'],
                      jax.random.fold_in(rng, state.step), model=self.model,
                      ratio=self.settings.mask_ratio,
                      norm_pix=self.settings.norm_pix_loss,
                      to_unit=unit_pixels(self.config.pp))

  def abstract_batch(self, batch_size):
    return {'video': jax.ShapeDtypeStruct(
        (batch_size, *self.clip_shape[1:]), jnp.float32)}

  def batches(self, *, batch_size, rows, start_step):
    """This process's rows of the training clips; labels are not used."""
    for batch in video_data.train_iterator(
        self.info, self.config, batch_size=batch_size, rows=rows,
        start_step=start_step):
      yield {'video': batch['video']}
