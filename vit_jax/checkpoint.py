"""Checkpoints in the original release's .npz format, and fine-tuning loads.

A checkpoint is an `np.savez` archive whose keys are '/'-joined parameter
paths. Published files use the *pre-Linen* numbering of submodules, which
counted children of a module in call order regardless of their class (an
encoder block holds `LayerNorm_0`, `MultiHeadDotProductAttention_1`,
`LayerNorm_2`, `MlpBlock_3`). Linen counts per class (`LayerNorm_0`,
`MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`): `load` renumbers
and `save` writes the published names back, so files stay interchangeable with
the original release. Only encoder blocks are renamed: the Mixer's
`MixerBlock_*` and the `MAPHead_0` attention-pooling head were published with
Linen names, and a block's `posembed_relative` keeps its name. The hybrids'
GroupNorm scale and bias are (1, 1, 1, C) in files and (C,) in Linen.

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

from vit_jax import models_vit

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
      # Only a block whose numbered submodules are exactly the Linen ones is
      # renamed, so trees that already carry the published names are written
      # unchanged; unnumbered ones (posembed_relative) keep their names.
      numbered = {k for k, v in value.items()
                  if _NUMBERED.fullmatch(k) and isinstance(v, Mapping) and v}
      if (_ENCODER_BLOCK.fullmatch(key) and
          numbered == set(_LINEN_TO_PRE_LINEN)):
        value = {_LINEN_TO_PRE_LINEN.get(k, k): v for k, v in value.items()}
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


def _check_method(method: str) -> None:
  if method not in _RESIZE_METHODS:
    raise ValueError(f'Unknown resize method {method!r}; expected one of '
                     f'{_RESIZE_METHODS}.')


def _resize(grid: np.ndarray, new_shape: Tuple[int, ...],
            method: str) -> np.ndarray:
  """Resizes the leading axes of a (*old_shape, D) array to `new_shape`."""
  new_shape = tuple(new_shape)
  if method == 'bicubic':
    new = np.asarray(jax.image.resize(
        grid, (*new_shape, grid.shape[-1]), 'cubic', antialias=False))
  else:
    zoom = [n / o for n, o in zip(new_shape, grid.shape[:-1])] + [1]
    new = scipy.ndimage.zoom(grid, zoom, order=1)
    # zoom rounds its output size; it must be the size asked for.
    assert new.shape[:-1] == new_shape, (new.shape, new_shape)
  return new.astype(grid.dtype)


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
  _check_method(method)
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
  new = _resize(patches.reshape(*old_grid, -1), new_grid, method)
  return np.concatenate([cls, new.reshape(1, -1, new.shape[-1])], axis=1)


def resize_posemb_1d(table, new_length: int, *,
                     method: str = 'bicubic') -> np.ndarray:
  """Resizes a (1, n, D) row or column table of posemb='learn2d' along axis 1.

  The 1-D case of `resize_posemb_grid`, with the same methods and convention:
  entry i of n sits at (i + 0.5) / n ('bicubic'), or the end entries are
  aligned (the original's 'linear_zoom', `scipy.ndimage.zoom(table[0],
  (n'/n, 1), order=1)`).

  Args:
    table: (1, n, D) array: `pos_embedding_row` (n = grid height) or
      `pos_embedding_col` (n = grid width).
    new_length: n', the new grid's height or width.
    method: 'bicubic' or 'linear_zoom', see `resize_posemb_grid`.

  Returns:
    (1, n', D) numpy array of the input's dtype.
  """
  _check_method(method)
  table = _check_posemb(table)
  new_length = int(new_length)
  if new_length < 1:
    raise ValueError(f'new_length must be positive, got {new_length}.')
  if new_length == table.shape[1]:
    return table
  return _resize(table[0], (new_length,), method)[None]


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

# The position tables under Transformer/posembed_input, per `posemb`.
_POSEMB_TABLES = {'learn': ('pos_embedding',),
                  'learn2d': ('pos_embedding_row', 'pos_embedding_col')}


def _posembed_input(tree: Mapping[str, Any]) -> Mapping[str, Any]:
  return tree.get('Transformer', {}).get('posembed_input', {})


def _resize_learn(params, init_params, path, *, has_cls, new_grid, old_grid,
                  method) -> None:
  """Resizes `params`' 1-D table (posemb='learn') in place, in 2-D."""
  posemb = _posembed_input(params).get('pos_embedding')
  target = _posembed_input(init_params).get('pos_embedding')
  if posemb is None or target is None:
    return  # inspect_params lists what is missing
  have, want = _shape(posemb), _shape(target)
  # Only the token count is resizable; other differences are listed later.
  if have == want or len(have) != 3 or len(want) != 3 or (
      have[0], have[2]) != (want[0], want[2]):
    return
  try:
    grid = new_grid
    if grid is None:
      side = _square_side(want[1] - int(has_cls), 'The model')
      grid = (side, side)
    if grid[0] * grid[1] != want[1] - int(has_cls):
      raise ValueError(f'new_grid {tuple(grid)} does not match the '
                       f"model's {want[1] - int(has_cls)} grid tokens.")
    resized = resize_posemb_grid(
        posemb, old_grid=old_grid, new_grid=grid, has_class_token=has_cls,
        method=method)
  except ValueError as e:
    raise CheckpointError(
        f'Cannot resize the position embedding of {path} from {have} to '
        f'{want}: {e}') from e
  logging.info('load_pretrained: resized pos_embedding %s -> %s.', have, want)
  params['Transformer']['posembed_input']['pos_embedding'] = resized


def _resize_learn2d(params, init_params, path, *, new_grid, old_grid,
                    method) -> None:
  """Resizes `params`' row and column tables (posemb='learn2d') in place.

  The model's tables give the new lengths; `new_grid` and `old_grid`, when
  given, must agree with them.
  """
  tables, targets = _posembed_input(params), _posembed_input(init_params)
  for axis, name in enumerate(_POSEMB_TABLES['learn2d']):
    if name not in tables or name not in targets:
      continue  # inspect_params lists what is missing
    have, want = _shape(tables[name]), _shape(targets[name])
    if have == want or len(have) != 3 or len(want) != 3 or (
        have[0], have[2]) != (want[0], want[2]):
      continue  # nothing to do, or listed by inspect_params
    try:
      for label, grid, length in (('new_grid', new_grid, want[1]),
                                  ('old_grid', old_grid, have[1])):
        if grid is not None and int(grid[axis]) != length:
          raise ValueError(f'{label} {tuple(grid)} does not match the '
                           f'length {length} of {name}.')
      resized = resize_posemb_1d(tables[name], want[1], method=method)
    except ValueError as e:
      raise CheckpointError(
          f'Cannot resize {name} of {path} from {have} to {want}: {e}') from e
    logging.info('load_pretrained: resized %s %s -> %s.', name, have, want)
    tables[name] = resized


def _check_unresizable(have: Mapping[str, Any], want: Mapping[str, Any],
                       path: str) -> None:
  """Explains the shape mismatches that no change of resolution can fix."""
  wrong = lambda keys: sorted(
      k for k in keys if k in want and _shape(have[k]) != _shape(want[k]))
  describe = lambda k: f'{k}: {_shape(have[k])} vs {_shape(want[k])}'

  # posemb='relative': one table per block, independent of the resolution.
  relative = wrong(k for k in have
                   if k.endswith('/posembed_relative/rel_embedding'))
  if relative:
    k = relative[0]
    raise CheckpointError('\n'.join([
        f'Checkpoint {path} does not fit the model: the relative position '
        f'table {k} is {_shape(have[k])} in the checkpoint and '
        f'{_shape(want[k])} in the model. These (2K+1, 2K+1, heads, '
        'D/heads) tables do not depend on the resolution and are never '
        'resized: K = transformer.relative_max_distance and the heads must '
        'stay as in pre-training.',
        _listing('relative position tables have the wrong shape (checkpoint '
                 'vs model)', relative, describe)]))

  # MLP-Mixer: the token-mixing MLPs are as wide as the number of patches.
  kernel = 'MixerBlock_0/token_mixing/Dense_0/kernel'
  if kernel in have and kernel in want and (
      _shape(have[kernel])[:1] != _shape(want[kernel])[:1]):
    raise CheckpointError('\n'.join([
        f'Checkpoint {path} is an MLP-Mixer for {_shape(have[kernel])[0]} '
        f'patches, but the model makes {_shape(want[kernel])[0]}: the '
        'token-mixing MLPs are as wide as the number of patches, so a Mixer '
        'cannot be fine-tuned at another resolution (or patch size); use the '
        'image size of pre-training.',
        _listing('token-mixing parameters have the wrong shape (checkpoint '
                 'vs model)', wrong(k for k in have if '/token_mixing/' in k),
                 describe)]))


def load_pretrained(*,
                    pretrained_path,
                    init_params: Mapping[str, Any],
                    model_config,
                    new_grid: Optional[Tuple[int, int]] = None,
                    old_grid: Optional[Tuple[int, int]] = None,
                    resize_method: str = 'bicubic') -> Params:
  """Loads a pre-trained checkpoint for fine-tuning the model of `init_params`.

  The head comes from `init_params` (zero kernel, `head_bias_init` bias).
  `pre_logits` is dropped when `model_config.representation_size` is None
  and kept otherwise; a checkpoint without it gets the fresh one of
  `init_params`. Everything else (a `MAPHead_0`, a hybrid's ResNet) comes
  from the checkpoint. Extra checkpoint keys are logged and dropped. The
  result has the tree structure of `init_params`.

  At a new resolution (Sec. 3.2 of the paper), by `model_config.posemb`:
  'learn' resizes `pos_embedding` in 2-D on the patch grid, keeping the class
  token's entry (`resize_posemb_grid`); 'learn2d' resizes `pos_embedding_row`
  to the new grid height and `pos_embedding_col` to its width
  (`resize_posemb_1d`); 'relative' (its tables do not depend on the
  resolution), 'sincos2d' and 'none' need nothing. An MLP-Mixer cannot change
  resolution: its token-mixing MLPs are as wide as the number of patches.

  Args:
    pretrained_path: the .npz checkpoint.
    init_params: the model's freshly initialized parameters.
    model_config: ConfigDict or dict with `classifier` (default 'token'),
      `representation_size` (default None) and `posemb` (default 'learn');
      a Mixer's config has none of them.
    new_grid: (h, w) grid of patch tokens at the new resolution, that is,
      the spatial shape of the `embedding` conv's output; None for a square
      grid. For a ViT it is the image size over the patch size. For a hybrid
      it is the ResNet feature map over the patch size: the root downsamples
      by 4 and each stage after the first by another 2, so an H x W image
      gives (H / (4 * 2**(S - 1)) / ph, W / (4 * 2**(S - 1)) / pw) with
      S = len(resnet.num_layers) >= 1 (H / 4 / ph for the root alone, S = 0).
      Only 'learn' needs it for a non-square grid ('learn2d' reads the
      lengths off `init_params`, and then only checks it).
    old_grid: (h, w) grid of the checkpoint; None for a square grid.
    resize_method: see `resize_posemb_grid`.

  Returns:
    Parameters shaped like `init_params`.

  Raises:
    FileNotFoundError: the file does not exist.
    CheckpointError: the file is unreadable, or its shapes or keys do not fit
      the model (the message lists the first few, with both shapes).
    ValueError: `model_config.posemb` or `resize_method` is unknown, or
      `init_params` has the position tables of another `posemb`.
  """
  path = os.fspath(pretrained_path)
  classifier = model_config.get('classifier', 'token')
  representation_size = model_config.get('representation_size')
  posemb = model_config.get('posemb') or 'learn'
  if posemb not in models_vit.POSEMBS:
    raise ValueError(f'Unknown model_config.posemb {posemb!r}; expected one '
                     f'of {models_vit.POSEMBS}.')
  _check_method(resize_method)
  tables = set(_posembed_input(init_params))
  if tables and tables != set(_POSEMB_TABLES.get(posemb, ())):
    raise ValueError(f'model_config.posemb={posemb!r}, but the model has the '
                     f'position tables {sorted(tables)}: pass the config of '
                     'the model of init_params.')
  params = load(path)

  if 'head' in init_params:
    params['head'] = dict(init_params['head'])
  else:
    params.pop('head', None)
  if representation_size is None:
    # inspect_params gives back the model's {} if it has a parameter-less one.
    if params.pop('pre_logits', None):
      logging.info('load_pretrained: dropping pre_logits (drop-head variant).')
  elif 'pre_logits' not in params and 'pre_logits' in init_params:
    logging.warning('load_pretrained: %s has no pre_logits; starting from the '
                    'initial ones.', path)
    params['pre_logits'] = dict(init_params['pre_logits'])

  _check_unresizable(_flatten(params), _flatten(init_params), path)
  if posemb == 'learn':
    _resize_learn(params, init_params, path,
                  has_cls=classifier in ('token', 'token_unpooled'),
                  new_grid=new_grid, old_grid=old_grid, method=resize_method)
  elif posemb == 'learn2d':
    _resize_learn2d(params, init_params, path, new_grid=new_grid,
                    old_grid=old_grid, method=resize_method)

  return inspect_params(params=params, expected=init_params,
                        fail_if_extra=False, fail_if_missing=True,
                        source=f'Checkpoint {path}')
