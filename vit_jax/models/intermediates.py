"""What every image model's `forward_intermediates` shares, as timm's.

`model.apply(v, x, method='forward_intermediates', indices=..., norm=...,
output_fmt='NHWC', intermediates_only=True)` gives the outputs of chosen
blocks (ViT, Mixer) or stages (Swin): the features that dense heads, retrieval
and a VLM's projector read. The blocks after the last one asked for are not
run.
"""

from typing import Optional, Sequence, Tuple, Union

import jax.numpy as jnp

OUTPUT_FORMATS = ('NHWC', 'NLC')
Indices = Optional[Union[int, Sequence[int]]]


def take_indices(count: int, indices: Indices) -> Tuple[int, ...]:
  """The blocks (of `count`) that `indices` names, from the first: an int n
  is the last n, a sequence those blocks (negative from the end), None all
  (timm's `feature_take_indices`)."""
  if indices is None:
    indices = count
  if isinstance(indices, int):
    if not 0 < indices <= count:
      raise ValueError(f'indices={indices}: the last n blocks, n from 1 to '
                       f'{count}.')
    return tuple(range(count - indices, count))
  taken = tuple(int(i) + count if int(i) < 0 else int(i) for i in indices)
  if not taken or not all(0 <= i < count for i in taken):
    raise ValueError(f'indices={tuple(indices)}: expected block indices in '
                     f'[-{count}, {count - 1}] (the model has {count}).')
  return taken


def of_maps(forward, count: int, indices: Indices, norm: bool,
            output_fmt: str, intermediates_only: bool):
  """`forward_intermediates` of a model whose blocks give maps (Swin's
  stages, SAM's blocks): `forward((taken, blocks to run, norm))` returns
  (final output, the taken blocks' (batch, h, w, C) maps)."""
  check_output_fmt(output_fmt)
  take = take_indices(count, indices)
  depth = max(take) + 1 if intermediates_only else count
  final, taken = forward((take, depth, norm))
  if output_fmt == 'NLC':
    taken = [jnp.reshape(y, (y.shape[0], -1, y.shape[-1])) for y in taken]
  return taken if intermediates_only else (final, taken)


def check_output_fmt(output_fmt: str, allowed=OUTPUT_FORMATS) -> None:
  if output_fmt not in allowed:
    raise ValueError(f'output_fmt={output_fmt!r}; expected one of {allowed}.')


def split_tokens(tokens, grid, prefix: int, output_fmt: str,
                 return_prefix_tokens: bool):
  """A block's (batch, prefix + h*w, D) tokens as its patch map (batch, h,
  w, D) for 'NHWC' or patch tokens (batch, h*w, D) for 'NLC'; with
  `return_prefix_tokens`, the pair (that, the prefix tokens)."""
  patches = tokens[:, prefix:]
  if output_fmt == 'NHWC':
    patches = jnp.reshape(patches, (tokens.shape[0], *grid, -1))
  return (patches, tokens[:, :prefix]) if return_prefix_tokens else patches
