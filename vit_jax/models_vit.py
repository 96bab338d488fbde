"""Vision Transformer (Dosovitskiy et al., ICLR 2021), in Flax Linen.

The module structure, and so the parameter tree, follows the original
release exactly: published checkpoints load with no renaming.
"""

from typing import Any, Callable, Optional, Tuple

import flax.linen as nn
import jax.numpy as jnp

Array = Any


class IdentityLayer(nn.Module):
  """Identity layer, so that an absent `pre_logits` keeps its name."""

  @nn.compact
  def __call__(self, x):
    return x


class AddPositionEmbs(nn.Module):
  """Adds a learned 1-D position embedding to the token sequence.

  Attributes:
    posemb_init: initializer of the (1, tokens, width) table.
  """
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs):
    if inputs.ndim != 3:
      raise ValueError(f'Expected (batch, tokens, width), got {inputs.shape}.')
    shape = (1, inputs.shape[1], inputs.shape[2])
    if self.has_variable('params', 'pos_embedding'):
      have = self.get_variable('params', 'pos_embedding').shape
      if have != shape:
        raise ValueError(
            f'The position embedding has shape {have} but the input needs '
            f'{shape}: resize it for the new resolution with '
            '`checkpoint.interpolate_posembed` (`load_pretrained` does).')
    pe = self.param('pos_embedding', self.posemb_init, shape)
    return inputs + pe


class MlpBlock(nn.Module):
  """Transformer MLP: Dense, GELU, dropout, Dense, dropout.

  Attributes:
    mlp_dim: hidden width.
    out_dim: output width (default: the input width).
    dropout_rate: dropout after each Dense.
  """
  mlp_dim: int
  out_dim: Optional[int] = None
  dropout_rate: float = 0.1
  kernel_init: Callable = nn.initializers.xavier_uniform()
  bias_init: Callable = nn.initializers.normal(stddev=1e-6)

  @nn.compact
  def __call__(self, inputs, *, deterministic):
    out_dim = inputs.shape[-1] if self.out_dim is None else self.out_dim
    x = nn.Dense(self.mlp_dim, kernel_init=self.kernel_init,
                 bias_init=self.bias_init)(inputs)
    x = nn.gelu(x)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = nn.Dense(out_dim, kernel_init=self.kernel_init,
                 bias_init=self.bias_init)(x)
    return nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LN Transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Attributes:
    mlp_dim: MLP hidden width.
    num_heads: attention heads.
    dropout_rate: dropout after attention and in the MLP.
    attention_dropout_rate: dropout on the attention weights.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1

  @nn.compact
  def __call__(self, inputs, *, deterministic):
    x = nn.LayerNorm()(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads,
        kernel_init=nn.initializers.xavier_uniform(),
        broadcast_dropout=False,
        deterministic=deterministic,
        dropout_rate=self.attention_dropout_rate)(x, x)
    x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=deterministic)
    x = x + inputs

    y = nn.LayerNorm()(x)
    y = MlpBlock(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate)(
        y, deterministic=deterministic)
    return x + y


class Encoder(nn.Module):
  """Position embedding, `num_layers` encoder blocks, final LayerNorm.

  Attributes:
    num_layers: number of blocks.
    mlp_dim: MLP hidden width.
    num_heads: attention heads.
    dropout_rate: dropout rate.
    attention_dropout_rate: dropout on the attention weights.
    add_position_embedding: add the learned 1-D position embedding.
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.1
  attention_dropout_rate: float = 0.1
  add_position_embedding: bool = True

  @nn.compact
  def __call__(self, x, *, train):
    if self.add_position_embedding:
      x = AddPositionEmbs(name='posembed_input')(x)
      x = nn.Dropout(rate=self.dropout_rate)(x, deterministic=not train)
    for i in range(self.num_layers):
      x = Encoder1DBlock(
          mlp_dim=self.mlp_dim,
          num_heads=self.num_heads,
          dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate,
          name=f'encoderblock_{i}')(x, deterministic=not train)
    return nn.LayerNorm(name='encoder_norm')(x)


CLASSIFIERS = ('token', 'gap', 'unpooled', 'token_unpooled')


class VisionTransformer(nn.Module):
  """Vision Transformer.

  Attributes:
    num_classes: head size; 0 or None for no head.
    patches: ConfigDict with `size`, the (height, width) of a patch.
    transformer: ConfigDict of `Encoder` attributes.
    hidden_size: token width D.
    representation_size: width of the tanh `pre_logits` layer, if any.
    classifier: 'token' (class token), 'gap' (mean of tokens), 'unpooled'
      (all tokens, no class token) or 'token_unpooled' (all tokens).
    head_bias_init: initial bias of the zero-initialized head.
    model_name: preset name, for reference only.
  """
  num_classes: Optional[int]
  patches: Any
  transformer: Any
  hidden_size: int
  representation_size: Optional[int] = None
  classifier: str = 'token'
  head_bias_init: float = 0.
  model_name: Optional[str] = None

  @nn.compact
  def __call__(self, inputs, *, train):
    if self.classifier not in CLASSIFIERS:
      raise ValueError(f'Unknown classifier {self.classifier!r}; '
                       f'expected one of {CLASSIFIERS}.')
    ph, pw = patch_size(self.patches)
    check_image_size(inputs.shape, (ph, pw))

    x = nn.Conv(self.hidden_size, kernel_size=(ph, pw), strides=(ph, pw),
                padding='VALID', name='embedding')(inputs)
    n, h, w, c = x.shape
    x = jnp.reshape(x, (n, h * w, c))
    if self.classifier in ('token', 'token_unpooled'):
      cls = self.param('cls', nn.initializers.zeros, (1, 1, c))
      x = jnp.concatenate([jnp.tile(cls, (n, 1, 1)), x], axis=1)
    x = Encoder(name='Transformer', **self.transformer)(x, train=train)

    if self.classifier == 'token':
      x = x[:, 0]
    elif self.classifier == 'gap':
      x = jnp.mean(x, axis=1)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, name='pre_logits')(x))
    else:
      x = IdentityLayer(name='pre_logits')(x)

    if self.num_classes:
      x = nn.Dense(self.num_classes, name='head',
                   kernel_init=nn.initializers.zeros,
                   bias_init=nn.initializers.constant(self.head_bias_init))(x)
    return x


def patch_size(patches) -> Tuple[int, int]:
  size = patches['size'] if 'size' in patches else patches.size
  ph, pw = (size, size) if isinstance(size, int) else tuple(size)
  return int(ph), int(pw)


def check_image_size(shape, patch: Tuple[int, int]):
  """Raises a ValueError unless `shape` is NHWC with sides divisible by `patch`."""
  if len(shape) != 4:
    raise ValueError(f'Expected NHWC images, got shape {tuple(shape)}.')
  _, h, w, _ = shape
  if h % patch[0] or w % patch[1] or h < patch[0] or w < patch[1]:
    raise ValueError(
        f'Image size {h}x{w} is not a multiple of the patch size '
        f'{patch[0]}x{patch[1]}.')
