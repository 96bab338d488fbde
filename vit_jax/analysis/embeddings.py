"""What a ViT's embeddings learned: position-embedding similarity (Fig. 7
centre) and the principal components of the patch filters (Fig. 7 left)."""

import numpy as np

from vit_jax.models import vit as models_vit


def patch_position_embeddings(params, grid, posemb='learn', prefix=1):
  """(h*w, D) position embeddings of the patches, row-major.

  Args:
    params: the model's parameters.
    grid: (h, w) of the patch grid the tables were trained for.
    posemb: the model's scheme; 'learn', 'learn2d' or 'sincos2d'.
    prefix: tokens before the patches ('learn' keeps theirs first).
  """
  h, w = grid
  tables = params.get('Transformer', {}).get('posembed_input', {})
  if posemb == 'learn':
    table = np.asarray(tables['pos_embedding'])[0, prefix:]
    if len(table) != h * w:
      raise ValueError(f'The position table has {len(table)} patch entries, '
                       f'not the {h}x{w} grid given.')
    return table
  if posemb == 'learn2d':
    row = np.asarray(tables['pos_embedding_row'])[0]
    col = np.asarray(tables['pos_embedding_col'])[0]
    return np.concatenate([np.repeat(row, w, axis=0), np.tile(col, (h, 1))],
                          axis=1)
  if posemb == 'sincos2d':
    width = params['embedding']['kernel'].shape[-1]
    return np.asarray(models_vit.posemb_sincos_2d(h, w, width))[0]
  raise ValueError(f'posemb={posemb!r} adds no per-patch embedding to '
                   "compare; use 'learn', 'learn2d' or 'sincos2d'.")


def position_similarity(embeddings, grid) -> np.ndarray:
  """Cosine similarity of each patch's embedding with every other's.

  Args:
    embeddings: (h*w, D), row-major over the grid.
    grid: (h, w).

  Returns:
    (h, w, h, w): [i, j] is the map of patch (i, j)'s similarity to all.
  """
  e = np.asarray(embeddings, np.float64)
  e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)
  return (e @ e.T).reshape(*grid, *grid)


def filter_components(kernel, count=28, gray=False):
  """Principal components of the patch-embedding filters.

  Each of the D filters of the (ph, pw, channels, D) kernel is one sample;
  the components are the top eigenvectors of their covariance. Each sign is
  chosen so that the component's largest entry is positive. With `gray`
  (inputs whose channels are equal) the filters are first summed over the
  channels: the model sees nothing else of them.

  Returns:
    ((count, ph, pw, channels) components, (count,) explained variance ratio).
  """
  kernel = np.asarray(kernel, np.float64)
  if kernel.ndim != 4:
    raise ValueError(f'Expected a (ph, pw, channels, D) kernel, got '
                     f'{kernel.shape}.')
  if gray:
    kernel = kernel.sum(axis=2, keepdims=True)
  filters = kernel.reshape(-1, kernel.shape[-1]).T
  filters = filters - filters.mean(axis=0)
  _, singular, vt = np.linalg.svd(filters, full_matrices=False)
  count = min(count, len(vt))
  signs = np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])
  components = (vt * signs[:, None])[:count]
  variance = singular**2 / np.sum(singular**2)
  return components.reshape(count, *kernel.shape[:3]), variance[:count]
