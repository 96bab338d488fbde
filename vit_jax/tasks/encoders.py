"""The image encoder that a task builds on (a dense probe, a captioner):
a checkpoint's, or a fresh one."""

import jax
import jax.numpy as jnp

from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.models import backbone
from vit_jax.models import fusion
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


def load_fused(config):
  """(FusedEncoder, {'encoders_{i}': parameters}) of the frozen encoders of
  `config.captioning.encoders` (Prismatic's fusion): each entry's `path`
  (a checkpoint of `config.model`'s architecture) at its `size`, its input
  `mean` and `std` (None: [-1, 1]), fused on a `grid` by `resize`."""
  s = config.captioning
  modules, params = [], {}
  for i, e in enumerate(s.encoders):
    model, p, _ = loading.load_model(config.model, e['path'], e['size'])
    model, params[f'encoders_{i}'] = backbone.image_encoder(model, p)
    modules.append(model)
    print(f'Image encoder {i}: {e["path"]} at {e["size"]} px.', flush=True)
  fused = fusion.FusedEncoder(
      encoders=tuple(modules), sizes=tuple(e['size'] for e in s.encoders),
      means=tuple(e.get('mean') for e in s.encoders),
      stds=tuple(e.get('std') for e in s.encoders), grid=s.fusion_grid,
      resize=s.fusion_resize)
  return fused, params
