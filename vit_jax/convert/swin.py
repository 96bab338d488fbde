"""timm's Swin Transformer weights <-> vit_jax's names (`models_swin`).

`python -m vit_jax.convert` calls this for checkpoints with relative
position bias tables. The names map one to one (timm -> vit_jax):

  patch_embed.proj                     embedding            (Conv)
  patch_embed.norm                     embedding_norm
  layers.{i}.downsample.norm           layers_{i}/downsample/norm
  layers.{i}.downsample.reduction      layers_{i}/downsample/reduction
  layers.{i}.blocks.{j}.norm1, norm2   layers_{i}/blocks_{j}/norm1, norm2
  layers.{i}.blocks.{j}.attn.qkv, proj layers_{i}/blocks_{j}/attn/qkv, proj
  ...attn.relative_position_bias_table ...attn/relative_position_bias_table
  layers.{i}.blocks.{j}.mlp.fc1, fc2   layers_{i}/blocks_{j}/mlp/Dense_0, 1
  norm, head.fc                        norm, head

`weight` becomes `kernel` (transposed) or, for norms, `scale`. The buffers
`relative_position_index` and `attn_mask` are dropped: the model derives
them. The original release's layout (patch merging at the end of a stage,
`head`) is read too, as timm's `checkpoint_filter_fn` does. Bias tables of
another window are resized as timm's `resize_rel_pos_bias_table` does
(`posemb_resize.resize_relative_table`).
"""

import re
from typing import Dict, Optional

import numpy as np

from vit_jax.models import posemb_resize
from vit_jax.models import registry

Flat = Dict[str, np.ndarray]

# (timm module, vit_jax module); {i} and {j} are stage and block indices.
_MODULES = [
    ('patch_embed.proj', 'embedding'),
    ('patch_embed.norm', 'embedding_norm'),
    ('layers.{i}.downsample.norm', 'layers_{i}/downsample/norm'),
    ('layers.{i}.downsample.reduction', 'layers_{i}/downsample/reduction'),
    ('layers.{i}.blocks.{j}.norm1', 'layers_{i}/blocks_{j}/norm1'),
    ('layers.{i}.blocks.{j}.norm2', 'layers_{i}/blocks_{j}/norm2'),
    ('layers.{i}.blocks.{j}.attn.qkv', 'layers_{i}/blocks_{j}/attn/qkv'),
    ('layers.{i}.blocks.{j}.attn.proj', 'layers_{i}/blocks_{j}/attn/proj'),
    ('layers.{i}.blocks.{j}.mlp.fc1', 'layers_{i}/blocks_{j}/mlp/Dense_0'),
    ('layers.{i}.blocks.{j}.mlp.fc2', 'layers_{i}/blocks_{j}/mlp/Dense_1'),
    ('layers.{i}.blocks.{j}.attn', 'layers_{i}/blocks_{j}/attn'),
    ('norm', 'norm'),
    ('head.fc', 'head'),
]
_TABLE = 'relative_position_bias_table'
_BUFFERS = ('relative_position_index', 'attn_mask')


def _pattern(template: str, sep: str) -> re.Pattern:
  """`template` as a regex: '{i}' matches an index, the rest literally."""
  parts = re.split(r'\{(\w)\}', template)
  return re.compile(''.join(
      re.escape(p) if k % 2 == 0 else rf'(?P<{p}>\d+)'
      for k, p in enumerate(parts)) + re.escape(sep) + r'(?P<leaf>\w+)')


def _leaf_to_npz(module: str, leaf: str) -> str:
  if leaf == 'weight':
    return 'scale' if re.search(r'norm\d?$', module) else 'kernel'
  return leaf


def _leaf_to_timm(leaf: str) -> str:
  return 'weight' if leaf in ('scale', 'kernel') else leaf


def _value(value: np.ndarray, leaf: str, to_npz: bool) -> np.ndarray:
  """torch's (out, in[, kh, kw]) <-> flax's ([kh, kw,] in, out); tables
  (offsets, heads) and vectors are the same on both sides."""
  value = np.asarray(value)
  if leaf == _TABLE or value.ndim < 2:
    return value
  if value.ndim == 4:
    return value.transpose((2, 3, 1, 0) if to_npz else (3, 2, 0, 1))
  return value.T


def _rename(key: str, source: int) -> Optional[str]:
  """The other side's name of `key` (source 0: timm, 1: vit_jax), or None."""
  sep = '.' if source == 0 else '/'
  for pair in _MODULES:
    match = _pattern(pair[source], sep).fullmatch(key)
    if match:
      fields = {k: v for k, v in match.groupdict().items() if k != 'leaf'}
      module = pair[1 - source].format(**fields)
      leaf = (_leaf_to_npz(module, match['leaf']) if source == 0
              else _leaf_to_timm(match['leaf']))
      return module + ('/' if source == 0 else '.') + leaf
  return None


def _from_original(state: Flat) -> Flat:
  """The original release's layout as timm's: each stage's merging moves
  to the start of the next, `head` becomes `head.fc`."""
  if 'layers.0.downsample.reduction.weight' not in state:
    return state
  return {re.sub(r'^layers\.(\d+)\.downsample',
                 lambda m: f'layers.{int(m[1]) + 1}.downsample',
                 re.sub(r'^head\.', 'head.fc.', k)): v
          for k, v in state.items()}


def to_original(state: Flat) -> Flat:
  """timm's layout as the original release's (transformers' too): each
  stage's merging back to the end of the one before, `head.fc` to `head`;
  the inverse of `_from_original`."""
  if 'layers.0.downsample.reduction.weight' in state:
    return state
  return {re.sub(r'^layers\.(\d+)\.downsample',
                 lambda m: f'layers.{int(m[1]) - 1}.downsample',
                 re.sub(r'^head\.fc\.', 'head.', k)): v
          for k, v in state.items()}


def is_swin(names) -> bool:
  """Whether timm keys or vit_jax names are a Swin's (BEiT's tables are in
  `blocks`)."""
  return any(k.startswith('layers') and k.endswith(_TABLE) for k in names)


def _convert(state: Flat, source: int) -> Flat:
  out, unknown = {}, []
  for key, value in state.items():
    if source == 0 and key.endswith(_BUFFERS):
      continue
    name = _rename(key, source)
    if name is None:
      unknown.append(key)
    else:
      out[name] = _value(value, key.rsplit('.' if source == 0 else '/')[-1],
                         to_npz=source == 0)
  if unknown:
    side = 'vit_jax' if source == 0 else "timm's Swin"
    raise ValueError(f'{len(unknown)} name(s) have no counterpart in {side}: '
                     f'{", ".join(sorted(unknown)[:6])}.')
  return out


def timm_to_npz(state: Flat) -> Flat:
  """A timm Swin state dict (numpy) -> '/'-joined vit_jax names."""
  return _convert(_from_original(state), source=0)


def npz_to_timm(flat: Flat) -> Flat:
  """'/'-joined vit_jax names -> a timm Swin state dict (numpy)."""
  return _convert(flat, source=1)


def resize_bias_table(table: np.ndarray, window: int) -> np.ndarray:
  """A ((2w - 1)**2, heads) table of a square window w, for `window`."""
  return posemb_resize.resize_relative_table(table, (window, window))


def fit_window(flat: Flat, window: int) -> Flat:
  """`flat` with every bias table resized to `window` (if it differs)."""
  return {k: resize_bias_table(v, window) if k.endswith(_TABLE) else v
          for k, v in flat.items()}


def dims(flat: Flat) -> Dict[str, object]:
  """The architecture that vit_jax names `flat` imply."""
  blocks = sorted({(int(m[1]), int(m[2])) for k in flat for m in [
      re.match(r'layers_(\d+)/blocks_(\d+)/', k)] if m})
  stages = range(max(i for i, _ in blocks) + 1)
  tables = [flat[f'layers_{i}/blocks_0/attn/{_TABLE}'] for i in stages]
  side = int(round(np.sqrt(tables[0].shape[0])))
  return {'patch_size': flat['embedding/kernel'].shape[0],
          'embed_dim': flat['embedding/kernel'].shape[-1],
          'depths': tuple(sum(1 for s, _ in blocks if s == i) for i in stages),
          'num_heads': tuple(t.shape[1] for t in tables),
          'window_size': (side + 1) // 2}


_SHAPE = ('patch_size', 'embed_dim', 'depths', 'num_heads')


def preset(flat: Flat, model_name: Optional[str] = None) -> str:
  """The Swin preset of `flat`: `model_name` if it fits (its window may
  differ: the tables are resized), else the one of the same window."""
  have = dims(flat)

  def is_swin(name):
    return registry.family(name).timm_layout == 'swin'

  def fits(name):
    config = registry.MODEL_CONFIGS[name]
    return all(tuple(np.atleast_1d(config[k])) == tuple(np.atleast_1d(
        have[k])) for k in _SHAPE)

  if model_name is not None:
    if not is_swin(model_name) or not fits(model_name):
      raise ValueError(f'The weights are a Swin with {have}, which preset '
                       f'{model_name} is not.')
    return model_name
  found = [n for n in registry.MODEL_CONFIGS if is_swin(n)
           and fits(n) and registry.MODEL_CONFIGS[n].window_size ==
           have['window_size']]
  if not found:
    raise ValueError(f'No Swin preset has {have}: pass --model_name.')
  return found[0]
