"""Vision Transformer (Dosovitskiy et al., ICLR 2021), in Flax Linen.

The module structure, and so the parameter tree, follows the original
release exactly: published checkpoints load with no renaming. The hybrid
models put the ResNet's `conv_root`, `gn_root` and `block{i}` at the top
level, before `embedding`, as the published R+ViT checkpoints do.

Position embeddings (`posemb`, the paper's Appendix D.4) and what each
needs at a new resolution: docs/position_embeddings.md. `dtype` is the
computation's everywhere; parameters stay float32.
"""

import functools
from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import lean_ops
from vit_jax import target
from vit_jax import models_resnet

POSEMBS = ('learn', 'none', 'learn2d', 'relative', 'sincos2d', 'rope2d',
           'interp2d')
ROPE_THETA = 10_000.  # MoonViT's (and EVA-02's) base of the RoPE frequencies
# What `transformer.remat_policy` saves for the backward pass of each block;
# the rest is recomputed. 'none' keeps every activation (no remat).
REMAT_POLICIES = {
    'none': None,
    'full': jax.checkpoint_policies.nothing_saveable,
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


class IdentityLayer(nn.Module):
  """Identity layer, so that an absent `pre_logits` keeps its name."""

  @nn.compact
  def __call__(self, x):
    return x


class AddPositionEmbs(nn.Module):
  """Adds a learned (1, tokens, width) position embedding to the tokens."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs):
    if inputs.ndim != 3:
      raise ValueError(f'Expected (batch, tokens, width), got {inputs.shape}.')
    return inputs + _posemb_table(
        self, 'pos_embedding', (1, *inputs.shape[1:]),
        'with `checkpoint.interpolate_posembed` (`load_pretrained` does)'
    ).astype(inputs.dtype)


class AddPositionEmbs2D(nn.Module):
  """Adds learned row and column embeddings, concatenated per patch.

  Patch (i, j) gets [row_i, col_j], each half of the width; the leading
  (class) tokens get nothing.
  """
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs, grid):
    d = inputs.shape[-1]
    h, w = grid
    if d % 2:
      raise ValueError(f"posemb='learn2d' needs an even width, got {d}.")
    fix = 'by 1-D interpolation along axis 1 (`load_pretrained` does)'
    row = _posemb_table(self, 'pos_embedding_row', (1, h, d // 2), fix)
    col = _posemb_table(self, 'pos_embedding_col', (1, w, d // 2), fix)
    # Row-major: patch i * w + j gets row i and column j.
    pe = jnp.concatenate([jnp.repeat(row, w, axis=1),
                          jnp.tile(col, (1, h, 1))], axis=-1)
    return inputs + _pad_prefix(pe, inputs.shape[1] - h * w).astype(
        inputs.dtype)


def _posemb_table(module, name, shape, fix):
  """`module`'s learned table `name` of `shape`, initialized if absent.

  A stored table of another shape means a resolution change without a
  resize: flax would raise too, but only this error says how to `fix` it.
  """
  if module.has_variable('params', name):
    stored = module.get_variable('params', name).shape
    if stored != shape:
      raise ValueError(
          f'The position embedding {name} has shape {stored} but the input '
          f'needs {shape}: resize it for the new resolution {fix}.')
  return module.param(name, module.posemb_init, shape)


def posemb_sincos_2d(h, w, width, temperature=10_000., dtype=jnp.float32):
  """Fixed 2-D sine-cosine position embeddings, as big_vision's.

  (1, h * w, width), row-major over the (h, w) grid: patch (y, x) gets
  [sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k)], w_k = temperature **
  (-k / (width/4 - 1)), k = 0 .. width/4 - 1; `width` is a multiple of 4.
  """
  if width % 4:
    raise ValueError(f"posemb='sincos2d' needs a width divisible by 4, "
                     f'got {width}.')
  quarter = width // 4
  omega = 1. / temperature**(np.arange(quarter) / max(quarter - 1, 1))
  y, x = np.mgrid[:h, :w]
  x, y = (np.outer(v.ravel(), omega) for v in (x, y))
  pe = np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)
  return jnp.asarray(pe[None], dtype)


def _pad_prefix(pe, prefix):
  """Prepends zero embeddings for the `prefix` (class) tokens."""
  return jnp.pad(pe, ((0, 0), (prefix, 0), (0, 0)))


# Position schemes as functions of each token's place: its (row, column) in
# its image's patch grid and that grid's (height, width). The ordinary ViT
# gives them `grid_positions`; a packed sequence (models_navit) its own.


def grid_positions(grid):
  """(rows, cols, heights, widths) of the patches of an (h, w) grid in
  row-major order, each int32 (1, h * w)."""
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w, dtype=np.int32), w)
  full = np.full((1, h * w), 1, np.int32)
  return rows[None], cols[None], h * full, w * full


def factorized_posemb(row_table, col_table, rows, cols, heights, widths,
                      fractional=False):
  """NaViT's factorized embedding of each token: row_table[i] + col_table[j].

  (i, j) is the token's (row, column); `fractional`: floor(row / height * G)
  and floor(col / width * G), G the tables' length. Indices past the tables
  are clipped (`models_navit.check_batch` rejects them on the host).
  """
  if fractional:  # integer arithmetic: exact floors; padding has height 0
    rows = rows * row_table.shape[0] // jnp.maximum(heights, 1)
    cols = cols * col_table.shape[0] // jnp.maximum(widths, 1)
  return (jnp.take(row_table, rows, axis=0, mode='clip') +
          jnp.take(col_table, cols, axis=0, mode='clip'))


def _cubic_taps(index, size, source, a=-0.75):
  """torch's bicubic resampling of `source` entries to `size`, one axis
  (`interpolate(mode='bicubic', align_corners=False)`, no antialiasing).

  For output entries `index` (ints), their 4 source entries (clamped to the
  borders) and Keys' weights with `a`, each (..., 4).
  """
  scale = source / jnp.maximum(size, 1).astype(jnp.float32)
  x = (index + 0.5) * scale - 0.5
  x0 = jnp.floor(x)
  t = (x - x0)[..., None]
  taps = jnp.clip(x0.astype(jnp.int32)[..., None] + np.arange(-1, 3), 0,
                  source - 1)

  def near(d):  # |d| <= 1
    return ((a + 2) * d - (a + 3)) * d * d + 1

  def far(d):  # 1 < |d| < 2
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

  weights = jnp.concatenate([far(t + 1), near(t), near(1 - t), far(2 - t)],
                            axis=-1)
  return taps, weights


def interp2d_posemb(table, rows, cols, heights, widths):
  """MoonViT's interpolated embedding of each token, (..., D).

  The learned grid `table` (H0, W0, D) resampled to the token's image grid
  (height, width) as torch's bicubic `interpolate` (`_cubic_taps`), at
  (row, column). Where the grid is (H0, W0) that is the table itself.
  """
  ty, wy = _cubic_taps(rows, heights, table.shape[0])
  tx, wx = _cubic_taps(cols, widths, table.shape[1])
  entries = table[ty[..., :, None], tx[..., None, :]]  # (..., 4, 4, D)
  weights = (wy[..., :, None] * wx[..., None, :])[..., None]
  # A sum, not a matmul: float32 even where matmuls default to less.
  return jnp.sum(entries * weights.astype(table.dtype), axis=(-3, -2))


def rope2d_angles(rows, cols, head_dim, theta=ROPE_THETA):
  """MoonViT's 2-D RoPE angles of each token, float32 (..., head_dim / 2).

  Frequencies f_k = theta ** (-4k / head_dim), k < head_dim / 4; angle 2k is
  col * f_k and angle 2k + 1 is row * f_k. A token at (0, 0) (and a class
  token, given 0s) is not rotated.
  """
  freqs = (theta**(-np.arange(0, head_dim, 4) / head_dim)).astype(np.float32)
  angles = jnp.stack([jnp.asarray(cols, jnp.float32)[..., None] * freqs,
                      jnp.asarray(rows, jnp.float32)[..., None] * freqs], -1)
  return angles.reshape(*angles.shape[:-2], head_dim // 2)


def rope_head_dim(width, num_heads):
  """The head width of 2-D RoPE, once checked: divisible by 4."""
  if width % num_heads or (width // num_heads) % 4:
    raise ValueError(f"posemb='rope2d' needs a head width (hidden_size / "
                     f'num_heads) divisible by 4, got {width} / {num_heads}.')
  return width // num_heads


def apply_rope(x, angles):
  """Rotates (batch, tokens, heads, d) `x` by (batch, tokens, d / 2)
  `angles`: pair (x[2j], x[2j + 1]) as a complex number, by angle j."""
  pairs = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
  re, im = pairs[..., 0], pairs[..., 1]
  cos, sin = jnp.cos(angles)[:, :, None], jnp.sin(angles)[:, :, None]
  out = jnp.stack([re * cos - im * sin, re * sin + im * cos], axis=-1)
  return out.reshape(x.shape).astype(x.dtype)


class Interp2DPosEmb(nn.Module):
  """MoonViT's learned 2-D grid `pos_embedding_grid`, interpolated to each
  token's image grid (`interp2d_posemb`).

  The grid is created as `shape` (H0, W0, D); once it exists its stored
  (H0, W0) is kept, whatever the images' grids.
  """
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, positions, shape):
    """The (..., D) embeddings of `positions` (rows, cols, heights, widths)."""
    if self.has_variable('params', 'pos_embedding_grid'):
      stored = self.get_variable('params', 'pos_embedding_grid').shape
      shape = (*stored[:2], shape[2])
    table = self.param('pos_embedding_grid', self.posemb_init, shape)
    return interp2d_posemb(table, *positions)


def relative_offset_index(grid, max_distance):
  """Index of the clipped (row, column) offset query - key, for all pairs.

  (h*w, h*w) ints, patches row-major on `grid` (h, w), into the offset table
  flattened over its (row, column) offsets in [-max_distance, max_distance].
  """
  h, w = grid
  rows, cols = np.divmod(np.arange(h * w), w)
  k = max_distance
  dr = np.clip(rows[:, None] - rows[None, :], -k, k) + k
  dc = np.clip(cols[:, None] - cols[None, :], -k, k) + k
  return dr * (2 * k + 1) + dc


class RelativePositionBias(nn.Module):
  """Attention bias from learned embeddings of relative 2-D offsets.

  For a query patch q and key patch k with clipped offset (dr, dc), the bias
  is <query_q, E[dr, dc]> per head: an extra attention whose keys are the
  offset embeddings. Pairs with a leading (class) token get zero bias.

  Attributes:
    max_distance: offsets are clipped to this distance in rows and columns;
      it fixes the table's size, whatever the resolution.
  """
  max_distance: int
  embedding_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, query, grid):
    """The (batch, heads, tokens, tokens) bias for `query`: (batch, tokens,
    heads, depth) queries scaled as for the content logits, (class) tokens
    first, then the patches of `grid` (h, w)."""
    _, tokens, heads, depth = query.shape
    span = 2 * self.max_distance + 1
    table = self.param('rel_embedding', self.embedding_init,
                       (span, span, heads, depth))
    patches = grid[0] * grid[1]
    prefix = tokens - patches
    if prefix < 0:
      raise ValueError(f'{tokens} tokens cannot hold a {grid} grid of patches.')
    index = relative_offset_index(grid, self.max_distance)
    logits = jnp.einsum('bqhd,uhd->bhqu', query[:, prefix:],
                        table.reshape(span * span, heads, depth))
    bias = logits[:, :, np.arange(patches)[:, None], index]
    return jnp.pad(bias, ((0, 0), (0, 0), (prefix, 0), (prefix, 0)))


def attention(query, key, value, bias=None, mask=None, broadcast_dropout=True,
              dropout_rng=None, dropout_rate=0., deterministic=False,
              dtype=None, precision=None, module=None, bias_fn=None,
              rope=None):
  """Flax's `attention_fn` on `jax.nn.dot_product_attention`.

  XLA fuses it, and on NVIDIA GPUs in half precision without a mask cuDNN's
  flash kernel runs it; logits and softmax are float32 either way. Flax's
  own function serves what the fused one lacks: dropout on the attention
  weights, and recording them (flax passes `module` when the weights are
  sown). `bias_fn(scaled query)`, if given, adds a bias to the logits;
  `rope`, (batch, tokens, depth / 2) angles, rotates queries and keys
  (`apply_rope`) first. `mask`: True where a query may attend to a key.
  """
  if rope is not None:
    query, key = apply_rope(query, rope), apply_rope(key, rope)
  if bias_fn is not None:
    bias = bias_fn(query / jnp.sqrt(query.shape[-1]).astype(query.dtype))
  if module is not None or (dropout_rate > 0. and not deterministic):
    return nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, dropout_rng=dropout_rng,
        dropout_rate=dropout_rate, broadcast_dropout=broadcast_dropout,
        deterministic=deterministic, dtype=dtype, precision=precision,
        module=module, force_fp32_for_softmax=True)
  if target.platform() == 'cpu':
    return _heads_first_attention(query, key, value, bias, mask)
  if (target.platform() == 'gpu' and bias is None and mask is None
      and query.dtype in (jnp.bfloat16, jnp.float16)):
    return jax.nn.dot_product_attention(query, key, value,
                                        implementation='cudnn')
  return _accelerator_attention(query, key, value, bias, mask)


def _accelerator_attention(query, key, value, bias=None, mask=None):
  """Attention as flax's default does it: the query scaled before the
  product, the logits and softmax in the inputs' dtype (accumulated in
  float32 by the TPU's matrix unit). `jax.nn.dot_product_attention`'s
  float32 logits and softmax cost a bf16 ViT-B/16 step on a TPU 1.4x the
  temporaries and 1.1x the HBM bytes of big_vision's (docs/performance.md).
  """
  query = query / np.sqrt(query.shape[-1]).astype(query.dtype)
  logits = jnp.einsum('bqhd,bkhd->bhqk', query, key)
  if bias is not None:
    logits = logits + bias.astype(logits.dtype)
  if mask is not None:  # finite: a query with no key gets uniform weights
    logits = jnp.where(mask, logits, jnp.finfo(logits.dtype).min)
  weights = jax.nn.softmax(logits).astype(value.dtype)
  return jnp.einsum('bhqk,bkhd->bqhd', weights, value)


def _heads_first_attention(query, key, value, bias=None, mask=None):
  """The same attention with heads moved before tokens first, for the CPU.

  XLA's CPU backend fuses the (batch, tokens, heads, depth) transposes into
  the batched matmuls of `jax.nn.dot_product_attention` and runs them at half
  speed (benchmarks/speed.py profile); transposed first, the attention of a
  ViT-Ti/16 training step runs 1.4x faster. Logits and softmax are float32.
  """
  query, key, value = (jnp.swapaxes(x, 1, 2) for x in (query, key, value))
  if bias is None and mask is None:
    return jnp.swapaxes(lean_ops.attention(query, key, value), 1, 2)
  logits = jnp.einsum('bhqd,bhkd->bhqk', query, key,
                      preferred_element_type=jnp.float32)
  logits = logits / np.sqrt(query.shape[-1]).astype(np.float32)
  if bias is not None:
    logits = logits + bias
  if mask is not None:  # finite: a query with no key gets uniform weights
    logits = jnp.where(mask, logits, np.finfo(np.float32).min)
  weights = lean_ops.softmax(logits).astype(value.dtype)
  return jnp.swapaxes(jnp.einsum('bhqk,bhkd->bhqd', weights, value), 1, 2)


class DropPath(nn.Module):
  """Stochastic depth: drops a residual branch for whole samples.

  In training each sample's branch is kept with probability 1 - rate and
  then scaled by 1 / (1 - rate), so its expectation is unchanged; at
  evaluation it is the identity. Uses the 'dropout' rng.
  """
  rate: float = 0.

  @nn.compact
  def __call__(self, x, *, deterministic):
    if not 0. <= self.rate < 1.:
      raise ValueError(f'Drop path rate must be in [0, 1), got {self.rate}.')
    # One draw per sample: the mask is broadcast over all other axes.
    return nn.Dropout(self.rate, broadcast_dims=range(1, x.ndim))(
        x, deterministic=deterministic)


def drop_path_rates(rate, num_layers):
  """Per-block drop path rates: linear from 0 (first) to `rate` (last)."""
  return [rate * i / max(num_layers - 1, 1) for i in range(num_layers)]


class MlpBlock(nn.Module):
  """Transformer MLP: Dense, GELU, dropout, Dense, dropout.

  Attributes:
    out_dim: output width (default: the input width).
    gelu_approximate: flax's tanh GELU (Google's checkpoints); False: the
      exact erf GELU (timm's and PyTorch's).
    swiglu: SwiGLU instead of GELU (timm's SwiGLUPacked, DINOv2-g):
      `Dense_0` makes 2 * mlp_dim features [x1, x2], and silu(x1) * x2
      goes on.
  """
  mlp_dim: int
  out_dim: Optional[int] = None
  dropout_rate: float = 0.1
  gelu_approximate: bool = True
  swiglu: bool = False
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.normal(stddev=1e-6)
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs, *, deterministic):
    dense = functools.partial(nn.Dense, kernel_init=self.kernel_init,
                              bias_init=self.bias_init, dtype=self.dtype)
    if self.swiglu:
      x1, x2 = jnp.split(dense(2 * self.mlp_dim)(inputs), 2, axis=-1)
      x = nn.silu(x1) * x2
    elif target.platform() != 'cpu':  # the CPU's trick costs HBM traffic
      x = nn.gelu(dense(self.mlp_dim)(inputs), self.gelu_approximate)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    elif deterministic or self.dropout_rate == 0:
      # GELU inside the next product, whose backward pass then keeps only
      # the hidden layer before GELU (lean_ops.gelu_dot_general).
      x = dense(self.mlp_dim)(inputs)
      dense = functools.partial(dense, dot_general=functools.partial(
          lean_ops.gelu_dot_general, approximate=self.gelu_approximate))
    else:
      x = lean_ops.gelu(dense(self.mlp_dim)(inputs), self.gelu_approximate)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = dense(inputs.shape[-1] if self.out_dim is None else self.out_dim)(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


class LayerScale(nn.Module):
  """Learned per-channel scale of a residual branch (CaiT's LayerScale,
  timm's `init_values`): a `scale` of shape (D,), initially `init_value`."""
  init_value: float

  @nn.compact
  def __call__(self, x):
    scale = self.param('scale', nn.initializers.constant(self.init_value),
                       (x.shape[-1],))
    return x * scale.astype(x.dtype)


class Encoder1DBlock(nn.Module):
  """Pre-LN Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Attributes:
    dropout_rate: dropout after attention and in the MLP.
    relative_max_distance: if set, add a learned relative position bias
      (`RelativePositionBias`) with this clip distance to the attention
      logits; then the call needs `grid`.
    drop_path_rate: stochastic depth rate of both residual branches.
    gelu_approximate, swiglu: see `MlpBlock`.
    layerscale_init: if set, scale each branch by a `LayerScale` (`ls1`
      for attention, `ls2` for the MLP) with this initial value, after its
      dropout and before drop path.
    scanned: return (output, None), as the body of `nn.scan`.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  relative_max_distance: Optional[int] = None
  drop_path_rate: float = 0.
  gelu_approximate: bool = True
  swiglu: bool = False
  layerscale_init: Optional[float] = None
  dtype: Any = jnp.float32
  scanned: bool = False

  @nn.compact
  def __call__(self, inputs, deterministic, grid=None, mask=None, rope=None):
    """The arguments are positional for `nn.remat`/`nn.scan`: `mask`,
    boolean (batch, 1, tokens, tokens), True where a token may attend to
    another; `rope`, (batch, tokens, depth / 2) RoPE angles (`attention`).

    With 'intermediates' mutable, the attention weights are recorded as
    `MultiHeadDotProductAttention_0/attention_weights`.
    """
    options = {} if rope is None else {'rope': rope}
    if self.relative_max_distance is not None:
      if grid is None:
        raise ValueError('A relative position bias needs the patch grid.')
      relative_bias = RelativePositionBias(self.relative_max_distance,
                                           name='posembed_relative')
      options['bias_fn'] = functools.partial(relative_bias, grid=grid)

    x = lean_ops.LayerNorm(dtype=self.dtype)(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads,
        kernel_init=nn.initializers.xavier_uniform(),
        broadcast_dropout=False,
        deterministic=deterministic,
        dropout_rate=self.attention_dropout_rate,
        attention_fn=functools.partial(attention, **options),
        dtype=self.dtype)(
            x, x, mask=mask,
            sow_weights=self.is_mutable_collection('intermediates'))
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = self._scale(x, 'ls1')
    x = DropPath(self.drop_path_rate)(x, deterministic=deterministic)
    x = x + inputs

    y = lean_ops.LayerNorm(dtype=self.dtype)(x)
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate,
                 gelu_approximate=self.gelu_approximate, swiglu=self.swiglu,
                 dtype=self.dtype)(y, deterministic=deterministic)
    y = self._scale(y, 'ls2')
    y = DropPath(self.drop_path_rate)(y, deterministic=deterministic)
    return (x + y, None) if self.scanned else x + y

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
    final_norm: end with the LayerNorm `encoder_norm`; `VisionTransformer`
      omits it for its `fc_norm`.
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  add_position_embedding: bool = True
  posemb: str = 'learn'
  relative_max_distance: int = 8
  stochastic_depth: float = 0.
  remat_policy: str = 'none'
  scan: bool = False
  gelu_approximate: bool = True
  swiglu: bool = False
  layerscale_init: Optional[float] = None
  posemb_prefix: bool = True
  final_norm: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, *, train, grid=None, keep=None):
    """Encodes (batch, tokens, D); `grid` is the (h, w) of the patch tokens,
    which come after any prefix (class, register) tokens; 2-D schemes need
    it. `keep`, (batch, k) ints into the row-major patches: after the
    position embedding only those patches, in that order, go on (MAE)."""
    posemb = self._check_inputs(x, grid, keep)
    rope = self._rope(x, grid, keep) if posemb == 'rope2d' else None
    if self.add_position_embedding:
      x = self._embed_positions(x, posemb, grid)
    if keep is not None:
      x = keep_patches(x, keep, x.shape[1] - grid[0] * grid[1])
    if self.add_position_embedding:
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)

    relative = self.relative_max_distance if posemb == 'relative' else None
    x = self._blocks(x, not train, grid, relative, rope=rope)
    if not self.final_norm:
      return x
    return lean_ops.LayerNorm(name='encoder_norm', dtype=self.dtype)(x)

  def _check_inputs(self, x, grid, keep):
    """The effective posemb, once `grid` and `keep` are known to fit it."""
    if self.posemb not in POSEMBS:
      raise ValueError(f'Unknown posemb {self.posemb!r}; expected one of '
                       f'{POSEMBS}.')
    posemb = self.posemb if self.add_position_embedding else 'none'
    needs = None
    if posemb == 'rope2d':
      rope_head_dim(x.shape[-1], self.num_heads)
    if posemb in ('learn2d', 'relative', 'sincos2d', 'rope2d', 'interp2d'):
      needs = f'posemb={posemb!r}'
    elif posemb == 'learn' and not self.posemb_prefix:
      needs = 'posemb_prefix=False'
    elif keep is not None:
      needs = 'keep'
    if needs and (grid is None or x.shape[1] < grid[0] * grid[1]):
      raise ValueError(f'{needs} needs the patch grid (h, w) of the '
                       f'{x.shape[1]} tokens, got {grid}.')
    if keep is None:
      return posemb
    if posemb == 'relative':
      raise ValueError("keep= cannot be used with posemb='relative': its "
                       'bias is defined on the full patch grid.')
    patches = grid[0] * grid[1]
    if (keep.ndim != 2 or keep.shape[0] != x.shape[0] or
        keep.shape[1] > patches or not jnp.issubdtype(keep.dtype, jnp.integer)):
      raise ValueError(f'keep must be (batch, k) integer indices, k <= '
                       f'{patches} patches, batch {x.shape[0]}; got '
                       f'{keep.dtype} {tuple(keep.shape)}.')
    return posemb

  def _embed_positions(self, x, posemb, grid):
    """Adds the position embedding of `posemb` to the tokens `x`."""
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
      return x + _pad_prefix(pe, x.shape[1] - grid[0] * grid[1])
    if posemb == 'interp2d':  # the grid of initialization, interpolated
      pe = Interp2DPosEmb(name='posembed_input')(
          grid_positions(grid), (*grid, x.shape[-1]))
      return x + _pad_prefix(pe, x.shape[1] - grid[0] * grid[1]).astype(
          x.dtype)
    return x

  def _rope(self, x, grid, keep):
    """The RoPE angles of the tokens `x` (prefix tokens: 0), of those that
    go on after `keep`."""
    prefix = x.shape[1] - grid[0] * grid[1]
    rows, cols, _, _ = grid_positions(grid)
    angles = _pad_prefix(
        rope2d_angles(rows, cols, rope_head_dim(x.shape[-1], self.num_heads)),
        prefix)
    if keep is None:
      return angles
    angles = jnp.broadcast_to(angles, (keep.shape[0], *angles.shape[1:]))
    return keep_patches(angles, keep, prefix)

  def _blocks(self, x, deterministic, grid, relative_max_distance, mask=None,
              rope=None):
    """The encoder blocks: unrolled or scanned, with remat if asked;
    `mask` and `rope` as `Encoder1DBlock`'s."""
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
                    gelu_approximate=self.gelu_approximate,
                    swiglu=self.swiglu, layerscale_init=self.layerscale_init,
                    dtype=self.dtype)
    if self.scan:
      if self.stochastic_depth:
        raise ValueError('transformer.scan runs all blocks alike: it cannot '
                         'take a per-block stochastic_depth.')
      x, _ = nn.scan(
          block, variable_axes={'params': 0, 'intermediates': 0},
          split_rngs={'params': True, 'dropout': True},
          in_axes=(nn.broadcast,) * 4, length=self.num_layers)(
              scanned=True, name='encoderblock', **settings)(
                  x, deterministic, grid, mask, rope)
      return x
    rates = drop_path_rates(self.stochastic_depth, self.num_layers)
    for i in range(self.num_layers):
      x = block(drop_path_rate=rates[i], name=f'encoderblock_{i}',
                **settings)(x, deterministic, grid, mask, rope)
    return x


def keep_patches(x, keep, prefix):
  """The `prefix` leading tokens of `x`, then its patches at `keep`, the
  (batch, k) indices into the tokens after the prefix."""
  patches = jnp.take_along_axis(x[:, prefix:], keep[:, :, None], axis=1)
  return jnp.concatenate([x[:, :prefix], patches], axis=1)


class MAPHead(nn.Module):
  """Multi-head attention pooling: a learned probe attends over the tokens.

  Attributes:
    mlp_dim: hidden width of the MLP after the attention (default 4 D).
    gelu_approximate: see `MlpBlock`.
  """
  num_heads: int
  mlp_dim: Optional[int] = None
  gelu_approximate: bool = True
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x, mask=None):
    """(batch, D) of (batch, tokens, D) `x`; with `mask`, (batch, queries,
    tokens) bools, one pooled token per query, attending where True: (batch,
    queries, D)."""
    n, _, d = x.shape
    queries = 1 if mask is None else mask.shape[1]
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d))
    probe = jnp.tile(probe, (n, queries, 1)).astype(x.dtype)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, kernel_init=nn.initializers.xavier_uniform(),
        attention_fn=attention, dtype=self.dtype)(
            probe, x, mask=None if mask is None else mask[:, None])
    y = lean_ops.LayerNorm(dtype=self.dtype)(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim or 4 * d, dropout_rate=0.,
                     gelu_approximate=self.gelu_approximate,
                     dtype=self.dtype)(y, deterministic=True)
    return x[:, 0] if mask is None else x


CLASSIFIERS = ('token', 'gap', 'map', 'unpooled', 'token_unpooled',
               'distilled')


def num_prefix_tokens(classifier_or_config) -> int:
  """Tokens before the patches for a classifier (or a model config's,
  default 'token'): class token and, for 'distilled', distillation token;
  for a config also its `num_registers` register tokens."""
  if isinstance(classifier_or_config, str):
    classifier, registers = classifier_or_config, 0
  else:
    classifier = classifier_or_config.get('classifier') or 'token'
    registers = classifier_or_config.get('num_registers') or 0
  if classifier == 'distilled':
    return 2 + registers
  return int(classifier in ('token', 'token_unpooled')) + registers


def posemb_prefix_tokens(model_config) -> int:
  """Leading entries of a model config's learned 1-D position table: one per
  prefix token, or none with `posemb_prefix` False."""
  if not model_config.get('posemb_prefix', True):
    return 0
  return num_prefix_tokens(model_config)


def has_class_token(classifier_or_config) -> bool:
  """Whether a classifier (or a model config's, default 'token') prepends a
  class token to the patches."""
  classifier = classifier_or_config
  if not isinstance(classifier, str):
    classifier = classifier_or_config.get('classifier') or 'token'
  return num_prefix_tokens(classifier) > 0


class VisionTransformer(nn.Module):
  """Vision Transformer, optionally on top of a ResNet (the hybrids).

  Attributes:
    num_classes: head size; 0 or None for no head.
    patches: ConfigDict with `size`, the (height, width) of a patch (of the
      ResNet's feature map for hybrids).
    transformer: ConfigDict of `Encoder` attributes.
    hidden_size: token width D.
    resnet: for hybrids, ConfigDict with `num_layers` (units per stage; may
      be empty for the root alone) and `width_factor` (root width is
      64 * width_factor, stage i's bottleneck width that times 2**i).
    representation_size: width of the tanh `pre_logits` layer, if any.
    classifier: 'token' (class token), 'gap' (mean of patch tokens), 'map'
      (attention pooling, `MAPHead`), 'unpooled' (all tokens, no class
      token), 'token_unpooled' (all tokens) or 'distilled' (DeiT's class
      and distillation tokens `cls`, `dist`, then the patches, each token
      with its head, `head` and `head_dist`: their mean at evaluation, the
      pair (class logits, distillation logits) in training; without a head
      the mean of the two tokens).
    posemb: position embedding scheme, one of POSEMBS; see `Encoder`.
    num_registers: learned register tokens `reg` (Darcet et al., 2024)
      after the class (and distillation) token; dropped before the head,
      so never pooled nor in the 'unpooled' outputs.
    posemb_prefix: the 'learn' table covers the prefix tokens too; False:
      the patches only (timm's `no_embed_class`, DeiT III).
    fc_norm: a LayerNorm `fc_norm` on the pooled feature instead of the
      encoder's final `encoder_norm` (timm's MAE fine-tuning with 'gap').
    head_bias_init: initial bias of the zero-initialized head.
    dtype: of the computation, e.g. jnp.bfloat16 or 'bfloat16'. Parameters
      stay float32; LayerNorm statistics, softmax and logits are float32.
  """
  num_classes: Optional[int]
  patches: Any
  transformer: Any
  hidden_size: int
  resnet: Optional[Any] = None
  representation_size: Optional[int] = None
  classifier: str = 'token'
  posemb: str = 'learn'
  num_registers: int = 0
  posemb_prefix: bool = True
  fc_norm: bool = False
  head_bias_init: float = 0.
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train, keep=None):
    """Logits (or features) of NHWC `inputs`; `keep` (batch, k) ints picks
    the patches (row-major) that the encoder sees, as `Encoder`'s."""
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; '
                       f'expected one of {CLASSIFIERS}.')
    x, grid = self._embed(inputs)
    x = Encoder(name='Transformer', posemb=self.posemb,
                posemb_prefix=self.posemb_prefix, final_norm=not self.fc_norm,
                dtype=jnp.dtype(self.dtype), **self.transformer)(
                    x, train=train, grid=grid, keep=keep)
    return self._head(x, train)

  def _embed(self, inputs):
    """(prefix tokens then patch tokens, the (h, w) grid of the patches)."""
    ph, pw = patch_size(self.patches)
    x = inputs
    if self.resnet is not None:
      check_image_size(x.shape, (1, 1))
      x = self._resnet(x)
      image = f'{inputs.shape[1]}x{inputs.shape[2]}'
      check_image_size(x.shape, (ph, pw),
                       what=f'ResNet feature map (of the {image} image)')
    else:
      check_image_size(x.shape, (ph, pw))

    dtype = jnp.dtype(self.dtype)
    x = nn.Conv(self.hidden_size, kernel_size=(ph, pw), strides=(ph, pw),
                padding='VALID', name='embedding', dtype=dtype)(x)
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    prefix = []
    if has_class_token(self.classifier):
      prefix.append(self.param('cls', nn.initializers.zeros, (1, 1, c)))
    if self.classifier == 'distilled':  # initialized as DeiT's
      prefix.append(self.param('dist', nn.initializers.normal(stddev=0.02),
                               (1, 1, c)))
    if self.num_registers:  # initialized as timm's
      prefix.append(self.param('reg', nn.initializers.normal(stddev=1e-6),
                               (1, self.num_registers, c)))
    x = jnp.concatenate(
        [jnp.tile(t, (n, 1, 1)).astype(dtype) for t in prefix] + [x], axis=1)
    return x, (h, w)

  def _head(self, x, train):
    """Pooling, `pre_logits` and the head(s) of the encoded tokens."""
    dtype = jnp.dtype(self.dtype)
    distilled = self.classifier == 'distilled'
    classes = num_prefix_tokens(self.classifier)
    if self.num_registers:
      x = jnp.concatenate([x[:, :classes],
                           x[:, classes + self.num_registers:]], axis=1)
    if self.classifier == 'token':
      x = x[:, 0]
    elif distilled:
      x = x[:, :2]  # class and distillation tokens
    elif self.classifier == 'gap':  # no class token
      x = jnp.mean(x, axis=1)
    elif self.classifier == 'map':
      x = MAPHead(num_heads=self.transformer['num_heads'],
                  mlp_dim=self.transformer['mlp_dim'],
                  gelu_approximate=self.transformer.get('gelu_approximate',
                                                        True),
                  dtype=dtype)(x)
    if self.fc_norm:
      x = lean_ops.LayerNorm(name='fc_norm', dtype=dtype)(x)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, name='pre_logits',
                           dtype=dtype)(x))
    else:
      x = IdentityLayer(name='pre_logits')(x)

    if not self.num_classes:
      return jnp.mean(x, axis=1) if distilled else x
    head = functools.partial(
        nn.Dense, self.num_classes, dtype=jnp.float32,
        kernel_init=nn.initializers.zeros,
        bias_init=nn.initializers.constant(self.head_bias_init))
    if not distilled:
      return head(name='head')(x)
    logits = head(name='head')(x[:, 0]), head(name='head_dist')(x[:, 1])
    # DeiT's evaluation averages the heads; its training loss needs both.
    return logits if train else (logits[0] + logits[1]) / 2

  def _resnet(self, x):
    """ResNet root and stages; their names stay at the top level.

    Downsamples by `resnet_stride(self.resnet)`; `token_grid` relies on it.
    """
    width = int(64 * self.resnet['width_factor'])
    dtype = jnp.dtype(self.dtype)
    x = models_resnet.StdConv(width, (7, 7), (2, 2), use_bias=False,
                              name='conv_root', dtype=dtype)(x)
    x = nn.relu(nn.GroupNorm(name='gn_root', dtype=dtype)(x))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding='SAME')
    for i, block_size in enumerate(self.resnet['num_layers']):
      x = models_resnet.ResNetStage(
          block_size=block_size, features=width * 2**i,
          first_stride=(2, 2) if i else (1, 1), name=f'block{i + 1}',
          dtype=dtype)(x)
    return x


def patch_size(patches) -> Tuple[int, int]:
  """(height, width) of `patches['size']`, which may be an int or a pair."""
  size = patches['size']
  ph, pw = (size, size) if isinstance(size, int) else tuple(size)
  return int(ph), int(pw)


def resnet_stride(resnet) -> int:
  """How much a hybrid's ResNet (`VisionTransformer._resnet`) downsamples.

  The root (stride-2 conv, stride-2 max-pool) downsamples by 4 and each
  stage after the first by another 2. No ResNet (None) gives 1.
  """
  if resnet is None:
    return 1
  return 4 * 2**max(len(resnet['num_layers']) - 1, 0)


def token_grid(model_config, image_size) -> Tuple[int, int]:
  """The (h, w) grid of patch tokens that a ViT or hybrid makes of an image
  of `image_size` (height, width), from its config alone (no tracing)."""
  stride = resnet_stride(model_config.get('resnet'))
  ph, pw = patch_size(model_config['patches'])
  # The ResNet pads ('SAME'), so each of its strides rounds up.
  height, width = (-(-side // stride) for side in image_size)
  return height // ph, width // pw


def check_image_size(shape, patch: Tuple[int, int], what: str = 'Image'):
  """Raises a ValueError unless `shape` is NHWC, sides multiples of `patch`."""
  if len(shape) != 4:
    raise ValueError(f'Expected NHWC images, got shape {tuple(shape)}.')
  _, h, w, _ = shape
  if h % patch[0] or w % patch[1] or h < patch[0] or w < patch[1]:
    raise ValueError(
        f'{what} size {h}x{w} is not a multiple of the patch size '
        f'{patch[0]}x{patch[1]}.')
