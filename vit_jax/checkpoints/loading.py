"""From any checkpoint to a model's parameters: `load_params`, and to the
model itself: `load_model`.

A checkpoint is an .npz in the original release's format (local, gs:// or
https://) or an Orbax workdir, which `files` reads. `model_config_for` and
`image_size` tell the model that a checkpoint was trained as, for callers
that build it; how a position table is resized is its family's.
"""

import os
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

from flax import traverse_util
import jax
import numpy as np

from vit_jax.checkpoints import files
from vit_jax.checkpoints import storage
from vit_jax.models import lit
from vit_jax.models import posemb
from vit_jax.models import posemb_resize
from vit_jax.models import registry
from vit_jax.models import timesformer
from vit_jax.models import vit as models_vit
from vit_jax.models import vivit
from vit_jax.platform import target

Params = Dict[str, Any]


def _note(path: str, action: str) -> None:
  """One line on stderr (process 0) for each change made to a checkpoint."""
  if jax.process_index() == 0:
    print(f'Checkpoint {path}: {action}.', file=sys.stderr, flush=True)


def _has_pre_logits(params: Mapping[str, Any]) -> bool:
  return 'kernel' in (params.get('pre_logits') or {})


def _image_tower(params: Mapping[str, Any], model_config) -> Mapping[str, Any]:
  """A two-tower file's image tower (`img`), given for an image model."""
  if 'image' not in model_config and 'img' in params and 'txt' in params:
    return params['img']
  return params


def model_config_for(params: Mapping[str, Any], model_config) -> Dict[str, Any]:
  """`model_config` (a dict) with the head and `pre_logits` of `params`.

  `num_classes` is the width of the checkpoint's head (None without one);
  `representation_size` that of its `pre_logits` (None without one). A LiT
  file given for an image model's config describes its image tower.
  """
  config = dict(model_config.to_dict() if hasattr(model_config, 'to_dict')
                else model_config)
  params = _image_tower(params, config)
  head = params.get('head')
  config['num_classes'] = files.shape_of(head['kernel'])[-1] if head else None
  config['representation_size'] = (
      files.shape_of(params['pre_logits']['kernel'])[-1]
      if _has_pre_logits(params) else None)
  return config


def load_model(model_config, path, size=None, *, model=None,
               abstract_params=None, found=None):
  """(model, params, image side) of the checkpoint at `path`: the image
  model of `model_config` with the file's head and `pre_logits`, at `size`
  (default: the side its position table implies; a (height, width) for a
  model with `posemb_grid`); `dtype='auto'` is this
  process's devices' for inference (`target.compute_dtype`).

  A two-tower model's config (`LitModel`) gives its image tower.
  A task whose model takes other inputs (LiT's images and tokens, NaViT's
  packed sequences) gives its `model` and `abstract_params`: the file must
  fit them as they are (no head or table to change; NaViT's tables are
  sized for its largest grid), and the side is `size` as given. `found`:
  the file's parameters, where the caller read them (a DPT's backbone).
  """
  if model is not None:
    return model, load_params(path, init_params=abstract_params,
                              model_config=model_config,
                              resize_posemb=False), size
  cls = registry.model_class(model_config.get('model_name') or '',
                             model_config)
  if issubclass(cls, vivit.ViViT):
    raise ValueError(f'{path} is a video model '
                     f'({model_config.get("model_name")}): it takes clips, '
                     "not images; evaluate it with trainer='video'.")
  if issubclass(cls, lit.LitModel):  # its image tower (a probe's encoder)
    model_config, cls = dict(model_config['image']), models_vit.VisionTransformer
  found = files.read_params(path) if found is None else found
  config = model_config_for(found, model_config)
  if config.get('dtype') == 'auto':
    config['dtype'] = target.compute_dtype(training=False)
  size = size or image_size(found, config)
  model = cls(**{k: v for k, v in config.items()
                 if k in cls.__dataclass_fields__ and k != 'parent'})
  height, width = _sides(size, config)
  shape = (1, height, width, 3)
  if issubclass(cls, timesformer.TimeSformer):  # clips of its frames
    shape = (1, _frames(found, config), *shape[1:])
  expected = jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros(shape, np.float32), train=False))['params']
  return model, load_params(path, init_params=expected, model_config=config,
                            found=found), size


def load_video_model(model_config, path, size, frames=None):
  """(model, params, frame side, frames) of a video checkpoint (a ViViT's
  or a TimeSformer's `model_config`) at `path`, taking clips of `frames` frames of `size` px;
  `frames` defaults to what a joint position table holds at that size. Its
  tables are the file's: other sizes are `inflate`'s (trainer='video')."""
  cls = registry.model_class(model_config.get('model_name') or '',
                             model_config)
  if issubclass(cls, timesformer.TimeSformer):  # its config has its frames
    model, params, size = load_model(model_config, path, size)
    return model, params, size, model.num_frames
  if size is None:
    raise ValueError(f'{path} is a video model and records no frame size: '
                     'give image_size.')
  found = files.read_params(path)
  config = model_config_for(found, model_config)
  if config.get('dtype') == 'auto':
    config['dtype'] = target.compute_dtype(training=False)
  model = vivit.ViViT(**{k: v for k, v in config.items()
                         if k in vivit.ViViT.__dataclass_fields__ and
                         k != 'parent'})
  frames = frames or _video_frames(found, config, size, path)
  expected = jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.zeros((1, frames, size, size, 3), np.float32),
      train=False))['params']
  return model, load_params(path, init_params=expected, model_config=config,
                            found=found, resize_posemb=False), size, frames


def _video_frames(params, config, size, path) -> int:
  """The frames of a clip whose tokens fill a joint table at `size`."""
  table = params.get('Transformer', {}).get('posembed_input', {}).get(
      'pos_embedding')
  if table is None or config.get('temporal_posemb') not in (None, 'joint'):
    raise ValueError(f'{path} is a video model whose frames only its record '
                     "says (its 'num_frames'): convert it with its "
                     'config.json, or give the record.')
  patch = models_vit.patch_size(config['patches'])
  tokens = files.shape_of(table)[1] - int(config.get('classifier', 'token')
                                           == 'token')
  per_slot = (size // patch[0]) * (size // patch[1])
  return tokens // per_slot * config.get('tubelet', 2)


def _frames(params, model_config) -> int:
  """A TimeSformer's frames: its config's, else its temporal table's."""
  tables = params['Transformer']['posembed_input']
  if model_config.get('num_frames'):
    return model_config['num_frames']
  if 'pos_embedding_time' in tables:
    return files.shape_of(tables['pos_embedding_time'])[1]
  return 1  # space_only: any number


def _sides(size, model_config):
  """(height, width) of an int side or a pair; a pair of unequal sides
  only for a model whose table is resized per image (`posemb_grid`)."""
  height, width = (size, size) if np.ndim(size) == 0 else size
  if height != width and model_config.get('posemb_grid') is None:
    raise ValueError(
        f'image_size {height} x {width}: only a model whose position table '
        'is resized to each image (posemb_grid, e.g. a NaFlex tower) takes '
        'non-square images; give one side.')
  return int(height), int(width)


def image_size(params: Mapping[str, Any], model_config) -> int:
  """The image side that the checkpoint's token grid implies (square)."""
  if 'patches' not in model_config:  # a ResNet takes any size
    raise ValueError('The model has no patch grid that fixes its '
                     'resolution: give the image size.')
  params = _image_tower(params, model_config)
  patch = models_vit.patch_size(model_config['patches'])[0]
  mixing = params.get('MixerBlock_0', {}).get('token_mixing')
  tables = params.get('Transformer', {}).get('posembed_input', {})
  relative = _relative_tables(params)
  if mixing is not None:
    tokens = files.shape_of(mixing['Dense_0']['kernel'])[0]
  elif relative:  # BEiT's, whatever its position table (if any)
    rows = files.shape_of(next(iter(relative.values())))[-2]
    return posemb.relative_bias_grid(rows)[0] * patch
  elif 'pos_embedding_grid' in tables:
    tokens = np.prod(files.shape_of(tables['pos_embedding_grid'])[:2])
  elif 'pos_embedding_row' in tables:
    tokens = files.shape_of(tables['pos_embedding_row'])[1]**2
  elif 'pos_embedding' in tables:
    tokens = files.shape_of(tables['pos_embedding'])[1] - (
        models_vit.posemb_prefix_tokens(model_config))
  else:
    raise ValueError('The checkpoint has no position table that fixes its '
                     'resolution: give the image size.')
  side = int(round(np.sqrt(tokens)))
  return side * patch * posemb.resnet_stride(model_config.get('resnet'))


# Fitting a checkpoint to the model.

# The position tables under Transformer/posembed_input, per `posemb`.
_POSEMB_TABLES = {'learn': ('pos_embedding',),
                  'learn2d': ('pos_embedding_row', 'pos_embedding_col'),
                  'interp2d': ('pos_embedding_grid',)}


def _posembed_input(tree: Mapping[str, Any]) -> Mapping[str, Any]:
  return tree.get('Transformer', {}).get('posembed_input', {})


def _check_posemb(posemb, init_params):
  """Raises ValueError unless the model's tables are those of `posemb`."""
  if posemb not in models_vit.POSEMBS:
    raise ValueError(f'Unknown model_config.posemb {posemb!r}; expected one '
                     f'of {models_vit.POSEMBS}.')
  # A TimeSformer's temporal table beside (loaded as it is: the model
  # interpolates it to a clip's frames).
  tables = set(_posembed_input(init_params)) - {'pos_embedding_time'}
  if tables and tables != set(_POSEMB_TABLES.get(posemb, ())):
    raise ValueError(f'model_config.posemb={posemb!r}, but the model has the '
                     f'position tables {sorted(tables)}: pass the config of '
                     'the model of init_params.')


def _table_grids(posemb, name, axis, have, want, prefix, new_grid, old_grid):
  """`resize_posemb_grid`'s grids for table `name`, from `have` to `want`."""
  if posemb == 'learn':
    tokens = want[1] - prefix
    grid = new_grid or (posemb_resize.square_side(tokens, 'The model'),) * 2
    if grid[0] * grid[1] != tokens:
      raise ValueError(f'new_grid {tuple(grid)} does not match the '
                       f"model's {tokens} grid tokens.")
    return dict(old_grid=old_grid, new_grid=grid, has_class_token=prefix)
  # 'learn2d': table `axis` of the grid; the given grids can only agree.
  for label, grid, length in (('new_grid', new_grid, want[1]),
                              ('old_grid', old_grid, have[1])):
    if grid is not None and int(grid[axis]) != length:
      raise ValueError(f'{label} {tuple(grid)} does not match the length '
                       f'{length} of {name}.')
  return dict(new_grid=(want[1],), has_class_token=False)


def _resize_posemb(params, init_params, path, posemb, prefix, method,
                   **grids):
  """Resizes the position tables of `params` to the model's, in place."""
  tables, targets = _posembed_input(params), _posembed_input(init_params)
  for axis, name in enumerate(_POSEMB_TABLES.get(posemb, ())):
    if name not in tables or name not in targets:
      continue  # files.inspect_params lists what is missing
    have, want = files.shape_of(tables[name]), files.shape_of(targets[name])
    if posemb == 'interp2d':
      _resize_interp2d(tables, path, have, want)
      continue
    # Only the token count is resizable; files.inspect_params lists the rest.
    if have == want or len(have) != 3 or len(want) != 3 or (
        have[0], have[2]) != (want[0], want[2]):
      continue
    try:
      table_grids = _table_grids(posemb, name, axis, have, want, prefix,
                                 **grids)
      tables[name] = posemb_resize.resize_posemb_grid(
          tables[name], method=method, **table_grids)
    except ValueError as e:
      raise files.CheckpointError(
          f'Cannot resize {name} of {path} from {have} to {want}: {e}'
      ) from e
    _note(path, f'resized {name} from {have} to {want} ({method}'
          + _grid_change(table_grids, have, prefix) + ')')


def _grid_change(table_grids, have, prefix) -> str:
  """', grid 16x16 -> 8x8' of a 'learn' table, for the note."""
  old = table_grids.get('old_grid')
  if 'old_grid' not in table_grids:  # 'learn2d': 1-D tables
    return ''
  if old is None:
    side = int(round(np.sqrt(have[1] - prefix)))
    old = (side, side) if side * side == have[1] - prefix else None
  new = table_grids['new_grid']
  return (f', grid {old[0]}x{old[1]} -> {new[0]}x{new[1]}' if old else
          f', grid -> {new[0]}x{new[1]}')


def _resize_interp2d(tables, path, have, want):
  """Resamples an 'interp2d' grid (H0, W0, D) to the model's, in place, as
  the model would at that grid (`posemb.interp2d_posemb`)."""
  if have == want or len(have) != 3 or len(want) != 3 or have[2] != want[2]:
    return  # files.inspect_params lists what does not fit
  positions = models_vit.grid_positions(want[:2])
  grid = posemb.interp2d_posemb(np.asarray(tables['pos_embedding_grid']),
                                    *positions)
  tables['pos_embedding_grid'] = np.asarray(grid).reshape(want)
  _note(path, f'resampled pos_embedding_grid from {have} to {want}')


def _relative_tables(tree: Mapping[str, Any]) -> Dict[str, Any]:
  """BEiT's tables of relative positions (`transformer.relative_bias`), by
  their '/'-joined names."""
  return {k: v for k, v in traverse_util.flatten_dict(tree, sep='/').items()
          if k.endswith('relative_bias/table')}


def _resize_relative(params, init_params, path, new_grid, old_grid):
  """Resizes BEiT's tables of `params` to the model's grid (`new_grid`, else
  the square one of its tables), as timm's checkpoint filter does, in
  place."""
  want = _relative_tables(init_params)
  for name, table in _relative_tables(params).items():
    have = files.shape_of(table)
    if name not in want or have == files.shape_of(want[name]):
      continue
    rows = files.shape_of(want[name])[-2]
    try:
      grid = new_grid or posemb.relative_bias_grid(rows)
      new = posemb_resize.resize_relative_table(
          table, grid, old_grid, extra=posemb.CLASS_ROWS)
      if new.shape[-2] != rows:
        raise ValueError(f'the grid {tuple(grid)} has tables of '
                         f'{new.shape[-2]} rows, the model {rows}.')
    except ValueError as e:
      raise files.CheckpointError(
          f'Cannot resize {name} of {path} from {have} to '
          f'{files.shape_of(want[name])}: {e}') from e
    *parents, leaf = name.split('/')
    node = params
    for key in parents:
      node = node[key]
    node[leaf] = new
    _note(path, f'resized {name} from {have} to {new.shape} (timm\'s '
          'geometric linear interpolation)')


def _check_unresizable(have: Mapping[str, Any], want: Mapping[str, Any],
                       path: str) -> None:
  """Explains the shape mismatches that no change of resolution can fix."""
  def wrong(part):
    return sorted(k for k in have if part in k and k in want and
                  files.shape_of(have[k]) != files.shape_of(want[k]))

  relative, mixing = wrong('/posembed_relative/'), wrong('/token_mixing/')
  if relative:
    k = relative[0]
    raise files.CheckpointError(
        f'Checkpoint {path} does not fit the model: {k} is '
        f'{files.shape_of(have[k])} in the checkpoint and '
        f'{files.shape_of(want[k])} in the '
        'model. Relative position tables never depend on the resolution: '
        'keep transformer.relative_max_distance and the heads of '
        'pre-training.\n' +
        files.wrong_shapes('relative position tables', relative, have, want))
  if mixing:  # sorted first: MixerBlock_0/token_mixing/Dense_0/kernel
    raise files.CheckpointError(
        f'Checkpoint {path} is an MLP-Mixer for '
        f'{files.shape_of(have[mixing[0]])[0]} patches, but the model makes '
        f'{files.shape_of(want[mixing[0]])[0]}: its '
        'token-mixing MLPs are as wide as the number of patches, so it '
        'cannot be fine-tuned at another resolution.\n' +
        files.wrong_shapes('token-mixing parameters', mixing, have, want))


def _abstract(tree) -> bool:
  return any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))


def _fit_head(params, init_params, new_head, path):
  """The model's fresh head, or the file's; `pre_logits` if the model has
  them (the model's own, when fine-tuning from a file without); the MAP
  head if the model has one."""
  for head in ('head', 'head_dist'):  # head_dist: DeiT's distillation head
    if new_head and head in init_params:
      if _abstract(init_params[head]):
        raise ValueError('new_head=True takes the head from init_params: '
                         'give arrays, not shapes.')
      params[head] = dict(init_params[head])
      kernel = files.shape_of(init_params[head]['kernel'])
      _note(path, f"new {head} {kernel} (the model's initial one)")
    elif head not in init_params and params.pop(head, None):
      _note(path, f'dropped the {head} (the model has none)')
  # A model that reads every token ('unpooled') has no attention pool.
  if 'MAPHead_0' not in init_params and params.pop('MAPHead_0', None):
    _note(path, 'dropped the MAP head MAPHead_0 (the model pools without '
          'it)')
  if not _has_pre_logits(init_params):
    # inspect_params gives back the model's {} if it has a parameter-less
    # one.
    if 'kernel' in (params.pop('pre_logits', None) or {}):
      _note(path, 'dropped pre_logits (the model has none)')
  elif new_head and not _has_pre_logits(params):
    if _abstract(init_params['pre_logits']):
      raise ValueError(f'{path} has no pre_logits, and init_params holds '
                       'shapes, not initial values for them.')
    params['pre_logits'] = dict(init_params['pre_logits'])
    _note(path, "the model's initial pre_logits (the file has none)")


def _recorded_resize(path: str) -> Optional[str]:
  """The resize that the record beside a local .npz names (transformers'
  DINOv2: torch's plain bicubic), or None."""
  if not path.endswith('.npz') or storage.is_remote(path):
    return None
  return (files.read_record(path) or {}).get('posemb_resize')


def default_resize_method(model_config) -> str:
  """How the position tables of `model_config`'s preset are resized: as its
  weights' source does ('bicubic' for a name that is no preset)."""
  return registry.posemb_resize_method(model_config.get('model_name') or '')


def load_params(path,
                *,
                init_params: Mapping[str, Any],
                model_config,
                new_head: bool = False,
                new_grid: Optional[Tuple[int, int]] = None,
                old_grid: Optional[Tuple[int, int]] = None,
                resize_method: Optional[str] = None,
                resize_posemb: bool = True,
                found: Optional[Params] = None) -> Params:
  """The parameters of the checkpoint at `path`, fitted to a model.

  `path` is an .npz (local, gs://, https://), an Orbax workdir or one of its
  `checkpoints/<step>` directories (`params` only), unless the caller read
  it already (`found`). Blocks are stacked as the model's; a LiT file given
  for an image model yields its image tower (`img`). With `new_head`
  (fine-tuning) the head is the model's, from `init_params`; else the file's
  is kept if the model has a head and dropped if not; so is `pre_logits`.
  Unless `resize_posemb` is False, position tables are resized to the
  model's grid as in `load_pretrained` (`new_grid` and `old_grid`: (h, w)
  if not square; BEiT's relative tables as timm resizes them), by
  `resize_method` (default: the record's
  `posemb_resize`, else as the weights' source does,
  `default_resize_method`). Each change is printed as one line on
  stderr.

  `init_params` may be shapes (`jax.eval_shape`) unless `new_head` needs
  the model's initial head; `model_config` gives `classifier` ('token') and
  `posemb` ('learn'). Returns numpy parameters shaped like `init_params`;
  raises FileNotFoundError, or files.CheckpointError listing what does not fit.
  """
  path = os.fspath(path)
  posemb = model_config.get('posemb') or 'learn'
  if resize_posemb:
    _check_posemb(posemb, init_params)
    resize_method = (resize_method or _recorded_resize(path) or
                     default_resize_method(model_config))
    posemb_resize.check_method(resize_method)
  params = files.read_params(path) if found is None else found
  if 'img' not in init_params and 'img' in params and 'txt' in params:
    _note(path, 'took the LiT image tower (img)')
    params = params['img']
  params = files.scan_like(params, init_params)
  _fit_head(params, init_params, new_head, path)
  _check_unresizable(traverse_util.flatten_dict(params, sep='/'),
                     traverse_util.flatten_dict(init_params, sep='/'), path)
  if resize_posemb:
    _resize_posemb(params, init_params, path, posemb,
                   models_vit.posemb_prefix_tokens(model_config),
                   resize_method, new_grid=new_grid, old_grid=old_grid)
    _resize_relative(params, init_params, path, new_grid, old_grid)
  return files.inspect_params(params=params, expected=init_params,
                        source=f'Checkpoint {path}')
