"""Attention of a ViT: recorded weights, mean distance (Fig. 7 right) and
rollout (Fig. 6, Abnar and Zuidema, 2020)."""

import re

import jax
import numpy as np

from vit_jax.models import posemb
from vit_jax.models import vit as models_vit

_BLOCK = re.compile(r'encoderblock(?:_(\d+))?$')


def num_prefix_tokens(model_config) -> int:
  """Tokens before the patches: class (and distillation) and register
  tokens."""
  return models_vit.num_prefix_tokens(model_config)


def pixel_patch_size(model_config):
  """(height, width) in input pixels of the image area behind one token."""
  stride = posemb.resnet_stride(model_config.get('resnet'))
  ph, pw = models_vit.patch_size(model_config['patches'])
  return ph * stride, pw * stride


def attention_weights(model, params, images) -> np.ndarray:
  """Softmax attention of every layer and head, recorded by the model.

  Args:
    model: a VisionTransformer (unrolled or scanned blocks).
    params: its parameters.
    images: (batch, height, width, 3) preprocessed images.

  Returns:
    (layers, batch, heads, tokens, tokens) float32; rows are queries.
  """
  _, state = jax.jit(lambda p, x: model.apply(
      {'params': p}, x, train=False, mutable=['intermediates']))(
          params, np.asarray(images))
  blocks = state['intermediates'].get('Transformer', {})
  layers = []
  for name, block in blocks.items():
    match = _BLOCK.match(name)
    if not match:
      continue
    weights = block['MultiHeadDotProductAttention_0']['attention_weights'][0]
    if match.group(1) is None:  # scanned: layers stacked on axis 0
      layers.extend((i, w) for i, w in enumerate(weights))
    else:
      layers.append((int(match.group(1)), weights))
  if not layers:
    raise ValueError('The model recorded no attention weights: is it a '
                     'VisionTransformer?')
  return np.stack([np.asarray(w, np.float32) for _, w in sorted(
      layers, key=lambda item: item[0])])


def patch_centres(grid, patch) -> np.ndarray:
  """(h*w, 2) pixel (row, column) centres of the patches, row-major."""
  rows, cols = np.mgrid[:grid[0], :grid[1]]
  return np.stack([(rows.ravel() + .5) * patch[0],
                   (cols.ravel() + .5) * patch[1]], axis=1)


def mean_attention_distance(weights, grid, patch, prefix=1) -> np.ndarray:
  """The paper's mean attention distance, in pixels, per layer and head.

  For each patch query q: sum over patch keys k of A[q, k] |c_q - c_k|, then
  the mean over queries and images. The `prefix` (class) tokens' rows and
  columns are left out and the rest is not renormalized.

  Args:
    weights: (layers, batch, heads, tokens, tokens) from `attention_weights`.
    grid: (h, w) of the patch grid.
    patch: (height, width) of a patch in input pixels.
    prefix: tokens before the patches.

  Returns:
    (layers, heads).
  """
  weights = np.asarray(weights)
  patches = grid[0] * grid[1]
  if weights.ndim != 5 or weights.shape[-1] != prefix + patches:
    raise ValueError(f'Expected (layers, batch, heads, {prefix + patches}, '
                     f'{prefix + patches}) attention weights for a {grid} grid'
                     f' and {prefix} prefix tokens, got {weights.shape}.')
  centres = patch_centres(grid, patch)
  distance = np.linalg.norm(centres[:, None] - centres[None], axis=-1)
  per_query = np.einsum('lbhqk,qk->lbhq', weights[..., prefix:, prefix:],
                        distance)
  return per_query.mean(axis=(1, 3))


def rollout(weights, prefix=1) -> np.ndarray:
  """Attention rollout: how much each output token draws on each input.

  Per layer, the head-averaged attention plus the identity (the residual),
  rows renormalized to 1; the layers' matrices multiplied, last on the left.

  Args:
    weights: (layers, batch, heads, tokens, tokens).
    prefix: tokens before the patches.

  Returns:
    (batch, patches): the class token's row over the patches, or with no
    class token (prefix 0), the mean of the patches' rows.
  """
  weights = np.asarray(weights, np.float64)
  tokens = weights.shape[-1]
  joint = np.broadcast_to(np.eye(tokens), weights.shape[1:2] + (tokens,) * 2)
  for layer in weights:
    mixed = layer.mean(axis=1) + np.eye(tokens)
    mixed /= mixed.sum(axis=-1, keepdims=True)
    joint = mixed @ joint
  if prefix:
    return joint[:, 0, prefix:]
  return joint.mean(axis=1)


def rollout_maps(weights, grid, image_size, prefix=1) -> np.ndarray:
  """`rollout` as (batch, height, width) maps scaled to [0, 1] per image,
  upsampled (bilinear) from the patch grid to the image."""
  maps = rollout(weights, prefix).reshape(-1, *grid)
  maps = maps / np.maximum(maps.max(axis=(1, 2), keepdims=True), 1e-12)
  return np.asarray(jax.image.resize(
      maps, (maps.shape[0], *image_size), 'bilinear'))
