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
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import flexi
from vit_jax.models import ops as lean_ops
from vit_jax.models import resnet as models_resnet
from vit_jax.models.attention import attention
from vit_jax.models.layers import drop_path_rates
from vit_jax.models.layers import DropPath
from vit_jax.models.layers import IdentityLayer
from vit_jax.models.layers import keep_patches
from vit_jax.models.layers import LayerScale
from vit_jax.models.layers import MAPHead
from vit_jax.models.layers import MlpBlock
from vit_jax.models.posemb import AddPositionEmbs
from vit_jax.models.posemb import AddPositionEmbs2D
from vit_jax.models.posemb import check_image_size
from vit_jax.models.posemb import grid_positions
from vit_jax.models.posemb import Interp2DPosEmb
from vit_jax.models.posemb import pad_prefix
from vit_jax.models.posemb import patch_size
from vit_jax.models.posemb import posemb_sincos_2d
from vit_jax.models.posemb import POSEMBS
from vit_jax.models.posemb import RelativePositionBias
from vit_jax.models.posemb import rope2d_angles
from vit_jax.models.posemb import rope_head_dim

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
  stochastic_depth: float = 0.
  remat_policy: str = 'none'
  scan: bool = False
  gelu_approximate: bool = True
  swiglu: bool = False
  layerscale_init: Optional[float] = None
  posemb_prefix: bool = True
  final_norm: bool = True
  posemb_grid: Optional[Any] = None
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
    rows, cols, _, _ = grid_positions(grid)
    angles = pad_prefix(
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
    posemb_grid: FlexiViT: the (h, w) of the 'learn' table, resized to the
      tokens' grid at every call; None: the grid of the images at init.
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
  posemb_grid: Optional[Any] = None
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train, keep=None, patch_size=None):
    """Logits (or features) of NHWC `inputs`; `keep` (batch, k) ints picks
    the patches (row-major) that the encoder sees, as `Encoder`'s;
    `patch_size` (int or pair) runs at that patch size (`flexi`)."""
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; '
                       f'expected one of {CLASSIFIERS}.')
    x, grid = self._embed(inputs, patch_size)
    x = Encoder(name='Transformer', posemb=self.posemb,
                posemb_prefix=self.posemb_prefix, final_norm=not self.fc_norm,
                posemb_grid=flexi.table_grid(self.posemb_grid, grid,
                                             patch_size),
                dtype=jnp.dtype(self.dtype), **self.transformer)(
                    x, train=train, grid=grid, keep=keep)
    return self._head(x, train)

  def _embed(self, inputs, new_patch=None):
    """(prefix tokens then patch tokens, the (h, w) grid of the patches)."""
    stored = patch_size(self.patches)
    ph, pw = stored if new_patch is None else flexi.pair(new_patch)
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
    if new_patch is not None:  # FlexiViT: the stored kernel, PI-resized
      x = flexi.PatchEmbed(self.hidden_size, stored, dtype=dtype,
                           name='embedding')(x, (ph, pw))
    else:
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
