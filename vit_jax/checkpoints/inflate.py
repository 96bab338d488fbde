"""A video model (ViViT) from an image ViT's checkpoint: `load_video_params`.

As Scenic's ViViT initialises from an image model (projects/vivit/
model_utils.py, `initialise_from_train_state`): the patch kernel (p, p, C,
D) is inflated to the tubelet's (t, p, p, C, D) (`inflate_kernel`), the
position table resized to the video's patch grid and, for a joint table,
repeated over the T' slots (`video_posemb`); the encoder blocks and final
norm are taken as they are (the factorised encoder's spatial encoder, with
the class token, takes the image encoder whole); the head is new. A ViViT
checkpoint loads as it is (`loading.load_params`).
"""

import os
import sys
from typing import Any, Dict, Mapping, Optional, Tuple

from etils import epath
from flax import traverse_util
import jax
import numpy as np

from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.models import posemb_resize

Params = Dict[str, Any]
KERNEL_INITS = ('central_frame', 'average')


def _note(path: str, action: str) -> None:
  """One line on stderr (process 0) per change, as `loading`'s."""
  if jax.process_index() == 0:
    print(f'Checkpoint {path}: {action}.', file=sys.stderr, flush=True)


def inflate_kernel(kernel, frames: int, method: str) -> np.ndarray:
  """A 2-D patch kernel (p, p, C, D) as a tubelet's (frames, p, p, C, D):
  'central_frame', itself at frame frames // 2 and zeros elsewhere;
  'average', itself / frames at every frame (I3D's filter inflation). On a
  video of equal frames, both embed as the image kernel does its frame."""
  if method not in KERNEL_INITS:
    raise ValueError(f'Unknown kernel_init {method!r}; expected one of '
                     f'{KERNEL_INITS}.')
  kernel = np.asarray(kernel)
  if method == 'average':
    return np.repeat(kernel[None], frames, axis=0) / frames
  out = np.zeros((frames, *kernel.shape), kernel.dtype)
  out[frames // 2] = kernel
  return out


def video_posemb(table, *, prefix: int, slots: Optional[int],
                 grid: Tuple[int, int], method: str = 'bicubic',
                 old_grid: Optional[Tuple[int, int]] = None) -> np.ndarray:
  """An image's (1, prefix + tokens, D) table resized to the patch `grid`
  (h, w) by `method` (`posemb_resize.resize_posemb_grid`); with `slots`, a
  joint video table (1, prefix + slots·h·w, D): the prefix entries once,
  then the grid's entries for each slot in turn (token t·h·w + i of the
  patches is at slot t, patch i)."""
  table = np.asarray(table)
  if table.shape[1] - prefix != grid[0] * grid[1] or old_grid is not None:
    table = posemb_resize.resize_posemb_grid(
        table, old_grid=old_grid, new_grid=grid, has_class_token=prefix,
        method=method)
  if slots is None:
    return table
  return np.concatenate(
      [table[:, :prefix], np.tile(table[:, prefix:], (1, slots, 1))], axis=1)


def load_video_params(path,
                      *,
                      init_params: Mapping[str, Any],
                      model_config,
                      new_head: bool = True,
                      kernel_init: str = 'central_frame',
                      new_grid: Optional[Tuple[int, int]] = None,
                      num_frames: Optional[int] = None,
                      resize_method: Optional[str] = None,
                      found: Optional[Params] = None) -> Params:
  """The parameters of a ViViT (`init_params`, from `model.init`, and its
  `model_config`) from the checkpoint at `path`: an image ViT's, inflated,
  or a ViViT's, as it is (`loading.load_params`: `new_head` as there).

  From an image ViT: the embedding by `kernel_init` (`inflate_kernel`);
  the position table resized to the video's patch grid, `new_grid` (h, w)
  (default: square) by `resize_method` (default: as the preset's weights'
  source, `loading.default_resize_method`), then for a joint table repeated
  over the slots (`video_posemb`: `num_frames`, the video's frames, or
  `new_grid` tell how many) or, for a separate one, the temporal table and
  the factorised encoder's temporal encoder left at `init_params`; with
  `new_head` the head is `init_params`' too (else the file's). Each change
  is printed on stderr; `found`: the file's parameters, already read.
  A file that no ViT of the model's widths, depth and patch made raises
  files.CheckpointError saying what it is; FileNotFoundError if there is
  none.
  """
  path = os.fspath(path)
  if kernel_init not in KERNEL_INITS:
    raise ValueError(f'Unknown kernel_init {kernel_init!r}; expected one of '
                     f'{KERNEL_INITS}.')
  params = files.read_params(path) if found is None else found
  if 'img' in params and 'txt' in params:
    _note(path, 'took the LiT image tower (img)')
    params = params['img']
  _check_vit(params, path)
  if 'attention_type' in model_config:  # a TimeSformer
    method = resize_method or loading.default_resize_method(model_config)
    return _timesformer(params, init_params, model_config, path, new_grid,
                        method, new_head)
  if np.ndim(params['embedding']['kernel']) == 5:
    _check_same_encoder(params, init_params, path)
    _note(path, 'a video model: loaded as it is')
    return loading.load_params(path, init_params=init_params,
                               model_config=model_config, new_head=new_head,
                               resize_posemb=False, found=params)
  method = resize_method or loading.default_resize_method(model_config)
  posemb_resize.check_method(method)
  return _from_image(params, init_params, model_config, path, kernel_init,
                     (new_grid, num_frames), method, new_head)


def _from_image(params, init_params, model_config, path, kernel_init,
                grid_args, method, new_head):
  """`load_video_params` of an image ViT's `params`."""
  factorised = model_config.get('encoder') == 'factorised'
  target = 'SpatialTransformer' if factorised else 'Transformer'
  _check_encoder(params, init_params, target, path)
  _check_extra(params, path)
  prefix = int((model_config.get('classifier') or 'token') == 'token')
  tables = init_params[target]['posembed_input']
  joint = not factorised and 'pos_embedding_time' not in tables
  grid = _video_grid(tables, joint,
                     files.shape_of(init_params['embedding']['kernel'])[0],
                     prefix, *grid_args)
  out = {'embedding': _inflated_embedding(params, init_params, kernel_init,
                                          path)}
  out[target] = _encoder(params, init_params, target, path, prefix, grid,
                         method)
  _class_token(params, init_params, out,
               'cls_SpatialTransformer' if factorised else 'cls', path)
  for name in ('TemporalTransformer', 'cls_TemporalTransformer'):
    if name in init_params:
      out[name] = _initial(init_params, name)
      _note(path, f"{name}: the model's initial one (an image has none)")
  _head(params, init_params, out, new_head, path)
  return files.inspect_params(params=out, expected=init_params,
                              source=f'Checkpoint {path}')


def _timesformer(params, init_params, model_config, path, new_grid, method,
                 new_head):
  """A TimeSformer's parameters from a TimeSformer checkpoint (as it is)
  or an image ViT's, as the paper's code starts from one
  (TimeSformer's vit_utils.load_pretrained): the embedding, class token,
  blocks and final norm as they are, the table resized to the frame's
  grid; each block's temporal norm and attention copies of its spatial
  ones, `temporal_dense` zero (so each block computes the image block's
  on a still clip) and the temporal table the model's initial (zero)."""
  block = params['Transformer'].get('encoderblock_0', {})
  if 'temporal_attention' in block or 'pos_embedding_time' in params[
      'Transformer'].get('posembed_input', {}):
    _note(path, 'a TimeSformer: loaded as it is')
    return loading.load_params(path, init_params=init_params,
                               model_config=model_config, new_head=new_head,
                               new_grid=new_grid, found=params)
  _check_encoder(params, init_params, 'Transformer', path)
  _check_extra(params, path)
  grid = _video_grid(init_params['Transformer']['posembed_input'], False, 1,
                     1, new_grid, None)
  out = {'embedding': jax.tree.map(np.asarray, params['embedding'])}
  out['Transformer'] = _encoder(params, init_params, 'Transformer', path, 1,
                                grid, method)
  for name, block in out['Transformer'].items():
    want = init_params['Transformer'][name]
    if 'temporal_attention' not in want:
      continue
    block['temporal_norm'] = block['LayerNorm_0']
    block['temporal_attention'] = block['MultiHeadDotProductAttention_0']
    block['temporal_dense'] = jax.tree.map(
        lambda x: np.zeros(files.shape_of(x), np.float32),
        want['temporal_dense'])
  _note(path, 'temporal attention and norm: copies of the spatial ones; '
        'temporal_dense zero')
  _class_token(params, init_params, out, 'cls', path)
  _head(params, init_params, out, new_head, path)
  return files.inspect_params(params=out, expected=init_params,
                              source=f'Checkpoint {path}')


# What a checkpoint is.


def _kind(params: Mapping[str, Any]) -> Optional[str]:
  """What a checkpoint that no ViT made is, or None for a ViT's."""
  keys = set(params)
  if 'MixerBlock_0' in keys:
    return 'an MLP-Mixer'
  if 'embedding_norm' in keys or any(k.startswith('layers_') for k in keys):
    return 'a Swin Transformer'
  if 'root_block' in keys:
    return 'a ResNet (BiT)'
  if 'conv_root' in keys:
    return ("a hybrid ResNet+ViT, whose patches are the ResNet's features, "
            'not pixels')
  if keys & {'Embed_0', 'BertEncoder_0', 'txt'}:
    return 'a text tower'
  encoder = params.get('Transformer') or params.get('SpatialTransformer')
  if ('kernel' not in (params.get('embedding') or {}) or
      not isinstance(encoder, Mapping) or
      not any(k.startswith('encoderblock') for k in encoder)):
    return (f'no ViT (embedding and Transformer/encoderblock_*; it holds '
            f'{", ".join(sorted(keys)[:8])})')
  return None


def _check_vit(params, path):
  kind = _kind(params)
  if kind:
    raise files.CheckpointError(
        f'Checkpoint {path} is {kind}: a ViViT starts from an image ViT '
        '(or a ViViT) of its widths and depth.')


def check_source(path) -> None:
  """Refuses an .npz that no image ViT (or ViViT) made, from its names
  alone, before any data or model is made (other sources are checked as
  they load)."""
  if not str(path).endswith('.npz') or not epath.Path(path).exists():
    return
  with np.load(epath.Path(path).open('rb')) as arrays:
    names = {name: None for name in arrays.files}
  _check_vit(traverse_util.unflatten_dict(names, sep='/'), path)


def _check_same_encoder(params, init_params, path):
  """A ViViT file of the other encoder (factorised or not) is refused."""
  names = {'Transformer': 'unfactorised',
           'SpatialTransformer': 'factorised encoder'}
  have = next(n for k, n in names.items() if k in params)
  want = next((n for k, n in names.items() if k in init_params), have)
  if have != want:
    raise files.CheckpointError(
        f'Checkpoint {path} is a ViViT of the {have}, the model one of the '
        f'{want}: set config.model.encoder as the checkpoint was trained.')


def _blocks(encoder: Mapping[str, Any]) -> int:
  """Encoder blocks, per block or stacked (`transformer.scan`)."""
  if 'encoderblock' in encoder:
    return files.shape_of(jax.tree.leaves(encoder['encoderblock'])[0])[0]
  return sum(k.startswith('encoderblock_') for k in encoder)


def _describe(kernel, encoder) -> str:
  """'patch 16x16x3, width 768, depth 12, MLP 3072, 12 heads'."""
  *patch, width = files.shape_of(kernel)[-4:]
  block = (encoder.get('encoderblock') or encoder.get('encoderblock_0') or
           {})
  mlp = block.get('MlpBlock_0', {}).get('Dense_0', {}).get('kernel')
  query = block.get('MultiHeadDotProductAttention_0', {}).get(
      'query', {}).get('kernel')
  text = (f'patch {"x".join(map(str, patch))}, width {width}, '
          f'depth {_blocks(encoder)}')
  if mlp is not None:
    text += f', MLP {files.shape_of(mlp)[-1]}'
  if query is not None:
    text += f', {files.shape_of(query)[-2]} heads'
  return text


def _check_encoder(params, init_params, target, path):
  """Refuses an image ViT whose widths, depth or patch are not the
  model's."""
  have = _describe(params['embedding']['kernel'], params['Transformer'])
  want = _describe(init_params['embedding']['kernel'], init_params[target])
  if have != want:
    raise files.CheckpointError(
        f'Checkpoint {path} is a ViT of {have}; the model\'s {target} is of '
        f'{want}: choose the image ViT of its widths, depth and patch, or '
        'change config.model to it.')


# Fitting an image ViT to the video model.


def _initial(init_params, name):
  """`init_params[name]`, which must be values, not shapes."""
  tree = init_params[name]
  if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree)):
    raise ValueError(f'{name} keeps its initial values: give init_params '
                     'from model.init, not shapes.')
  return jax.tree.map(np.asarray, tree)


def _inflated_embedding(params, init_params, kernel_init, path):
  kernel = params['embedding']['kernel']
  frames = files.shape_of(init_params['embedding']['kernel'])[0]
  _note(path, f'inflated the embedding {files.shape_of(kernel)} to '
        f'{frames} frames ({kernel_init})')
  return {'kernel': inflate_kernel(kernel, frames, kernel_init),
          'bias': np.asarray(params['embedding']['bias'])}


def _encoder(params, init_params, target, path, prefix, grid, method):
  """The image encoder (blocks, final norm) under `target`, stacked as the
  model's, with its position table fitted (`_position_tables`)."""
  encoder = {k: v for k, v in params['Transformer'].items()
             if k != 'posembed_input'}
  encoder = files.scan_like({'Transformer': encoder},
                            {'Transformer': init_params[target]})
  encoder = encoder['Transformer']
  if target != 'Transformer':
    _note(path, f'Transformer -> {target}')
  encoder['posembed_input'] = _position_tables(
      params, init_params[target]['posembed_input'], path, prefix, grid,
      method)
  return encoder


def _video_grid(tables, joint, tubelet, prefix, new_grid, num_frames):
  """(slots, (h, w)) of the model's table: slots None for a spatial one,
  from `new_grid` or `num_frames` for a `joint` one."""
  tokens = files.shape_of(tables['pos_embedding'])[1] - prefix
  if not joint:
    slots = None
  elif new_grid is not None:
    slots = tokens // (new_grid[0] * new_grid[1])
  elif num_frames is not None:
    slots = num_frames // tubelet
  else:
    raise ValueError("A joint position table covers T'·h·w tokens: give "
                     'num_frames (the frames of the videos) or new_grid '
                     '(h, w).')
  patches = tokens // (slots or 1)
  if slots and tokens % slots:
    raise ValueError(f"{slots} slots do not divide the model's {tokens} "
                     'patch positions: check num_frames or new_grid.')
  grid = new_grid or (posemb_resize.square_side(patches, 'The model'),) * 2
  if (slots or 1) * grid[0] * grid[1] != tokens:
    raise ValueError(f"{slots or 1} slots of a {grid[0]}x{grid[1]} grid "
                     f"are not the model's {tokens} patch positions: check "
                     'num_frames or new_grid.')
  return slots, tuple(grid)


def _position_tables(params, tables, path, prefix, grid, method):
  """The model's `posembed_input` from the image's table."""
  image = params['Transformer'].get('posembed_input', {})
  if 'pos_embedding' not in image:
    raise files.CheckpointError(
        f'Checkpoint {path} has no learned position table Transformer/'
        f'posembed_input/pos_embedding (it has {sorted(image) or "none"}): '
        'a ViViT starts from a ViT with one.')
  table = _fit_prefix(np.asarray(image['pos_embedding']), int('cls' in params),
                      prefix, tables, path)
  slots, grid = grid
  want = files.shape_of(tables['pos_embedding'])
  try:
    out = video_posemb(table, prefix=prefix, slots=slots, grid=grid,
                       method=method)
  except ValueError as e:
    raise files.CheckpointError(
        f'Cannot fit pos_embedding {table.shape} of {path} to {want}: {e}'
    ) from e
  _note(path, f'pos_embedding {files.shape_of(image["pos_embedding"])} -> '
        f'{out.shape} (grid {grid[0]}x{grid[1]}, {method}' +
        (f', repeated over {slots} slots)' if slots else ')'))
  fitted = {'pos_embedding': out}
  if 'pos_embedding_time' in tables:
    fitted['pos_embedding_time'] = _initial(tables, 'pos_embedding_time')
    _note(path, "pos_embedding_time: the model's initial one")
  return fitted


def _fit_prefix(table, have_prefix, prefix, tables, path):
  """The image table with the model's class entry: dropped for a model
  without a class token, the model's initial one for an image without."""
  if have_prefix and not prefix:
    _note(path, "dropped the class token's position entry (the model has no "
          'class token)')
    return table[:, 1:]
  if prefix and not have_prefix:
    _note(path, "the model's initial class token position entry (the image "
          'model has no class token)')
    first = _initial(tables, 'pos_embedding')[:, :1]
    return np.concatenate([first, table], axis=1)
  return table


def _class_token(params, init_params, out, name, path):
  """The image's class token as the model's `name`; the model's initial
  one for an image without."""
  if name not in init_params:
    if 'cls' in params:
      _note(path, 'dropped the class token (the model has none)')
    return
  if 'cls' in params:
    out[name] = np.asarray(params['cls'])
    if name != 'cls':
      _note(path, f'cls -> {name}')
  else:
    out[name] = _initial(init_params, name)
    _note(path, f"{name}: the model's initial one (the image model has no "
          'class token)')


def _head(params, init_params, out, new_head, path):
  """`pre_logits` and `head` as `loading.load_params` fits them."""
  if 'kernel' in (init_params.get('pre_logits') or {}):
    if 'kernel' in (params.get('pre_logits') or {}):
      out['pre_logits'] = params['pre_logits']
    else:
      out['pre_logits'] = _initial(init_params, 'pre_logits')
      _note(path, "the model's initial pre_logits (the file has none)")
  elif 'kernel' in (params.get('pre_logits') or {}):
    _note(path, 'dropped pre_logits (the model has none)')
  if 'head' in init_params:
    if new_head or 'head' not in params:
      out['head'] = _initial(init_params, 'head')
      _note(path, f"new head {files.shape_of(out['head']['kernel'])} (the "
            "model's initial one)")
    else:
      out['head'] = params['head']
  elif 'head' in params:
    _note(path, 'dropped the head (the model has none)')


def _check_extra(params, path):
  """Refuses image models with parts a ViViT has no place for."""
  known = {'embedding', 'Transformer', 'cls', 'pre_logits', 'head'}
  extra = sorted(set(params) - known)
  if extra:
    raise files.CheckpointError(
        f'Checkpoint {path} has parameters that a ViViT has no place for: '
        f'{", ".join(extra)} (distillation or register tokens, fc_norm, '
        'a mask token): start from a plain ViT.')
