"""The paper's Figures 6 and 7 for one model, and DINO's class-token
attention: numbers, then PNGs.

`load_model` reads an .npz for a model config; `analyze` computes every
panel's numbers; `write` saves the figures and `analysis.json`.
"""

import json
import os

from etils import epath
import numpy as np

from vit_jax.analysis import attention
from vit_jax.analysis import embeddings
from vit_jax.analysis import figures
from vit_jax.checkpoints import loading
from vit_jax.data import pipeline
from vit_jax.models import posemb
from vit_jax.models import vit as models_vit

FIGURES = ('attention_distance', 'position_similarity', 'filters', 'rollout',
           'class_token_attention')


def load_model(model_config, path):
  """(model, params, image side) of the checkpoint at `path`.

  The head and `pre_logits` sizes come from the checkpoint; the image side
  from its position table (`loading.image_size`).
  """
  if model_config.get('resnet') is None and 'patches' not in model_config:
    raise ValueError(f'{path} is not a ViT ({model_config.get("model_name")}'
                     ' has no `patches`): the figures are of a ViT.')
  return loading.load_model(model_config, path)


def dataset_images(config, size, count):
  """The first `count` test images of `config.dataset`, at `size` px."""
  config = config.copy_and_resolve_references().unlock()
  config.pp.crop, config.pp.resize = size, None
  info = pipeline.dataset_info(pipeline.get_builder(config),
                                         config)
  batch = next(pipeline.eval_batches(info, config, batch_size=count))
  return batch['image'][batch['mask'] > 0]


def uniform_distance(grid, patch, prefix=1) -> float:
  """Mean attention distance if every token attends to all alike."""
  patches = grid[0] * grid[1]
  weights = np.full((1, 1, 1, prefix + patches, prefix + patches),
                    1. / (prefix + patches))
  return float(attention.mean_attention_distance(weights, grid, patch,
                                                 prefix)[0, 0])


def analyze(model, params, images, rollout_images=None, gray=False):
  """Every panel's numbers for `model` (a VisionTransformer).

  Args:
    model: the model.
    params: its parameters.
    images: (n, size, size, 3) for the mean attention distance.
    rollout_images: images for the rollout and the class-token attention
      (default: the first 8 of `images`).
    gray: the model was trained on gray images (see
      `embeddings.filter_components`).

  Returns:
    A dict of numpy arrays and numbers (see `write`); `skipped` names the
    figures this model cannot have, with why.
  """
  cfg = {'patches': model.patches, 'resnet': model.resnet,
         'classifier': model.classifier,
         'num_registers': getattr(model, 'num_registers', 0),
         'posemb_prefix': getattr(model, 'posemb_prefix', True)}
  size = images.shape[1:3]
  grid = posemb.token_grid(cfg, size)
  patch = attention.pixel_patch_size(cfg)
  prefix = attention.num_prefix_tokens(cfg)
  if rollout_images is None:
    rollout_images = images[:8]
  distance = attention.mean_attention_distance(
      attention.attention_weights(model, params, images), grid, patch, prefix)
  weights = attention.attention_weights(model, params, rollout_images)
  maps = attention.rollout_maps(weights, grid, rollout_images.shape[1:3],
                                prefix)
  out = {'grid': grid, 'patch_pixels': patch,
         'mean_attention_distance': distance,
         'uniform_attention_distance': uniform_distance(grid, patch, prefix),
         'rollout_images': np.asarray(rollout_images), 'rollout_maps': maps,
         'skipped': {}}
  try:
    out['class_token_maps'] = attention.class_token_maps(
        weights, grid, rollout_images.shape[1:3], cfg)
  except attention.NoClassTokenError as e:
    out['skipped']['class_token_attention'] = str(e)
  if model.resnet is None:  # a hybrid's filters see features, not pixels
    out['filters'], out['filter_variance'] = embeddings.filter_components(
        params['embedding']['kernel'], gray=gray)
  if model.posemb in ('learn', 'learn2d', 'sincos2d'):
    out['position_similarity'] = embeddings.position_similarity(
        embeddings.patch_position_embeddings(
            params, grid, model.posemb,
            models_vit.posemb_prefix_tokens(cfg)), grid)
  return out


def write(results, out_dir, notes=None):
  """Saves the figures (PNG) and `analysis.json`; returns the PNG paths."""
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  drawn = {
      'attention_distance': lambda: figures.attention_distance(
          results['mean_attention_distance'],
          results['uniform_attention_distance']),
      'rollout': lambda: figures.rollout(results['rollout_images'],
                                         results['rollout_maps']),
  }
  if 'position_similarity' in results:
    drawn['position_similarity'] = lambda: figures.position_similarity(
        results['position_similarity'])
  if 'filters' in results:
    drawn['filters'] = lambda: figures.filters(results['filters'],
                                               results['filter_variance'])
  if 'class_token_maps' in results:
    drawn['class_token_attention'] = lambda: figures.class_token_attention(
        results['rollout_images'], results['class_token_maps'])
  paths = []
  for name in FIGURES:
    if name in drawn:
      paths.append(os.path.join(out_dir, f'{name}.png'))
      figures.save(drawn[name](), paths[-1])
  summary = {
      'mean_attention_distance': results['mean_attention_distance'].tolist(),
      'uniform_attention_distance': results['uniform_attention_distance'],
      'grid': list(results['grid']),
      'patch_pixels': list(results['patch_pixels']),
      'figures': [os.path.basename(p) for p in paths],
  }
  if 'filter_variance' in results:
    summary['filter_variance_ratio'] = results['filter_variance'].tolist()
  if results.get('skipped'):
    summary['skipped'] = results['skipped']
  summary.update(notes or {})
  (epath.Path(out_dir) / 'analysis.json').write_text(
      json.dumps(summary, indent=1))
  return paths
