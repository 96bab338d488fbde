"""Checkpoints in the original release's .npz format, and fine-tuning loads.

A checkpoint is an `np.savez` archive whose keys are '/'-joined parameter
paths. Published files use the *pre-Linen* numbering of submodules, which
counted children of a module in call order regardless of their class (an
encoder block holds `LayerNorm_0`, `MultiHeadDotProductAttention_1`,
`LayerNorm_2`, `MlpBlock_3`). Linen counts per class (`LayerNorm_0`,
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`): `load` renumbers
and `save` writes the published names back, so files stay interchangeable with
the original release.

Errors that a user can cause (missing, damaged or unsafe files, checkpoints of
another model) raise `FileNotFoundError` or `CheckpointError` with a short
listing, before anything is compiled.
"""

import os
import re
import secrets
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple
import zipfile
import zlib

from absl import logging
import jax
import numpy as np
import scipy.ndimage

Params = Dict[str, Any]

# Linen names inside an encoder block -> the published, pre-Linen names.
_LINEN_TO_PRE_LINEN = {
    'LayerNorm_0': 'LayerNorm_0',
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'LayerNorm_1': 'LayerNorm_2',
    'MlpBlock_0': 'MlpBlock_3',
}
_ENCODER_BLOCK = re.compile(r'encoderblock_\d+')
_NUMBERED = re.compile(r'(.+)_(\d+)')
# GroupNorm modules of the hybrid ResNet stem ('gn_root', 'gn_proj', 'gn1'...).
_GROUPNORM = re.compile(r'gn(\d+|_root|_proj)')
_MAX_LISTED = 10
# What numpy and zipfile raise on damaged or unsafe files.
_DECODE_ERRORS = (ValueError, EOFError, KeyError, zipfile.BadZipFile,
                  zlib.error)
_RESIZE_METHODS = ('bicubic', 'linear_zoom')


class CheckpointError(ValueError):
  """A checkpoint that cannot be read, or that does not fit the model."""


# Trees.


def _flatten(tree: Mapping[str, Any], prefix: str = '') -> Dict[str, Any]:
  """'/'-joined path -> leaf; empty dicts hold no parameters and are skipped."""
  flat = {}
  for key, value in tree.items():
    if not isinstance(key, str) or not key or '/' in key:
      raise ValueError(f'Parameter names must be non-empty strings without '
                       f"'/', got {key!r} under {prefix or 'the root'!r}.")
    if isinstance(value, Mapping):
      flat.update(_flatten(value, f'{prefix}{key}/'))
    else:
      flat[prefix + key] = value
  return flat


def _empty_dicts(tree: Mapping[str, Any], prefix: str = '') -> list:
  """Paths of the empty dicts in `tree` (parameter-less modules)."""
  paths = []
  for key, value in tree.items():
    if isinstance(value, Mapping):
      if value:
        paths.extend(_empty_dicts(value, f'{prefix}{key}/'))
      else:
        paths.append(prefix + key)
  return paths


def _unflatten(flat: Mapping[str, Any], source: str) -> Params:
  tree = {}
  for path, value in flat.items():
    *parents, name = path.split('/')
    node = tree
    for part in parents:
      node = node.setdefault(part, {})
      if not isinstance(node, dict):
        raise CheckpointError(f'{source}: {path!r} lies under a parameter.')
    if not name or name in node:
      raise CheckpointError(f'{source}: malformed or duplicate key {path!r}.')
    node[name] = value
  return tree


def _renumber(tree: Params) -> Params:
  """Renumbers `Prefix_N` submodules per prefix, in numeric order of N."""
  numbered = {}
  for key, value in tree.items():
    match = _NUMBERED.fullmatch(key)
    if match and isinstance(value, dict):
      numbered.setdefault(match.group(1), []).append((int(match.group(2)), key))
  renamed = {}
  for prefix, items in numbered.items():
    for i, (_, key) in enumerate(sorted(items)):
      renamed[key] = f'{prefix}_{i}'
  return {renamed.get(k, k): _renumber(v) if isinstance(v, dict) else v
          for k, v in tree.items()}


def _to_pre_linen(tree: Params) -> Params:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      value = _to_pre_linen(value)
      # Only a block with exactly the Linen children is renamed, so trees
      # that already carry the published names are written unchanged.
      if (_ENCODER_BLOCK.fullmatch(key) and
          set(value) == set(_LINEN_TO_PRE_LINEN)):
        value = {_LINEN_TO_PRE_LINEN[k]: v for k, v in value.items()}
    out[key] = value
  return out


def _reshape_groupnorm(tree: Params, to_file: bool, parent: str = '') -> Params:
  """GroupNorm scale/bias: (1, 1, 1, C) in files, (C,) in Linen."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out[key] = _reshape_groupnorm(value, to_file, key)
      continue
    if _GROUPNORM.fullmatch(parent) and key in ('scale', 'bias'):
      if to_file and value.ndim == 1:
        value = value.reshape(1, 1, 1, -1)
      elif not to_file and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
        value = value.reshape(-1)
    out[key] = value
  return out


# Files.


def load(path) -> Params:
  """Reads a checkpoint into a nested dict of numpy arrays, with Linen names.

  Accepts the published pre-Linen numbering and Linen names alike. Never
  unpickles: files with pickled objects are refused.

  Args:
    path: an .npz file written by `save` or by the original release.

  Returns:
    Nested dicts of numpy arrays, as `model.init(...)['params']`.

  Raises:
    FileNotFoundError: `path` does not exist.
    CheckpointError: the file is truncated, corrupt, not an .npz archive, or
      holds pickled or non-numeric arrays.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'Checkpoint file not found: {path}')
  try:
    archive = np.load(path, allow_pickle=False)
  except _DECODE_ERRORS as e:
    raise CheckpointError(
        f'Cannot read checkpoint {path}: not an .npz archive, or truncated or '
        f'corrupt ({type(e).__name__}: {e}).') from e
  if not isinstance(archive, np.lib.npyio.NpzFile):
    raise CheckpointError(
        f'{path} holds a single array, not an .npz archive of parameters.')
  flat = {}
  with archive:
    for key in archive.files:
      try:
        value = archive[key]
      except _DECODE_ERRORS as e:
        what = ('a pickled object array, which is never loaded'
                if 'allow_pickle' in str(e) else 'truncated or corrupt')
        raise CheckpointError(
            f'Cannot read {key!r} from checkpoint {path}: {what} '
            f'({type(e).__name__}: {e}).') from e
      if value.dtype.kind not in 'biufc':
        raise CheckpointError(
            f'{key!r} in checkpoint {path} has dtype {value.dtype}, not a '
            'numeric parameter.')
      flat[key] = value
  if not flat:
    raise CheckpointError(f'Checkpoint {path} holds no arrays.')
  return _reshape_groupnorm(_renumber(_unflatten(flat, path)), to_file=False)


def save(params: Mapping[str, Any], path) -> None:
  """Writes `params` in the published format; `load` reads it back exactly.

  Encoder blocks get their pre-Linen names, GroupNorm scale/bias their
  (1, 1, 1, C) shape, and keys are '/'-joined. The file appears atomically:
  it is written next to `path` and then renamed. Empty dicts (parameter-less
  modules) cannot be stored; `inspect_params` restores them.

  Args:
    params: nested dicts of arrays (numpy or jax), as from `model.init`.
    path: destination file; written as given (no '.npz' is appended).
  """
  path = os.fspath(path)
  tree = _reshape_groupnorm(
      _to_pre_linen(jax.tree.map(np.asarray, dict(params))), to_file=True)
  flat = _flatten(tree)
  for key, value in flat.items():
    # bfloat16 and friends would be stored as opaque bytes: refuse them.
    if value.dtype.kind not in 'biufc':
      raise ValueError(f'Cannot save {key!r} of dtype {value.dtype}: cast it '
                       'to a numpy float type (e.g. float32) first.')
  directory, name = os.path.split(os.path.abspath(path))
  tmp = os.path.join(directory, f'.{name}.tmp-{secrets.token_hex(6)}')
  # os.open applies the umask, unlike mkstemp's fixed 0600.
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
  try:
    with os.fdopen(fd, 'wb') as f:
      np.savez(f, **flat)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


# Checking a tree against the model.


def _shape(x) -> Tuple[int, ...]:
  return tuple(x.shape) if hasattr(x, 'shape') else np.shape(x)


def _listing(title: str, keys: Sequence[str], describe=lambda k: k) -> str:
  lines = [f'  {len(keys)} {title}:']
  lines += [f'    {describe(k)}' for k in keys[:_MAX_LISTED]]
  if len(keys) > _MAX_LISTED:
    lines.append(f'    ... and {len(keys) - _MAX_LISTED} more')
  return '\n'.join(lines)


def _drop(tree: Mapping[str, Any], extra: set, prefix: str = '') -> Params:
  """Copies `tree` without the leaves in `extra` (and dicts they empty)."""
  out = {}
  for key, value in tree.items():
    path = prefix + key
    if isinstance(value, Mapping):
      if not value:
        out[key] = {}
      else:
        sub = _drop(value, extra, path + '/')
        if sub:
          out[key] = sub
    elif path not in extra:
      out[key] = value
  return out


def inspect_params(*,
                   params: Mapping[str, Any],
                   expected: Mapping[str, Any],
                   fail_if_extra: bool = True,
                   fail_if_missing: bool = True,
                   source: Optional[str] = None) -> Params:
  """Compares the keys and shapes of `params` with the model's `expected`.

  Missing and unexpected keys are logged, and raise when asked to. Shape
  mismatches always raise: such a tree cannot run in the model.

  Args:
    params: a loaded tree.
    expected: the model's tree, e.g. from `model.init` or `jax.eval_shape`.
    fail_if_extra: raise on keys of `params` that the model lacks; else drop
      them.
    fail_if_missing: raise on model keys that `params` lacks.
    source: name of the tree for messages, e.g. the checkpoint's path.

  Returns:
    A copy of `params` without extra keys, and with the model's empty dicts
    (parameter-less modules) added back.

  Raises:
    CheckpointError: listing the first few offending keys (with both shapes).
  """
  have, want = _flatten(params), _flatten(expected)
  missing = sorted(want.keys() - have.keys())
  extra = sorted(have.keys() - want.keys())
  wrong = sorted(k for k in have.keys() & want.keys()
                 if _shape(have[k]) != _shape(want[k]))
  if missing:
    logging.info('inspect_params: missing keys: %s', missing)
  if extra:
    logging.info('inspect_params: extra keys: %s', extra)
  if wrong or (missing and fail_if_missing) or (extra and fail_if_extra):
    parts = [f'{source or "The parameters"} does not fit the model:']
    if wrong:
      parts.append(_listing(
          'parameters have the wrong shape (checkpoint vs model)', wrong,
          lambda k: f'{k}: {_shape(have[k])} vs {_shape(want[k])}'))
    if missing and fail_if_missing:
      parts.append(_listing('model parameters are missing', missing,
                            lambda k: f'{k}: {_shape(want[k])}'))
    if extra and fail_if_extra:
      parts.append(_listing('parameters are not in the model', extra,
                            lambda k: f'{k}: {_shape(have[k])}'))
    raise CheckpointError('\n'.join(parts))
  out = _drop(params, set(extra))
  for path in _empty_dicts(expected):
    node = out
    *parents, name = path.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node.setdefault(name, {})
  return out


# Position embeddings.


def _square_side(n: int, what: str) -> int:
  side = int(round(np.sqrt(max(n, 0))))
  if n < 1 or side * side != n:
    raise ValueError(f'{what}: {n} tokens are not a square grid; give the '
                     '(height, width) grid explicitly.')
  return side


def _check_posemb(posemb) -> np.ndarray:
  posemb = np.asarray(posemb)
  if posemb.ndim != 3 or posemb.shape[0] != 1:
    raise ValueError(f'Expected a (1, tokens, width) position embedding, got '
                     f'{posemb.shape}.')
  return posemb


def resize_posemb_grid(posemb,
                       *,
                       old_grid: Optional[Tuple[int, int]] = None,
                       new_grid: Tuple[int, int],
                       has_class_token: bool,
                       method: str = 'bicubic') -> np.ndarray:
  """Resizes a (1, [1 +] h * w, D) position embedding to another grid.

  Each embedding is treated as a sample at the center of its patch, and both
  grids cover the same image (half-pixel centers, not corner-aligned): patch
  (i, j) of an h x w grid sits at ((i + 0.5) / h, (j + 0.5) / w).

  Args:
    posemb: (1, N, D) array, tokens in row-major order of the grid, after the
      class token if there is one.
    old_grid: (h, w) of `posemb`; None for a square grid.
    new_grid: (h, w) to resize to.
    has_class_token: whether token 0 is the class token; it is kept as is.
    method: 'bicubic' (default): `jax.image.resize(..., 'cubic',
      antialias=False)`, Keys' cubic convolution sampled at the new patch
      centers as above. 'linear_zoom': the original release's
      `scipy.ndimage.zoom(grid, (h'/h, w'/w, 1), order=1)`, which aligns the
      corner patches instead.

  Returns:
    (1, [1 +] h' * w', D) numpy array of the input's dtype.
  """
  if method not in _RESIZE_METHODS:
    raise ValueError(f'Unknown resize method {method!r}; expected one of '
                     f'{_RESIZE_METHODS}.')
  posemb = _check_posemb(posemb)
  n_cls = int(has_class_token)
  cls, patches = posemb[:, :n_cls], posemb[0, n_cls:]
  if old_grid is None:
    side = _square_side(len(patches), 'Position embedding')
    old_grid = (side, side)
  old_grid, new_grid = tuple(map(int, old_grid)), tuple(map(int, new_grid))
  if old_grid[0] * old_grid[1] != len(patches):
    raise ValueError(f'old_grid {old_grid} does not match the {len(patches)} '
                     'grid tokens of the position embedding.')
  if len(new_grid) != 2 or min(new_grid) < 1:
    raise ValueError(f'new_grid must be a positive (height, width), got '
                     f'{new_grid}.')
  if old_grid == new_grid:
    return posemb
  grid = patches.reshape(*old_grid, -1)
  if method == 'bicubic':
    new = np.asarray(jax.image.resize(
        grid, (*new_grid, grid.shape[-1]), 'cubic', antialias=False))
  else:
    zoom = (new_grid[0] / old_grid[0], new_grid[1] / old_grid[1], 1)
    new = scipy.ndimage.zoom(grid, zoom, order=1)
    # zoom rounds its output size; it must be the grid asked for.
    assert new.shape[:2] == new_grid, (new.shape, new_grid)
  new = new.astype(posemb.dtype).reshape(1, -1, grid.shape[-1])
  return np.concatenate([cls, new], axis=1)


def interpolate_posembed(posemb, num_tokens: int, has_class_token: bool,
                         method: str = 'bicubic') -> np.ndarray:
  """Resizes a square-grid (1, N, D) position embedding to `num_tokens`.

  See `resize_posemb_grid` for the method and the convention; the class
  token, if any, counts in both N and `num_tokens` and is kept as is.
  """
  posemb = _check_posemb(posemb)
  n_cls = int(has_class_token)
  old = _square_side(posemb.shape[1] - n_cls, 'Position embedding')
  new = _square_side(num_tokens - n_cls, 'Target')
  return resize_posemb_grid(posemb, old_grid=(old, old), new_grid=(new, new),
                            has_class_token=has_class_token, method=method)


# Fine-tuning.


def load_pretrained(*,
                    pretrained_path,
                    init_params: Mapping[str, Any],
                    model_config,
                    new_grid: Optional[Tuple[int, int]] = None,
                    old_grid: Optional[Tuple[int, int]] = None,
                    resize_method: str = 'bicubic') -> Params:
  """Loads a pre-trained checkpoint for fine-tuning the model of `init_params`.

  The head comes from `init_params` (zero kernel, `head_bias_init` bias).
  `pre_logits` is dropped (set to {}) when `model_config.representation_size`
  is None and kept otherwise; a checkpoint without it gets the fresh one of
  `init_params`. A position embedding of another length is resized to the new
  grid (Sec. 3.2 of the paper). Extra checkpoint keys are logged and dropped.

  Args:
    pretrained_path: the .npz checkpoint.
    init_params: the model's freshly initialized parameters.
    model_config: ConfigDict or dict with `classifier` and
      `representation_size`.
    new_grid: (h, w) patch grid of the new resolution; None for a square grid.
    old_grid: (h, w) grid of the checkpoint; None for a square grid.
    resize_method: see `resize_posemb_grid`.

  Returns:
    Parameters shaped like `init_params`.

  Raises:
    FileNotFoundError: the file does not exist.
    CheckpointError: the file is unreadable, or its shapes or keys do not fit
      the model (the message lists the first few, with both shapes).
  """
  path = os.fspath(pretrained_path)
  params = load(path)
  classifier = model_config.get('classifier', 'token')
  representation_size = model_config.get('representation_size')

  if 'head' in init_params:
    params['head'] = dict(init_params['head'])
  else:
    params.pop('head', None)
  if representation_size is None:
    if 'pre_logits' in params:
      logging.info('load_pretrained: dropping pre_logits (drop-head variant).')
    params['pre_logits'] = {}
  elif 'pre_logits' not in params and 'pre_logits' in init_params:
    logging.warning('load_pretrained: %s has no pre_logits; starting from the '
                    'initial ones.', path)
    params['pre_logits'] = dict(init_params['pre_logits'])

  posemb = params.get('Transformer', {}).get('posembed_input', {}).get(
      'pos_embedding')
  target = init_params.get('Transformer', {}).get('posembed_input', {}).get(
      'pos_embedding')
  if posemb is not None and target is not None:
    have, want = _shape(posemb), _shape(target)
    # Only the token count is resizable; other differences are listed below.
    if have != want and len(have) == len(want) == 3 and (
        have[0], have[2]) == (want[0], want[2]):
      has_cls = classifier in ('token', 'token_unpooled')
      try:
        grid = new_grid
        if grid is None:
          side = _square_side(want[1] - int(has_cls), 'The model')
          grid = (side, side)
        if grid[0] * grid[1] != want[1] - int(has_cls):
          raise ValueError(f'new_grid {tuple(grid)} does not match the '
                           f"model's {want[1] - int(has_cls)} grid tokens.")
        resized = resize_posemb_grid(
            posemb, old_grid=old_grid, new_grid=grid,
            has_class_token=has_cls, method=resize_method)
      except ValueError as e:
        raise CheckpointError(
            f'Cannot resize the position embedding of {path} from {have} to '
            f'{want}: {e}') from e
      logging.info('load_pretrained: resized pos_embedding %s -> %s.', have,
                   want)
      params['Transformer']['posembed_input']['pos_embedding'] = resized

  return inspect_params(params=params, expected=init_params,
                        fail_if_extra=False, fail_if_missing=True,
                        source=f'Checkpoint {path}')
