"""MAE pretraining (`trainer='mae'`, He et al., 2022): a ViT learns, without
labels, to reconstruct the pixels of randomly masked patches.

Settings under `config.mae`: `mask_ratio` (0.75), `norm_pix_loss` (per-patch
normalized targets) and the `decoder`'s `hidden_size`, `num_layers`,
`num_heads`, `mlp_dim`; the encoder is `config.model`. The evaluators (few-
shot on the encoder's class token, say) and the exported
`{workdir}/{model_name}.npz` see the encoder alone, in the published
layout: fine-tuning (`pretrained_path`), few-shot, `predict` and
`analysis` take it like any checkpoint. At the end the run draws
`{workdir}/mae_reconstructions.png` (the paper's Figure 2).
"""

import functools

import chex
import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from vit_jax.data import pipeline
from vit_jax.models import mae as models_mae
from vit_jax.models import posemb
from vit_jax.models import vit as models_vit
from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import storage
from vit_jax.tasks import base
from vit_jax.tasks import registry

DECODER_KEYS = ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')
PICTURE = 'mae_reconstructions.npz'  # drawn by analysis.figures
PICTURE_IMAGES = 8


def check_settings(config):
  """Fails fast on `config.mae`: present, complete, a usable ratio."""
  settings = config.get('mae')
  if settings is None:
    raise ValueError("config.trainer='mae' needs config.mae: mask_ratio, "
                     'norm_pix_loss and decoder (see configs/mae_fmnist.py).')
  missing = [k for k in DECODER_KEYS if k not in settings.decoder]
  if missing:
    raise ValueError(f'config.mae.decoder lacks {missing}.')
  if settings.decoder.hidden_size % settings.decoder.num_heads:
    raise ValueError(f'config.mae.decoder.hidden_size='
                     f'{settings.decoder.hidden_size} is not divisible by '
                     f'num_heads={settings.decoder.num_heads}.')
  return settings


def to_display(images, pp):
  """Model inputs -> [0, 1] pixels: undoes `input_pipeline`'s normalization."""
  images = np.asarray(images, np.float32)
  if pp.get('mean') is None and pp.get('std') is None:
    return np.clip((images + 1) / 2, 0, 1)
  mean = np.asarray(pp.get('mean') or (0.5,) * 3, np.float32)
  std = np.asarray(pp.get('std') or (0.5,) * 3, np.float32)
  return np.clip(images * std + mean, 0, 1)


def reconstruct(model, params, images, rng, ratio, norm_pix):
  """(mask (n, H, W, 1), 1 on removed pixels; reconstruction (n, H, W, C)).

  With `norm_pix` the predicted patches are un-normalized with the true
  patch's own mean and std (as the paper's pictures); the visible patches
  are pasted back in.
  """
  n, height, width, _ = images.shape
  grid = (height // model.patch[0], width // model.patch[1])
  keep, mask = models_mae.random_keep(rng, n, grid[0] * grid[1], ratio)
  apply = jax.jit(functools.partial(model.apply, train=False))
  pred = apply({'params': params}, images, keep)
  target = models_mae.patchify(images, model.patch)
  if norm_pix:
    mean, std = models_mae.patch_stats(target)
    pred = pred * std + mean
  m = mask[..., None]
  recon = models_mae.unpatchify(pred * m + target * (1 - m), model.patch, grid)
  mask_pixels = models_mae.unpatchify(
      jnp.broadcast_to(m, pred.shape[:2] + (model.patch[0] * model.patch[1],)),
      model.patch, grid)
  return np.asarray(mask_pixels), np.asarray(recon)


def train_step(state, images, rng, *, patch, ratio, norm_pix):
  """One MAE update on `images` with this step's `rng`: a fresh mask per
  image (`random_keep`), the loss on the masked patches (`mae_loss`)."""
  n, height, width, _ = images.shape
  num_patches = (height // patch[0]) * (width // patch[1])
  mask_rng, dropout_rng = jax.random.split(rng)
  keep, mask = models_mae.random_keep(mask_rng, n, num_patches, ratio)
  target = models_mae.patchify(images, patch)

  def compute_loss(params):
    pred = state.apply_fn({'params': params}, images, keep, train=True,
                          rngs={'dropout': dropout_rng})
    return models_mae.mae_loss(pred, target, mask, norm_pix)

  value, grads = jax.value_and_grad(compute_loss)(state.params)
  return state.apply_gradients(grads=grads), {'loss': value}


@registry.register
class Task(base.Task):
  """A masked autoencoder: its encoder is the model that is exported."""

  trainers = ('mae',)
  planned = True

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del training, workdir
    self.settings = check_settings(config)
    self.config, self.mesh = config, mesh
    encoder = models_mae.encoder_config(config.model.to_dict())
    self.grid = posemb.token_grid(config.model, (config.pp.crop,) * 2)
    self.num_patches = self.grid[0] * self.grid[1]
    models_mae.num_kept(self.num_patches, self.settings.mask_ratio)  # checks
    self.info = info or pipeline.dataset_info(
        pipeline.get_builder(config), config)
    self.model = models_mae.MaskedAutoencoder(
        encoder=encoder, decoder=dict(self.settings.decoder))
    # What the evaluators see and the .npz holds: the encoder as a ViT
    # without a head (its class token after the final norm).
    self.encoder = models_vit.VisionTransformer(num_classes=None, **encoder)
    self.image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init_params(self, rng):
    keep = jnp.arange(self.num_patches)[None]
    return self.model.init(rng, jnp.zeros(self.image_shape), keep,
                           train=False)['params']

  @property
  def exported_model(self):
    return self.encoder

  def exported_params(self, params):
    return params['encoder']

  def initial_params(self, params):
    """The encoder from `pretrained_path` (continued pretraining), or None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    params['encoder'] = loading.load_params(
        path, init_params=params['encoder'], model_config=self.config.model,
        new_grid=self.grid)
    print(f'MAE from the encoder {path}.', flush=True)
    return params

  def train_step(self, state, batch, *, rng):
    """One micro-batch: a fresh mask per image, the loss on masked patches."""
    chex.assert_rank(batch['image'], 4)
    return train_step(state, batch['image'], jax.random.fold_in(rng,
                                                                state.step),
                      patch=self.model.patch, ratio=self.settings.mask_ratio,
                      norm_pix=self.settings.norm_pix_loss)

  def abstract_batch(self, batch_size):
    """The shapes and dtypes of a training micro-batch (`batches`)."""
    return {'image': jax.ShapeDtypeStruct(
        (batch_size, *self.image_shape[1:]), jnp.float32)}

  def batches(self, *, batch_size, rows, start_step):
    """This process's rows of the training images; labels are not used."""
    for batch in pipeline.train_iterator(
        self.info, self.config, batch_size=batch_size, rows=rows,
        start_step=start_step):
      yield {'image': batch['image']}

  def finish(self, params, workdir):
    """Writes `{workdir}/mae_reconstructions.npz` from the first test
    images (process 0): the images, the patches seen and the
    reconstructions, as displayed; `analysis.figures` draws its `.png`."""
    if not all(x.is_fully_addressable for x in jax.tree.leaves(params)):
      params = multihost_utils.process_allgather(params, tiled=True)
    if jax.process_index():
      return
    images = next(pipeline.eval_batches(
        self.info, self.config, batch_size=PICTURE_IMAGES))['image']
    rng = jax.random.key(self.config.seed)
    mask, recon = reconstruct(self.model, jax.device_get(params), images, rng,
                              self.settings.mask_ratio,
                              self.settings.norm_pix_loss)
    path = storage.join(workdir, PICTURE)
    arrays = dict(images=to_display(images, self.config.pp), mask=mask,
                  recon=to_display(recon, self.config.pp))
    storage.write_atomic(path, lambda f: np.savez(f, **arrays))
    print(f'Reconstructions (arrays): {path}', flush=True)
