"""Attention of a ViT: recorded weights, mean distance (Fig. 7 right),
rollout (Fig. 6, Abnar and Zuidema, 2020) and the class token's last-layer
attention per head (DINO, Caron et al., 2021, Fig. 1 and 3)."""

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


class NoClassTokenError(ValueError):
  """The model has no class token, so no class-token attention."""


def class_token_attention(weights, model_config) -> np.ndarray:
  """The last layer's attention of the class token to the patches.

  Args:
    weights: (layers, batch, heads, tokens, tokens) from `attention_weights`.
    model_config: a dict with the model's `classifier` and `num_registers`:
      whether it has a class token, and the prefix tokens to skip.

  Returns:
    (batch, heads, patches): query 0's row of the last layer, without the
    prefix (class, distillation, register) columns, not renormalized.
  """
  classifier = model_config.get('classifier') or 'token'
  if not models_vit.has_class_token(model_config):
    why = (': its MAP head pools with its own probe, outside the encoder'
           if classifier == 'map' else '')
    raise NoClassTokenError(f'The {classifier!r} classifier has no class '
                            f'token, so no class-token attention{why}.')
  return np.asarray(weights)[-1, :, :, 0,
                             num_prefix_tokens(model_config):]


def _on_grid(patches, grid):
  """(..., h*w) row-major patches as (..., h, w)."""
  if patches.shape[-1] != grid[0] * grid[1]:
    raise ValueError(f'{patches.shape[-1]} patch tokens do not fill a '
                     f'{tuple(grid)} grid.')
  return patches.reshape(*patches.shape[:-1], *grid)


def upsample_nearest(maps, size) -> np.ndarray:
  """(..., h, w) to (..., height, width): each pixel takes the value of the
  token it falls in, as torch's `interpolate(mode='nearest')` in DINO."""
  h, w = maps.shape[-2:]
  rows = np.arange(size[0]) * h // size[0]
  cols = np.arange(size[1]) * w // size[1]
  return maps[..., rows[:, None], cols]


def class_token_maps(weights, grid, image_size, model_config) -> np.ndarray:
  """`class_token_attention` as (batch, heads, height, width) maps on the
  image, nearest-upsampled from the (h, w) token grid."""
  return upsample_nearest(
      _on_grid(class_token_attention(weights, model_config), grid),
      image_size)


def mass_mask(attention, threshold=0.6) -> np.ndarray:
  """DINO's thresholded attention: True for the largest entries (last axis)
  that together hold `threshold` of their sum.

  As DINO's `visualize_attention.py`: sorted ascending and normalized, an
  entry is kept where the cumulative mass exceeds 1 - threshold.
  """
  attention = np.asarray(attention, np.float64)
  order = np.argsort(attention, axis=-1)
  ascending = np.take_along_axis(attention, order, axis=-1)
  mass = np.cumsum(ascending / ascending.sum(-1, keepdims=True), axis=-1)
  keep = np.empty(attention.shape, bool)
  np.put_along_axis(keep, order, mass > 1 - threshold, axis=-1)
  return keep


def class_token_masks(weights, grid, image_size, model_config,
                      threshold=0.6) -> np.ndarray:
  """`mass_mask` of each head's class-token attention over the patches, as
  (batch, heads, height, width) booleans on the image (nearest)."""
  keep = mass_mask(class_token_attention(weights, model_config), threshold)
  return upsample_nearest(_on_grid(keep, grid), image_size)
