"""Checkpoints in the original release's .npz format, and fine-tuning loads.

Keys are '/'-joined parameter paths. Published files number an encoder
block's submodules pre-Linen, across classes (`LayerNorm_0`,
`MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`): `load` converts
with flax's `convert_pre_linen` and `save` writes the published names back.
The hybrids' GroupNorm scale and bias are (1, 1, 1, C) in files, (C,) here.
Errors a user can cause raise `FileNotFoundError` or `CheckpointError` with a
short listing, before anything is compiled.
"""

import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple
import zipfile
import zlib

from absl import logging
from flax import traverse_util
from flax.training import checkpoints as flax_checkpoints
import jax
import numpy as np

from vit_jax import models_vit
from vit_jax import posemb_resize
from vit_jax import storage
# Also importable from here, where the original release has them.
from vit_jax.posemb_resize import interpolate_posembed  # pylint: disable=unused-import
from vit_jax.posemb_resize import resize_posemb_grid

Params = Dict[str, Any]

# Linen names inside an encoder block -> the published, pre-Linen names.
_LINEN_TO_PRE_LINEN = {
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'LayerNorm_1': 'LayerNorm_2',
    'MlpBlock_0': 'MlpBlock_3',
}
_ENCODER_BLOCK = re.compile(r'(encoderblock_\d+/)([^/]+)')
# GroupNorm modules of the hybrid ResNet ('gn_root', 'gn_proj', 'gn1'...).
_GROUPNORM = re.compile(r'gn(\d+|_root|_proj)')
_MAX_LISTED = 10
# What numpy and zipfile raise on damaged or unsafe files.
_DECODE_ERRORS = (ValueError, EOFError, KeyError, zipfile.BadZipFile,
                  zlib.error)


class CheckpointError(ValueError):
  """A checkpoint that cannot be read, or that does not fit the model."""


# Files.


def _groupnorm_shapes(flat: Mapping[str, Any], to_file: bool) -> Params:
  """GroupNorm scale/bias: (1, 1, 1, C) in files, (C,) in Linen."""
  def reshape(key, value):
    module, _, name = key.rpartition('/')
    if not (_GROUPNORM.fullmatch(module.rpartition('/')[2]) and
            name in ('scale', 'bias')):
      return value
    return value.reshape((1, 1, 1, -1) if to_file else (-1,))
  return {k: reshape(k, v) for k, v in flat.items()}


def _read_arrays(path: str) -> Params:
  """The archive's arrays by key; refuses pickles and non-numeric data."""
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
        flat[key] = archive[key]
      except _DECODE_ERRORS as e:
        what = ('a pickled object array, which is never loaded'
                if 'allow_pickle' in str(e) else 'truncated or corrupt')
        raise CheckpointError(
            f'Cannot read {key!r} from checkpoint {path}: {what} '
            f'({type(e).__name__}: {e}).') from e
      if flat[key].dtype.kind not in 'biufc':
        raise CheckpointError(
            f'{key!r} in checkpoint {path} has dtype {flat[key].dtype}, not a '
            'numeric parameter.')
  if not flat:
    raise CheckpointError(f'Checkpoint {path} holds no arrays.')
  return flat


def load(path) -> Params:
  """Reads a checkpoint into nested dicts of numpy arrays, with Linen names.

  `path` may be local, in a bucket (gs://) or an https:// URL (fetched into
  a local cache once). Accepts pre-Linen and Linen names alike, and never
  unpickles. Raises
  FileNotFoundError, or CheckpointError for a damaged or non-numeric file.
  """
  path = os.fspath(path)
  flat = _groupnorm_shapes(_read_arrays(storage.local_copy(path)),
                           to_file=False)
  try:
    tree = traverse_util.unflatten_dict(flat, sep='/')
  except (TypeError, ValueError, IndexError) as e:
    raise CheckpointError(f'{path}: a key lies under another parameter '
                          f'({e}).') from e
  return flax_checkpoints.convert_pre_linen(tree)


def _unscanned(flat: Mapping[str, Any]) -> Params:
  """Blocks stacked by `transformer.scan` -> `encoderblock_{i}` (published)."""
  out = {}
  for key, value in flat.items():
    head, scanned, tail = key.partition('encoderblock/')
    out.update({f'{head}encoderblock_{i}/{tail}': layer
                for i, layer in enumerate(value)} if scanned else {key: value})
  return out


def scan_like(params: Mapping[str, Any], model_params: Mapping[str, Any]):
  """Stacks per-block parameters if the model scans its blocks."""
  if 'encoderblock' not in model_params.get('Transformer', {}):
    return params
  layers, out = {}, {}
  for key, value in traverse_util.flatten_dict(params, sep='/').items():
    match = re.fullmatch(r'(.*)encoderblock_(\d+)/(.*)', key)
    if match:
      stacked = f'{match[1]}encoderblock/{match[3]}'
      layers.setdefault(stacked, {})[int(match[2])] = value
    else:
      out[key] = value
  out.update({key: np.stack([blocks[i] for i in sorted(blocks)])
              for key, blocks in layers.items()})
  return traverse_util.unflatten_dict(out, sep='/')


def _published_name(key: str) -> str:
  """The published (pre-Linen) name of a '/'-joined Linen parameter path."""
  return _ENCODER_BLOCK.sub(
      lambda m: m[1] + _LINEN_TO_PRE_LINEN.get(m[2], m[2]), key)


def published_flat(params: Mapping[str, Any]) -> Params:
  """`params` (nested, Linen names, blocks maybe scanned) by '/'-joined
  published names, one entry per block; GroupNorm shapes are left as they
  are (`save` gives them the files' (1, 1, 1, C))."""
  flat = _unscanned(traverse_util.flatten_dict(dict(params), sep='/'))
  return {_published_name(k): v for k, v in flat.items()}


def save(params: Mapping[str, Any], path) -> None:
  """Writes `params` in the published format; `load` reads it back exactly.

  `path` may be local or in a bucket (gs://). The file appears atomically
  (written beside `path`, then renamed). Empty
  dicts (parameter-less modules) are not stored; `inspect_params` restores
  them. Scanned blocks are written one per block.
  """
  path = os.fspath(path)
  flat = _groupnorm_shapes(
      {k: np.asarray(v) for k, v in published_flat(
          jax.device_get(dict(params))).items()}, to_file=True)
  for key, value in flat.items():
    # bfloat16 and friends would be stored as opaque bytes: refuse them.
    if value.dtype.kind not in 'biufc':
      raise ValueError(f'Cannot save {key!r} of dtype {value.dtype}: cast it '
                       'to a numpy float type (e.g. float32) first.')
  storage.write_atomic(path, lambda f: np.savez(f, **flat))


# Checking a tree against the model.


def _shape(x) -> Tuple[int, ...]:
  return tuple(np.shape(x))  # arrays, ShapeDtypeStructs, Orbax metadata


def _listing(title: str, keys: Sequence[str], describe) -> str:
  lines = [f'  {len(keys)} {title}:']
  lines += [f'    {describe(k)}' for k in keys[:_MAX_LISTED]]
  if len(keys) > _MAX_LISTED:
    lines.append(f'    ... and {len(keys) - _MAX_LISTED} more')
  return '\n'.join(lines)


def _wrong_shapes(what: str, keys, have, want) -> str:
  return _listing(f'{what} have the wrong shape (checkpoint vs model)', keys,
                  lambda k: f'{k}: {_shape(have[k])} vs {_shape(want[k])}')


def inspect_params(*,
                   params: Mapping[str, Any],
                   expected: Mapping[str, Any],
                   fail_if_extra: bool = True,
                   fail_if_missing: bool = True,
                   source: Optional[str] = None) -> Params:
  """Compares the keys and shapes of `params` with the model's `expected`.

  Missing and extra keys are logged, and raise when asked to; wrong shapes
  always raise. Leaves only need a `shape`.

  Args:
    params: a loaded tree.
    expected: the model's tree, e.g. from `model.init` or `jax.eval_shape`.
    fail_if_extra: raise on keys the model lacks; else drop them.
    fail_if_missing: raise on model keys that `params` lacks.
    source: what `params` is, for messages (e.g. 'Checkpoint PATH').

  Returns:
    `params` without extra keys, plus the model's empty dicts. Raises a
    CheckpointError listing the first few offending keys, with shapes.
  """
  have = traverse_util.flatten_dict(params, sep='/')
  want = traverse_util.flatten_dict(expected, sep='/', keep_empty_nodes=True)
  empty = {k for k, v in want.items() if v is traverse_util.empty_node}
  missing = sorted(want.keys() - have.keys() - empty)
  extra = sorted(have.keys() - want.keys())
  wrong = sorted(k for k in have.keys() & want.keys()
                 if _shape(have[k]) != _shape(want[k]))
  if missing or extra:
    logging.info('inspect_params: missing keys %s, extra keys %s', missing,
                 extra)
  if wrong or (missing and fail_if_missing) or (extra and fail_if_extra):
    parts = [f'{source or "The parameters"} does not fit the model:']
    if wrong:
      parts.append(_wrong_shapes('parameters', wrong, have, want))
    if missing and fail_if_missing:
      parts.append(_listing('model parameters are missing', missing,
                            lambda k: f'{k}: {_shape(want[k])}'))
    if extra and fail_if_extra:
      parts.append(_listing('parameters are not in the model', extra,
                            lambda k: f'{k}: {_shape(have[k])}'))
    raise CheckpointError('\n'.join(parts))
  kept = {k: v for k, v in have.items() if k not in extra}
  kept.update({k: {} for k in empty})
  return traverse_util.unflatten_dict(kept, sep='/')


# Fine-tuning.

# The position tables under Transformer/posembed_input, per `posemb`.
_POSEMB_TABLES = {'learn': ('pos_embedding',),
                  'learn2d': ('pos_embedding_row', 'pos_embedding_col')}


def _posembed_input(tree: Mapping[str, Any]) -> Mapping[str, Any]:
  return tree.get('Transformer', {}).get('posembed_input', {})


def _table_grids(posemb, name, axis, have, want, has_cls, new_grid, old_grid):
  """`resize_posemb_grid`'s grids for table `name`, from `have` to `want`."""
  if posemb == 'learn':
    tokens = want[1] - has_cls
    grid = new_grid or (posemb_resize.square_side(tokens, 'The model'),) * 2
    if grid[0] * grid[1] != tokens:
      raise ValueError(f'new_grid {tuple(grid)} does not match the '
                       f"model's {tokens} grid tokens.")
    return dict(old_grid=old_grid, new_grid=grid, has_class_token=has_cls)
  # 'learn2d': table `axis` of the grid; the given grids can only agree.
  for label, grid, length in (('new_grid', new_grid, want[1]),
                              ('old_grid', old_grid, have[1])):
    if grid is not None and int(grid[axis]) != length:
      raise ValueError(f'{label} {tuple(grid)} does not match the length '
                       f'{length} of {name}.')
  return dict(new_grid=(want[1],), has_class_token=False)


def _resize_posemb(params, init_params, path, posemb, has_cls, method,
                   **grids):
  """Resizes the position tables of `params` to the model's, in place."""
  tables, targets = _posembed_input(params), _posembed_input(init_params)
  for axis, name in enumerate(_POSEMB_TABLES.get(posemb, ())):
    if name not in tables or name not in targets:
      continue  # inspect_params lists what is missing
    have, want = _shape(tables[name]), _shape(targets[name])
    # Only the token count is resizable; inspect_params lists the rest.
    if have == want or len(have) != 3 or len(want) != 3 or (
        have[0], have[2]) != (want[0], want[2]):
      continue
    try:
      tables[name] = resize_posemb_grid(tables[name], method=method, **(
          _table_grids(posemb, name, axis, have, want, has_cls, **grids)))
    except ValueError as e:
      raise CheckpointError(f'Cannot resize {name} of {path} from {have} to '
                            f'{want}: {e}') from e
    logging.info('load_pretrained: resized %s %s -> %s.', name, have, want)


def _check_unresizable(have: Mapping[str, Any], want: Mapping[str, Any],
                       path: str) -> None:
  """Explains the shape mismatches that no change of resolution can fix."""
  def wrong(part):
    return sorted(k for k in have if part in k and k in want and
                  _shape(have[k]) != _shape(want[k]))

  relative, mixing = wrong('/posembed_relative/'), wrong('/token_mixing/')
  if relative:
    k = relative[0]
    raise CheckpointError(
        f'Checkpoint {path} does not fit the model: {k} is '
        f'{_shape(have[k])} in the checkpoint and {_shape(want[k])} in the '
        'model. Relative position tables never depend on the resolution: '
        'keep transformer.relative_max_distance and the heads of '
        'pre-training.\n' +
        _wrong_shapes('relative position tables', relative, have, want))
  if mixing:  # sorted first: MixerBlock_0/token_mixing/Dense_0/kernel
    raise CheckpointError(
        f'Checkpoint {path} is an MLP-Mixer for {_shape(have[mixing[0]])[0]} '
        f'patches, but the model makes {_shape(want[mixing[0]])[0]}: its '
        'token-mixing MLPs are as wide as the number of patches, so it '
        'cannot be fine-tuned at another resolution.\n' +
        _wrong_shapes('token-mixing parameters', mixing, have, want))


def _fresh_head(params, init_params, representation_size, path):
  """Puts in the model's head; drops or supplies `pre_logits` as needed."""
  params.pop('head', None)
  if 'head' in init_params:
    params['head'] = dict(init_params['head'])
  if representation_size is None:
    # inspect_params gives back the model's {} if it has a parameter-less one.
    if params.pop('pre_logits', None):
      logging.info('load_pretrained: dropping pre_logits (drop-head variant).')
  elif 'pre_logits' not in params and 'pre_logits' in init_params:
    logging.warning('load_pretrained: %s has no pre_logits; starting from the '
                    'initial ones.', path)
    params['pre_logits'] = dict(init_params['pre_logits'])


def load_pretrained(*,
                    pretrained_path,
                    init_params: Mapping[str, Any],
                    model_config,
                    new_grid: Optional[Tuple[int, int]] = None,
                    old_grid: Optional[Tuple[int, int]] = None,
                    resize_method: str = 'bicubic') -> Params:
  """Loads a checkpoint to fine-tune the model of `init_params`.

  The head is the model's fresh one; `pre_logits` is dropped when
  `model_config.representation_size` is None; the rest comes from the file.
  At a new resolution (Sec. 3.2 of the paper) 'learn' tables are resized in
  2-D on the patch grid (the class entry kept) and 'learn2d' ones in 1-D; the
  other schemes have nothing to resize, and a Mixer cannot change resolution.

  Args:
    pretrained_path: the .npz checkpoint.
    init_params: the model's freshly initialized parameters.
    model_config: with `classifier` ('token'), `representation_size` (None)
      and `posemb` ('learn'), defaults in parentheses.
    new_grid: (h, w) patch grid of the model if not square; see
      `models_vit.token_grid`.
    old_grid: (h, w) patch grid of the checkpoint, if not square.
    resize_method: 'bicubic' or 'linear_zoom', see `resize_posemb_grid`.

  Returns:
    Parameters shaped like `init_params`; CheckpointError lists what does
    not fit.
  """
  path = os.fspath(pretrained_path)
  posemb = model_config.get('posemb') or 'learn'
  if posemb not in models_vit.POSEMBS:
    raise ValueError(f'Unknown model_config.posemb {posemb!r}; expected one '
                     f'of {models_vit.POSEMBS}.')
  posemb_resize.check_method(resize_method)
  tables = set(_posembed_input(init_params))
  if tables and tables != set(_POSEMB_TABLES.get(posemb, ())):
    raise ValueError(f'model_config.posemb={posemb!r}, but the model has the '
                     f'position tables {sorted(tables)}: pass the config of '
                     'the model of init_params.')
  params = scan_like(load(path), init_params)
  _fresh_head(params, init_params, model_config.get('representation_size'),
              path)
  _check_unresizable(traverse_util.flatten_dict(params, sep='/'),
                     traverse_util.flatten_dict(init_params, sep='/'), path)
  has_cls = model_config.get('classifier', 'token') in ('token',
                                                        'token_unpooled')
  _resize_posemb(params, init_params, path, posemb, int(has_cls),
                 resize_method, new_grid=new_grid, old_grid=old_grid)
  return inspect_params(params=params, expected=init_params,
                        fail_if_extra=False, fail_if_missing=True,
                        source=f'Checkpoint {path}')
