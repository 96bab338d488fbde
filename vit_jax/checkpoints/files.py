"""Checkpoint files: the original release's .npz, and Orbax workdirs.

Keys of an .npz are '/'-joined parameter paths. Published files number an
encoder block's submodules pre-Linen, across classes (`LayerNorm_0`,
`MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`): `load`
converts with flax's `convert_pre_linen` and `save` writes the published
names back. The hybrids' GroupNorm scale and bias are (1, 1, 1, C) in files,
(C,) here. An Orbax workdir (`checkpoints/<step>/`, written by `loop.py`)
holds a whole `TrainState`; `read_params` takes its parameters only. Errors a
user can cause raise `FileNotFoundError` or `CheckpointError` with a short
listing, before anything is compiled.
"""

import json
import os
import re
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple
import zipfile
import zlib

from absl import logging
from etils import epath
from flax import traverse_util
import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp

from vit_jax.checkpoints import storage

Params = Dict[str, Any]

# Linen names inside an encoder block -> the published, pre-Linen names.
_LINEN_TO_PRE_LINEN = {
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'LayerNorm_1': 'LayerNorm_2',
    'RMSNorm_1': 'RMSNorm_2',  # AIMv2's
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
      if flat[key].dtype == np.dtype('V2'):
        # numpy stores bfloat16 (big_vision's published arrays) as 2 opaque
        # bytes: read back as bfloat16, loaded as float32.
        flat[key] = flat[key].view(ml_dtypes.bfloat16).astype(np.float32)
      if flat[key].dtype.kind not in 'biufc':
        raise CheckpointError(
            f'{key!r} in checkpoint {path} has dtype {flat[key].dtype}, not a '
            'numeric parameter.')
  if not flat:
    raise CheckpointError(f'Checkpoint {path} holds no arrays.')
  return flat


def _from_big_vision(flat: Mapping[str, Any]) -> Params:
  """big_vision's published layout in the original's: everything under
  `params/`, a ViT's `pos_embedding` at its top (the image tower's, `img/`,
  in a two-tower model; the text tower's stays there, as ours), blocks
  maybe stacked (`encoderblock`, scanned); SigLIP 2's NaFlex ViT
  (`models/proj/image_text/naflex_vit.py`) embeds flattened patches by a
  Dense `embedding`: `_naflex_as_vit`."""
  if not all(k.startswith('params/') for k in flat):
    return dict(flat)
  out = {}
  for key, value in _unscanned({k[7:]: v for k, v in flat.items()}).items():
    key = re.sub(r'^(img/)?pos_embedding$',
                 r'\1Transformer/posembed_input/pos_embedding', key)
    out[key] = value
  return _naflex_as_vit(out)


def _naflex_as_vit(flat: Params) -> Params:
  """A NaFlex tower's Dense `embedding` (p * p * 3, D), of patches
  flattened in (p, p, C) order, as the conv kernel (p, p, 3, D) that
  computes the same; its (g, g, D) table as a ViT's (1, g * g, D), which a
  ViT with `posemb_grid=(g, g)` resizes to each image's grid."""
  out = dict(flat)
  for tower in ('', 'img/'):
    kernel = out.get(f'{tower}embedding/kernel')
    if kernel is None or np.ndim(kernel) != 2:
      continue
    side = int(round(np.sqrt(kernel.shape[0] / 3)))
    out[f'{tower}embedding/kernel'] = np.reshape(
        kernel, (side, side, 3, kernel.shape[1]))
    table = f'{tower}Transformer/posembed_input/pos_embedding'
    out[table] = np.reshape(out[table], (1, -1, np.shape(out[table])[-1]))
  return out


def beside(npz_path, suffix: str) -> epath.Path:
  """`<name>.<suffix>` beside `<name>.npz`: the record `convert` writes
  (`transform.json`), a two-tower model's vocabulary."""
  path = epath.Path(npz_path)
  stem = path.name[:-len('.npz')] if path.name.endswith('.npz') else path.name
  return path.parent / f'{stem}.{suffix}'


def read_record(npz_path) -> Optional[Dict[str, Any]]:
  """The record beside `npz_path` (`<name>.transform.json`), or None."""
  path = beside(npz_path, 'transform.json')
  if not path.exists():
    return None
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f'{path} is not valid JSON: {e}') from e


def load(path) -> Params:
  """Reads a checkpoint into nested dicts of numpy arrays, with Linen names.

  `path` may be local, in a bucket (gs://) or an https:// URL (fetched into
  a local cache once). Accepts pre-Linen and Linen names alike, and never
  unpickles. Raises FileNotFoundError, or CheckpointError for a damaged or
  non-numeric file.
  """
  path = os.fspath(path)
  flat = _groupnorm_shapes(
      _from_big_vision(_read_arrays(storage.local_copy(path))), to_file=False)
  try:
    tree = traverse_util.unflatten_dict(flat, sep='/')
  except (TypeError, ValueError, IndexError) as e:
    raise CheckpointError(f'{path}: a key lies under another parameter '
                          f'({e}).') from e
  # Imported here, once a file was found and read: flax.training.checkpoints
  # imports TensorFlow (flax.io), seconds that a bad path should not wait.
  from flax.training import checkpoints  # pylint: disable=g-import-not-at-top
  return checkpoints.convert_pre_linen(tree)


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
  (written beside `path`, then renamed). Empty dicts (parameter-less
  modules) are not stored; `inspect_params` restores them. Scanned blocks
  are written one per block.
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


def shape_of(x) -> Tuple[int, ...]:
  """The shape of an array, a ShapeDtypeStruct or Orbax metadata."""
  return tuple(np.shape(x))


def _listing(title: str, keys: Sequence[str], describe) -> str:
  lines = [f'  {len(keys)} {title}:']
  lines += [f'    {describe(k)}' for k in keys[:_MAX_LISTED]]
  if len(keys) > _MAX_LISTED:
    lines.append(f'    ... and {len(keys) - _MAX_LISTED} more')
  return '\n'.join(lines)


def wrong_shapes(what: str, keys, have, want) -> str:
  """Lists `keys` with their shapes in `have` (file) and `want` (model)."""
  return _listing(f'{what} have the wrong shape (checkpoint vs model)', keys,
                  lambda k: f'{k}: {shape_of(have[k])} vs {shape_of(want[k])}')


def inspect_params(*,
                   params: Mapping[str, Any],
                   expected: Mapping[str, Any],
                   fail_if_extra: bool = True,
                   fail_if_missing: bool = True,
                   source: Optional[str] = None) -> Params:
  """Compares the keys and shapes of `params` with the model's `expected`
  (e.g. from `model.init` or `jax.eval_shape`: leaves only need a `shape`).

  Missing and extra keys are logged; they raise if `fail_if_missing` and
  `fail_if_extra` (else extra keys are dropped); wrong shapes always raise:
  a CheckpointError on `source` (e.g. 'Checkpoint PATH') listing the first
  few offending keys, with shapes. Returns `params` without extra keys, plus
  the model's empty dicts.
  """
  have = traverse_util.flatten_dict(params, sep='/')
  want = traverse_util.flatten_dict(expected, sep='/', keep_empty_nodes=True)
  empty = {k for k, v in want.items() if v is traverse_util.empty_node}
  missing = sorted(want.keys() - have.keys() - empty)
  extra = sorted(have.keys() - want.keys())
  wrong = sorted(k for k in have.keys() & want.keys()
                 if shape_of(have[k]) != shape_of(want[k]))
  if missing or extra:
    logging.info('inspect_params: missing keys %s, extra keys %s', missing,
                 extra)
  if wrong or (missing and fail_if_missing) or (extra and fail_if_extra):
    parts = [f'{source or "The parameters"} does not fit the model:']
    if wrong:
      parts.append(wrong_shapes('parameters', wrong, have, want))
    if missing and fail_if_missing:
      parts.append(_listing('model parameters are missing', missing,
                            lambda k: f'{k}: {shape_of(want[k])}'))
    if extra and fail_if_extra:
      parts.append(_listing('parameters are not in the model', extra,
                            lambda k: f'{k}: {shape_of(have[k])}'))
    raise CheckpointError('\n'.join(parts))
  kept = {k: v for k, v in have.items() if k not in extra}
  kept.update({k: {} for k in empty})
  return traverse_util.unflatten_dict(kept, sep='/')


# Any checkpoint.


def _orbax_step(path: epath.Path) -> Tuple[epath.Path, Optional[int]]:
  """(CheckpointManager directory, step) of a workdir, of its `checkpoints`
  directory (the latest step) or of one `checkpoints/<step>` directory."""
  if path.name.isdigit():
    return path.parent, int(path.name)
  for directory in (path / 'checkpoints', path):
    # Steps still being written are named '<step>.orbax-checkpoint-tmp-...'.
    if directory.is_dir() and any(p.name.isdigit()
                                  for p in directory.iterdir()):
      return directory, None
  raise CheckpointError(
      f'{path} holds no checkpoint: expected an .npz file, a workdir with '
      'checkpoints/<step>/ in it, or one checkpoints/<step>/ directory.')


def _read_orbax(path: epath.Path) -> Params:
  """The `params` of a saved `TrainState`, as numpy, without the optimizer."""
  directory, step = _orbax_step(path)
  manager = ocp.CheckpointManager(
      directory, item_handlers=ocp.PyTreeCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(read_only=True))
  with manager:
    step = manager.latest_step() if step is None else step
    if step not in manager.all_steps():
      raise CheckpointError(f'{path} holds no finished checkpoint.')
    tree = manager.item_metadata(step).tree
    if 'params' not in tree:
      raise CheckpointError(f'Step {step} in {directory} holds no `params` '
                            f'(it holds {sorted(tree)}).')
    restore_args = jax.tree.map(
        lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree['params'])
    return manager.restore(step, args=ocp.args.PyTreeRestore(
        item={'params': tree['params']},
        restore_args={'params': restore_args},
        partial_restore=True))['params']


def read_params(path) -> Params:
  """Parameters of an .npz file (see `load`) or of an Orbax workdir.

  A directory is read as a workdir: its `checkpoints/<step>` with the
  highest step, or the step directory given. Raises FileNotFoundError or
  CheckpointError.
  """
  path = os.fspath(path)
  url = path.lower().startswith(('http://', 'https://'))
  if not (path.endswith('.npz') or url) and epath.Path(path).is_dir():
    return _read_orbax(epath.Path(path))
  return load(path)
