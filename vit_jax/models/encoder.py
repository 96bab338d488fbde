"""The ViT's encoder: `Encoder1DBlock` (pre-LN self-attention and MLP) and
`Encoder` (position embedding, the blocks, the final norm), in the original
release's parameter names. Options beyond the original (relative bias,
BEiT's relative position tables, RoPE, LayerScale, SwiGLU, CLIP's
pre-norm, LayerNorm epsilon or RMSNorm, attention and MLP without some
biases, query/key norms) are attributes with the original's defaults.
"""

import functools
from typing import Any, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import flexi
from vit_jax.models.attention import attention
from vit_jax.models.attention import QK_NORMS
from vit_jax.models.attention import SelfAttention
from vit_jax.models.layers import drop_path_rates
from vit_jax.models.layers import DropPath
from vit_jax.models.layers import keep_patches
from vit_jax.models.layers import LayerScale
from vit_jax.models.layers import make_norm
from vit_jax.models.layers import MlpBlock
from vit_jax.models.posemb import AddPositionEmbs
from vit_jax.models.posemb import AddPositionEmbs2D
from vit_jax.models.posemb import grid_positions
from vit_jax.models.posemb import Interp2DPosEmb
from vit_jax.models.posemb import pad_prefix
from vit_jax.models.posemb import posemb_sincos_2d
from vit_jax.models.posemb import POSEMBS
from vit_jax.models.posemb import RELATIVE_BIASES
from vit_jax.models.posemb import RelativeBiasTable
from vit_jax.models.posemb import RelativePositionBias
from vit_jax.models.posemb import rope2d_angles
from vit_jax.models.posemb import rope_angles
from vit_jax.models.posemb import rope_head_dim
from vit_jax.models.posemb import ROPES
# What `transformer.remat_policy` saves for the backward pass of each block;
# the rest is recomputed. 'none' keeps every activation (no remat).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}




class Encoder1DBlock(nn.Module):
  """Pre-LN Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Attributes:
    dropout_rate: dropout after attention and in the MLP.
    relative_max_distance: if set, add a learned relative position bias
      (`RelativePositionBias`) with this clip distance to the attention
      logits; then the call needs `grid`.
    relative_bias: the block has its own `RelativeBiasTable`
      (`relative_bias/table`), BEiT's, added to the attention logits;
      then the call needs `grid`.
    drop_path_rate: stochastic depth rate of both residual branches.
    gelu_approximate, swiglu: see `MlpBlock`.
    layerscale_init: if set, scale each branch by a `LayerScale` (`ls1`
      for attention, `ls2` for the MLP) with this initial value, after its
      dropout and before drop path.
    qkv_bias: which of the query, key and value projections have biases:
      'qkv', 'qv' or 'none' (`SelfAttention`).
    layer_norm_eps: of the LayerNorms (1e-6; CLIP's and DINOv3's 1e-5).
    quick_gelu, mlp_norm: the MLP's QuickGELU, and its `inner_norm`.
    mlp_bias, out_bias: the MLP's Dense layers, and the attention's output
      projection, have biases (AIMv2's have none).
    rope_half: RoPE rotates pairs half a head apart (DINOv3).
    norm: the norms' kind, one of `layers.NORMS` ('layer'; 'rms':
      RMSNorm, InternViT-6B's and AIMv2's), named `LayerNorm_0` and `LayerNorm_1`.
    qk_norm: normalize queries and keys with a norm of that kind (and
      `layer_norm_eps`), per head or across all heads (`SelfAttention`).
    scanned: return (output, None), as the body of `nn.scan`; (output,
      output) with `scan_outputs`, so that the scan stacks every block's.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  relative_max_distance: Optional[int] = None
  relative_bias: bool = False
  drop_path_rate: float = 0.
  gelu_approximate: bool = True
  swiglu: bool = False
  layerscale_init: Optional[float] = None
  qkv_bias: str = 'qkv'
  layer_norm_eps: float = 1e-6
  quick_gelu: bool = False
  mlp_norm: bool = False
  mlp_bias: bool = True
  out_bias: bool = True
  rope_half: bool = False
  norm: str = 'layer'
  qk_norm: Optional[str] = None
  dtype: Any = jnp.float32
  scanned: bool = False
  scan_outputs: bool = False

  @nn.compact
  def __call__(self, inputs, deterministic, grid=None, mask=None, rope=None,
               bias=None, segment_ids=None):
    """The arguments are positional for `nn.remat`/`nn.scan`: `mask`,
    boolean (batch, 1, tokens, tokens), True where a token may attend to
    another; `rope`, (batch, tokens, depth / 2) RoPE angles (`attention`);
    `bias`, (1, heads, tokens, tokens) added to the attention logits (a
    table shared by the blocks), unless the block has its own;
    `segment_ids`, (batch, tokens): a token attends to its segment's only
    (packed sequences, `attention`).

    With 'intermediates' mutable, the attention weights are recorded as
    `MultiHeadDotProductAttention_0/attention_weights`.
    """
    options = {} if rope is None else {'rope': rope,
                                       'rope_half': self.rope_half}
    if self.relative_max_distance is not None:
      if grid is None:
        raise ValueError('A relative position bias needs the patch grid.')
      relative_bias = RelativePositionBias(self.relative_max_distance,
                                           name='posembed_relative')
      options['bias_fn'] = functools.partial(relative_bias, grid=grid)
    if self.relative_bias:
      if grid is None:
        raise ValueError("BEiT's relative bias table needs the patch grid.")
      bias = RelativeBiasTable(self.num_heads, name='relative_bias')(
          grid, inputs.shape[1])
    if bias is not None:
      options['bias'] = bias
    if segment_ids is not None:
      options['segment_ids'] = segment_ids

    norm = functools.partial(make_norm, self.norm, self.layer_norm_eps,
                             self.dtype)
    x = norm(name='LayerNorm_0')(inputs)
    x = self._attention(x, deterministic, mask, options, norm)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = self._scale(x, 'ls1')
    x = DropPath(self.drop_path_rate)(x, deterministic=deterministic)
    x = x + inputs

    y = norm(name='LayerNorm_1')(x)
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
                 gelu_approximate=self.gelu_approximate, swiglu=self.swiglu,
                 quick_gelu=self.quick_gelu, inner_norm=self.mlp_norm,
                 layer_norm_eps=self.layer_norm_eps, use_bias=self.mlp_bias,
                 dtype=self.dtype)(y, deterministic=deterministic)
    y = self._scale(y, 'ls2')
    y = DropPath(self.drop_path_rate)(y, deterministic=deterministic)
    if not self.scanned:
      return x + y
    return x + y, (x + y if self.scan_outputs else None)

  def _attention(self, x, deterministic, mask, options, norm):
    """Self-attention of `x`: flax's module, or `SelfAttention` (same
    parameter names) for projections without biases or with query/key
    norms (`norm`)."""
    settings = dict(num_heads=self.num_heads, deterministic=deterministic,
                    dropout_rate=self.attention_dropout_rate,
                    attention_fn=functools.partial(attention, **options),
                    dtype=self.dtype)
    sow = self.is_mutable_collection('intermediates')
    if self.qkv_bias != 'qkv' or self.qk_norm or not self.out_bias:
      return SelfAttention(qkv_bias=self.qkv_bias, qk_norm=self.qk_norm,
                           norm_fn=norm, out_bias=self.out_bias,
                           name='MultiHeadDotProductAttention_0',
                           **settings)(x, mask=mask, sow_weights=sow)
    return nn.MultiHeadDotProductAttention(
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        **settings)(x, x, mask=mask, sow_weights=sow)

  def _scale(self, x, name):
    """The branch `x` times LayerScale `name`, if the block has them."""
    if self.layerscale_init is None:
      return x
    return LayerScale(self.layerscale_init, name=name)(x)


class Encoder(nn.Module):
  """Position embedding, `num_layers` encoder blocks, final LayerNorm.

  Attributes:
    add_position_embedding: use position information at all; False is
      posemb='none' without the dropout on the input (as the original).
    posemb: one of POSEMBS (docs/position_embeddings.md); 'rope2d' rotates
      queries and keys in every block (`rope2d_angles`), 'interp2d' adds
      `Interp2DPosEmb`'s grid, created at the patch grid of initialization.
    relative_max_distance: clip distance of posemb='relative'.
    relative_bias: BEiT's learned bias per relative position, added to the
      attention logits (`RelativeBiasTable`; one class token, no `keep`):
      'block', a table in each block (`encoderblock_{i}/relative_bias/
      table`, timm's `use_rel_pos_bias`), or 'shared', one for all
      (`Transformer/relative_bias/table`, `use_shared_rel_pos_bias`).
    stochastic_depth: drop path rate of the last block; block i of L uses
      stochastic_depth * i / (L - 1).
    remat_policy: what each block keeps for the backward pass, a key of
      REMAT_POLICIES; the rest is recomputed.
    scan: run the blocks under `nn.scan`, their parameters stacked under
      `encoderblock` (compile time independent of depth); `checkpoint`
      reads and writes them in the published per-block names.
    gelu_approximate: True: tanh GELU (Google's checkpoints); False: exact
      erf GELU (timm's DeiT, MAE, DINOv2 and converted timm models).
    swiglu, layerscale_init: see `MlpBlock` and `Encoder1DBlock`.
    posemb_prefix: the learned 1-D table ('learn') has entries for the
      prefix (class, register) tokens; False (timm's `no_embed_class`): for
      the patches only. Set by `VisionTransformer`.
    final_norm: end with the norm `encoder_norm`; `VisionTransformer`
      omits it for its `fc_norm` (InternViT has none).
    pre_norm: a LayerNorm `norm_pre` before the blocks (CLIP's).
    rope: 2-D RoPE in every block beside `posemb` ('learn' or 'none'), one
      of ROPES (`rope_angles`): 'eva02' (`rope_theta` 1e4, positions
      rescaled to `rope_ref_grid`) or 'dinov3' (`rope_theta` 100); prefix
      tokens are not rotated. `rope_offset` is added to 'eva02' positions,
      and `rope_indexing` 'xy' puts the columns' angles first (Perception
      Encoder's 1 and 'xy').
    qkv_bias, layer_norm_eps, quick_gelu, mlp_norm, norm, qk_norm,
      mlp_bias, out_bias: see `Encoder1DBlock`; `norm` is also that of
      `norm_pre` and `encoder_norm`.
    posemb_grid: make the 'learn' table at this (h, w) and resize it to
      each call's grid (`flexi`); set by `VisionTransformer`.
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  add_position_embedding: bool = True
  posemb: str = 'learn'
  relative_max_distance: int = 8
  relative_bias: Optional[str] = None
  stochastic_depth: float = 0.
  remat_policy: str = 'none'
  scan: bool = False
  gelu_approximate: bool = True
  swiglu: bool = False
  layerscale_init: Optional[float] = None
  posemb_prefix: bool = True
  final_norm: bool = True
  pre_norm: bool = False
  rope: Optional[str] = None
  rope_theta: float = 10_000.
  rope_ref_grid: Optional[Tuple[int, int]] = None
  rope_offset: float = 0.
  rope_indexing: str = 'ij'
  qkv_bias: str = 'qkv'
  layer_norm_eps: float = 1e-6
  quick_gelu: bool = False
  mlp_norm: bool = False
  norm: str = 'layer'
  qk_norm: Optional[str] = None
  mlp_bias: bool = True
  out_bias: bool = True
  posemb_grid: Optional[Any] = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train, grid=None, keep=None, mask=None,
               take=None, depth=None, norm_taken=False):
    """Encodes (batch, tokens, D); `grid` is the (h, w) of the patch tokens,
    which come after any prefix (class, register) tokens; 2-D schemes need
    it. `keep`, (batch, k) ints into the row-major patches: after the
    position embedding only those patches, in that order, go on (MAE).
    `mask`, as `Encoder1DBlock`'s, is applied in every block (a text
    tower's causal attention).

    With `take`, block indices (`intermediates.take_indices`): returns
    (output, [the outputs of those blocks]), each through the final norm
    with `norm_taken`; only the first `depth` blocks run (default all),
    and the output is the last one's, through the final norm if it is the
    encoder's."""
    posemb = self._check_inputs(x, grid, keep)
    rope = None
    if posemb == 'rope2d' or self.rope:
      rope = self._rope(x, grid, keep)
    if self.add_position_embedding:
      x = self._embed_positions(x, posemb, grid)
    if keep is not None:
      x = keep_patches(x, keep, x.shape[1] - grid[0] * grid[1])
    if self.add_position_embedding:
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    norm = functools.partial(make_norm, self.norm, self.layer_norm_eps,
                             self.dtype)
    if self.pre_norm:
      x = norm(name='norm_pre')(x)

    relative = self.relative_max_distance if posemb == 'relative' else None
    bias = None
    if self.relative_bias == 'shared':
      bias = RelativeBiasTable(self.num_heads, name='relative_bias')(
          grid, x.shape[1])
    final = norm(name='encoder_norm') if self.final_norm else lambda y: y
    x, taken = self._blocks(x, not train, grid, relative, mask=mask,
                            rope=rope, bias=bias, take=take or (),
                            depth=depth)
    if take is None:
      return final(x)
    depth = self.num_layers if depth is None else depth
    if norm_taken:
      taken = [final(y) for y in taken]
    return (final(x) if depth == self.num_layers else x), taken

  def _check_inputs(self, x, grid, keep):
    """The effective posemb, once `grid` and `keep` are known to fit it."""
    if self.posemb not in POSEMBS:
      raise ValueError(f'Unknown posemb {self.posemb!r}; expected one of '
                       f'{POSEMBS}.')
    posemb = self.posemb if self.add_position_embedding else 'none'
    needs = None
    if self.rope and (self.rope not in ROPES or
                      posemb not in ('learn', 'none')):
      raise ValueError(f'rope={self.rope!r} with posemb={posemb!r}: expected '
                       f"one of {ROPES}, beside posemb 'learn' or 'none'.")
    if posemb == 'rope2d' or self.rope:
      rope_head_dim(x.shape[-1], self.num_heads)
    if self.qk_norm not in (None, *QK_NORMS):
      raise ValueError(f'Unknown qk_norm {self.qk_norm!r}; expected None or '
                       f'one of {QK_NORMS}.')
    if self.relative_bias not in (None, *RELATIVE_BIASES):
      raise ValueError(f'Unknown relative_bias {self.relative_bias!r}; '
                       f'expected None or one of {RELATIVE_BIASES}.')
    if self.relative_bias and posemb == 'relative':
      raise ValueError("relative_bias and posemb='relative' are two relative "
                       'position biases: choose one.')
    if posemb in ('learn2d', 'relative', 'sincos2d', 'rope2d', 'interp2d'):
      needs = f'posemb={posemb!r}'
    elif self.relative_bias:
      needs = f'relative_bias={self.relative_bias!r}'
    elif self.rope:
      needs = f'rope={self.rope!r}'
    elif posemb == 'learn' and not self.posemb_prefix:
      needs = 'posemb_prefix=False'
    elif keep is not None:
      needs = 'keep'
    if needs and (grid is None or x.shape[1] < grid[0] * grid[1]):
      raise ValueError(f'{needs} needs the patch grid (h, w) of the '
                       f'{x.shape[1]} tokens, got {grid}.')
    if keep is None:
      return posemb
    if posemb == 'relative' or self.relative_bias:
      what = (f'relative_bias={self.relative_bias!r}' if self.relative_bias
              else "posemb='relative'")
      raise ValueError(f'keep= cannot be used with {what}: its bias is '
                       'defined on the full patch grid.')
    patches = grid[0] * grid[1]
    if (keep.ndim != 2 or keep.shape[0] != x.shape[0] or
        keep.shape[1] > patches or not jnp.issubdtype(keep.dtype, jnp.integer)):
      raise ValueError(f'keep must be (batch, k) integer indices, k <= '
                       f'{patches} patches, batch {x.shape[0]}; got '
                       f'{keep.dtype} {tuple(keep.shape)}.')
    return posemb

  def _embed_positions(self, x, posemb, grid):
    """Adds the position embedding of `posemb` to the tokens `x`."""
    if posemb == 'learn' and self.posemb_grid is not None:  # FlexiViT
      return flexi.ResizedPositionEmbs(self.posemb_grid, self.posemb_prefix,
                                       name='posembed_input')(x, grid)
    if posemb == 'learn':
      if self.posemb_prefix:
        return AddPositionEmbs(name='posembed_input')(x)
      prefix = x.shape[1] - grid[0] * grid[1]
      patches = AddPositionEmbs(name='posembed_input')(x[:, prefix:])
      return jnp.concatenate([x[:, :prefix], patches], axis=1)
    if posemb == 'learn2d':
      return AddPositionEmbs2D(name='posembed_input')(x, grid)
    if posemb == 'sincos2d':
      pe = posemb_sincos_2d(*grid, x.shape[-1], dtype=x.dtype)
      return x + pad_prefix(pe, x.shape[1] - grid[0] * grid[1])
    if posemb == 'interp2d':  # the grid of initialization, interpolated
      pe = Interp2DPosEmb(name='posembed_input')(
          grid_positions(grid), (*grid, x.shape[-1]))
      return x + pad_prefix(pe, x.shape[1] - grid[0] * grid[1]).astype(
          x.dtype)
    return x

  def _rope(self, x, grid, keep):
    """The RoPE angles of the tokens `x` (prefix tokens: 0), of those that
    go on after `keep`."""
    prefix = x.shape[1] - grid[0] * grid[1]
    head_dim = rope_head_dim(x.shape[-1], self.num_heads)
    if self.rope:
      angles = rope_angles(self.rope, grid, head_dim, self.rope_theta,
                           self.rope_ref_grid, self.rope_offset,
                           self.rope_indexing)[None]
    else:
      rows, cols, _, _ = grid_positions(grid)
      angles = rope2d_angles(rows, cols, head_dim)
    angles = pad_prefix(angles, prefix)
    if keep is None:
      return angles
    angles = jnp.broadcast_to(angles, (keep.shape[0], *angles.shape[1:]))
    return keep_patches(angles, keep, prefix)

  def _blocks(self, x, deterministic, grid, relative_max_distance, mask=None,
              rope=None, bias=None, take=(), depth=None, segment_ids=None):
    """The first `depth` blocks (default all), unrolled or scanned, with
    remat if asked: (output, [outputs of the blocks `take`]); `mask`,
    `rope`, `bias` and `segment_ids` as `Encoder1DBlock`'s. Scanned, the stacked
    parameters are cut to the blocks that run."""
    depth = self.num_layers if depth is None else depth
    if not 0 <= depth <= self.num_layers or any(i >= depth for i in take):
      raise ValueError(f'Blocks {tuple(take)} of the first {depth}: the '
                       f'encoder has {self.num_layers}.')
    block, settings = self._block(relative_max_distance)
    if self.scan:
      scanned = self._scanned(block, depth)
      if depth < self.num_layers:
        scanned = nn.map_variables(
            scanned, 'params', trans_in_fn=lambda tree: jax.tree.map(
                lambda a: a[:depth], tree))
      x, stacked = scanned(scanned=True, scan_outputs=bool(take),
                           name='encoderblock', **settings)(
                               x, deterministic, grid, mask, rope, bias,
                               segment_ids)
      return x, [stacked[i] for i in take]
    rates = drop_path_rates(self.stochastic_depth, self.num_layers)
    outputs = []
    for i in range(depth):
      x = block(drop_path_rate=rates[i], name=f'encoderblock_{i}',
                **settings)(x, deterministic, grid, mask, rope, bias,
                            segment_ids)
      outputs.append(x)
    return x, [outputs[i] for i in take]

  def _block(self, relative_max_distance):
    """The block class (with remat, if asked) and its settings."""
    if self.remat_policy not in REMAT_POLICIES:
      raise ValueError(f'Unknown remat_policy {self.remat_policy!r}; expected '
                       f'one of {tuple(REMAT_POLICIES)}.')
    block = Encoder1DBlock
    if self.remat_policy != 'none':
      block = nn.remat(block, policy=REMAT_POLICIES[self.remat_policy],
                       static_argnums=(2, 3), prevent_cse=not self.scan)
    settings = dict(mlp_dim=self.mlp_dim, num_heads=self.num_heads,
                    dropout_rate=self.dropout_rate,
                    attention_dropout_rate=self.attention_dropout_rate,
                    relative_max_distance=relative_max_distance,
                    relative_bias=self.relative_bias == 'block',
                    gelu_approximate=self.gelu_approximate,
                    swiglu=self.swiglu, layerscale_init=self.layerscale_init,
                    qkv_bias=self.qkv_bias, layer_norm_eps=self.layer_norm_eps,
                    quick_gelu=self.quick_gelu, mlp_norm=self.mlp_norm,
                    rope_half=self.rope == 'dinov3', norm=self.norm,
                    qk_norm=self.qk_norm, mlp_bias=self.mlp_bias,
                    out_bias=self.out_bias, dtype=self.dtype)
    return block, settings

  def _scanned(self, block, length):
    """`block` under `nn.scan` over `length` blocks (stacked parameters)."""
    if self.stochastic_depth:
      raise ValueError('transformer.scan runs all blocks alike: it cannot '
                       'take a per-block stochastic_depth.')
    return nn.scan(
        block, variable_axes={'params': 0, 'intermediates': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(nn.broadcast,) * 6, length=length)
