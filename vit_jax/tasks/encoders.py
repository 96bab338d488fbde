"""The image encoder that a task builds on (a dense probe, a captioner):
a checkpoint's, or a fresh one."""

import jax
import jax.numpy as jnp

from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.models import backbone
from vit_jax.tasks import classification


def load_encoder(config):
  """(module, parameters) of the image encoder: `pretrained_path`'s (the
  ViT inside a DINO, MAE or LiT model), else `config.model` at
  initialization (the run's seed)."""
  path = pretrained.pretrained_path(config)
  if path:
    model, params, _ = loading.load_model(config.model, path, config.pp.crop)
    print(f'Image encoder: {path}.', flush=True)
  else:
    model = classification.make_model(config, None)
    key = jax.random.fold_in(jax.random.key(config.seed), 1)
    params = model.init(key, jnp.zeros((1, config.pp.crop, config.pp.crop, 3)),
                        train=False)['params']
    print('Image encoder: at initialization (no pretrained_path).',
          flush=True)
  return backbone.image_encoder(model, params)
