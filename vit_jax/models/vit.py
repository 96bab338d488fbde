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
import jax.numpy as jnp

from vit_jax.models import flexi
from vit_jax.models import intermediates
from vit_jax.models import ops
from vit_jax.models import resnet as models_resnet
from vit_jax.models.layers import IdentityLayer
from vit_jax.models.layers import KVPoolHead
from vit_jax.models.layers import MAPHead
from vit_jax.models.layers import make_norm
from vit_jax.models.posemb import check_image_size
from vit_jax.models.posemb import patch_size
# pylint: disable=unused-import
# What users and the other models reach through this module, as in the
# original's models_vit.
from vit_jax.models.attention import attention
from vit_jax.models.encoder import Encoder
from vit_jax.models.encoder import Encoder1DBlock
from vit_jax.models.encoder import REMAT_POLICIES
from vit_jax.models.layers import drop_path_rates
from vit_jax.models.layers import DropPath
from vit_jax.models.layers import MlpBlock
from vit_jax.models.posemb import AddPositionEmbs
from vit_jax.models.posemb import grid_positions
from vit_jax.models.posemb import Interp2DPosEmb
from vit_jax.models.posemb import posemb_sincos_2d
from vit_jax.models.posemb import POSEMBS
from vit_jax.models.posemb import rope2d_angles
from vit_jax.models.posemb import rope_head_dim
# pylint: enable=unused-import

CLASSIFIERS = ('token', 'gap', 'map', 'unpooled', 'token_unpooled',
               'distilled', 'token_gap', 'kv_pool', 'token_map')


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
  return int(classifier in ('token', 'token_unpooled', 'token_gap',
                            'token_map')) + registers


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


def pretrained_encoder_config(model_config, method: str) -> dict:
  """The ViT config of an encoder that `method` (MAE, DINO) pretrains;
  refuses what cannot be exported in the published layout of a pretrained
  encoder: a class token and no `pre_logits` layer."""
  config = dict(model_config)
  if config.get('classifier', 'token') != 'token':
    raise ValueError(f'A {method} encoder is exported with its class token: '
                     "set config.model.classifier='token', got "
                     f"{config['classifier']!r}.")
  if config.get('representation_size') is not None or config.get('resnet'):
    raise ValueError(f'A {method} encoder is a plain ViT: set '
                     'config.model.representation_size and resnet to None.')
  config.pop('num_classes', None)
  return config


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
      the mean of the two tokens) or 'token_gap' (a class token, but the
      mean of the patch tokens is pooled: timm's EVA-02 and DINOv3) or
      'kv_pool' (AIMv2's attention pooling in transformers, `KVPoolHead`)
      or 'token_map' (a class token, and the MAP head attends to it and
      the patches: Perception Encoder's).
    map_heads, map_mlp_dim: the MAP head's heads and MLP width (default:
      the blocks'; Perception Encoder's 8 and 4 D).
    posemb: position embedding scheme, one of POSEMBS; see `Encoder`.
    num_registers: learned register tokens `reg` (Darcet et al., 2024)
      after the class (and distillation) token; dropped before the head,
      so never pooled nor in the 'unpooled' outputs.
    posemb_prefix: the 'learn' table covers the prefix tokens too; False:
      the patches only (timm's `no_embed_class`, DeiT III).
    fc_norm: a LayerNorm `fc_norm` on the pooled feature instead of the
      encoder's final `encoder_norm` (timm's MAE fine-tuning with 'gap').
    head_bias_init: initial bias of the zero-initialized head.
    patch_bias: the patch embedding has a bias (not CLIP's).
    patch_norm: the patch embeddings go through a norm `embedding_norm`
      of the blocks' kind (`transformer.norm`) before the position
      embedding (AIMv2's RMSNorm).
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
  map_heads: Optional[int] = None
  map_mlp_dim: Optional[int] = None
  head_bias_init: float = 0.
  patch_bias: bool = True
  patch_norm: bool = False
  posemb_grid: Optional[Any] = None
  dtype: Any = jnp.float32
  model_name: Optional[str] = None

  def __call__(self, inputs, *, train, keep=None, patch_size=None,
               mask=None):
    """Logits (or features) of NHWC `inputs`; `keep` (batch, k) ints picks
    the patches (row-major) that the encoder sees, as `Encoder`'s;
    `patch_size` (int or pair) runs at that patch size (`flexi`); `mask`
    (batch, patches) bools replaces those patches' embeddings by a learned
    `mask_token` before the position embedding (iBOT, DINOv2)."""
    return self._forward(inputs, train, keep, patch_size, mask)

  def forward_intermediates(self, inputs, indices=None, *, norm=False,
                            output_fmt='NHWC', intermediates_only=False,
                            return_prefix_tokens=False, patch_size=None,
                            train=False):
    """The outputs of the blocks `indices` (`intermediates.take_indices`:
    an int n the last n, a sequence those blocks), as timm's method.

    Each is a patch map (batch, h, w, D) ('NHWC') or the patch tokens
    (batch, h*w, D) ('NLC'), the prefix (class, distillation, register)
    tokens dropped, or with `return_prefix_tokens` the pair (that, prefix
    tokens); `norm` puts each through the final norm (`encoder_norm`; none
    for a model with `fc_norm`). `intermediates_only=False` returns
    (final tokens, intermediates), after every block and the final norm;
    otherwise no block after the last asked for runs. `patch_size` as
    `__call__`'s (FlexiViT).
    """
    intermediates.check_output_fmt(output_fmt)
    take = intermediates.take_indices(self.transformer['num_layers'],
                                      indices)
    depth = max(take) + 1 if intermediates_only else None
    final, taken, grid = self._forward(inputs, train, None, patch_size, None,
                                       take=(take, depth, norm))
    prefix = num_prefix_tokens(self.classifier) + self.num_registers
    taken = [intermediates.split_tokens(y, grid, prefix, output_fmt,
                                        return_prefix_tokens) for y in taken]
    return taken if intermediates_only else (final, taken)

  @nn.compact
  def _forward(self, inputs, train, keep, patch_size, mask, take=None):
    """`__call__`, or with `take`, (block indices, blocks to run, norm
    them), (final tokens, those blocks' tokens, the patch grid)."""
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; '
                       f'expected one of {CLASSIFIERS}.')
    x, grid = self._embed(inputs, patch_size, mask)
    # `transformer.final_norm` False: no norm at all (InternViT's).
    transformer = dict(self.transformer)
    final_norm = transformer.pop('final_norm', True) and not self.fc_norm
    encoder = Encoder(name='Transformer', posemb=self.posemb,
                      posemb_prefix=self.posemb_prefix,
                      final_norm=final_norm,
                      posemb_grid=flexi.table_grid(self.posemb_grid, grid,
                                                   patch_size),
                      dtype=jnp.dtype(self.dtype), **transformer)
    if take is not None:
      indices, depth, norm = take
      final, taken = encoder(x, train=train, grid=grid, take=indices,
                             depth=depth, norm_taken=norm)
      return final, taken, grid
    x = encoder(x, train=train, grid=grid, keep=keep)
    return self._head(x, train)

  def _embed(self, inputs, new_patch=None, mask=None):
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
      x = flexi.PatchEmbed(self.hidden_size, stored, use_bias=self.patch_bias,
                           dtype=dtype, name='embedding')(x, (ph, pw))
    else:
      x = nn.Conv(self.hidden_size, kernel_size=(ph, pw), strides=(ph, pw),
                  padding='VALID', use_bias=self.patch_bias, name='embedding',
                  dtype=dtype)(x)
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    if self.patch_norm:
      x = make_norm(self.transformer.get('norm', 'layer'),
                    self.transformer.get('layer_norm_eps', 1e-6), dtype,
                    name='embedding_norm')(x)
    if mask is not None:  # zeros at init, as DINOv2's
      if mask.shape != x.shape[:2]:
        raise ValueError(f'mask must be (batch, patches) = {x.shape[:2]}, '
                         f'got {mask.shape}.')
      token = self.param('mask_token', nn.initializers.zeros, (1, 1, c))
      x = jnp.where(mask[..., None], token.astype(dtype), x)
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
    eps = self.transformer.get('layer_norm_eps', 1e-6)
    if self.num_registers:
      x = jnp.concatenate([x[:, :classes],
                           x[:, classes + self.num_registers:]], axis=1)
    if self.classifier == 'token':
      x = x[:, 0]
    elif distilled:
      x = x[:, :2]  # class and distillation tokens
    elif self.classifier in ('gap', 'token_gap'):
      x = jnp.mean(x[:, classes:], axis=1)
    elif self.classifier in ('map', 'token_map'):  # over every token
      x = MAPHead(num_heads=self.map_heads or self.transformer['num_heads'],
                  mlp_dim=self.map_mlp_dim or self.transformer['mlp_dim'],
                  gelu_approximate=self.transformer.get('gelu_approximate',
                                                        True),
                  layer_norm_eps=eps, dtype=dtype)(x)
    elif self.classifier == 'kv_pool':
      x = KVPoolHead(num_heads=self.transformer['num_heads'],
                     dtype=dtype)(x)
    if self.fc_norm:
      x = ops.LayerNorm(name='fc_norm', epsilon=eps, dtype=dtype)(x)

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
