"""BERT encoder (Devlin et al., 2019), with the LiT release's parameter tree.

The published LiT checkpoints were written with flaxformer's `BertEncoder`;
the modules here carry its names, so those files load without renaming:

  embedder/embedders_{token,position,segment}_ids/embedding
  layer_norm/{scale,bias}
  encoder_block/layer_sequence/layers_{i}/
    attention_block/attention_layer/{query,key,value}/{kernel,bias}
    attention_block/dense_layer/{kernel,bias}, attention_block/layer_norm/
    mlp_block/mlp/dense_layer/, mlp_block/dense_layer/, mlp_block/layer_norm/

Kernels are 2-D (in, out), as flaxformer stores them. Blocks are post-LN:
x = LN(x + Attention(x)), then x = LN(x + MLP(x)).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# name: (hidden_size, intermediate_dim, num_layers, num_heads, vocab_size,
#        max_length); 2 segments each.
BERT_CONFIGS = {
    'base': (768, 3072, 12, 12, 30_522, 512),
    'large': (1024, 4096, 24, 16, 30_522, 512),
    'testing': (16, 32, 2, 2, 64, 16),
}
_EPS = 1e-12  # BERT's LayerNorm epsilon
_INIT = nn.initializers.truncated_normal(stddev=0.02)


def _dense(features, name):
  return nn.Dense(features, kernel_init=_INIT, name=name)


class Embedder(nn.Module):
  """Sum of token, position and segment embeddings."""
  hidden_size: int
  vocab_size: int
  max_length: int
  num_segments: int = 2

  @nn.compact
  def __call__(self, token_ids, position_ids, segment_ids):
    tables = (('token_ids', self.vocab_size, token_ids),
              ('position_ids', self.max_length, position_ids),
              ('segment_ids', self.num_segments, segment_ids))
    return sum(nn.Embed(size, self.hidden_size, embedding_init=_INIT,
                        name=f'embedders_{key}')(ids)
               for key, size, ids in tables)


class AttentionLayer(nn.Module):
  """The query, key and value projections, (batch, tokens, heads, depth)."""
  num_heads: int

  @nn.compact
  def __call__(self, x):
    n, length, d = x.shape
    return tuple(_dense(d, name)(x).reshape(n, length, self.num_heads, -1)
                 for name in ('query', 'key', 'value'))


class AttentionBlock(nn.Module):
  """Self-attention among unmasked tokens, then residual and LayerNorm."""
  num_heads: int
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, x, mask, *, deterministic):
    q, k, v = AttentionLayer(self.num_heads, name='attention_layer')(x)
    logits = jnp.einsum('bqhd,bkhd->bhqk', q / np.sqrt(q.shape[-1]), k)
    logits = jnp.where(mask[:, None], logits, jnp.finfo(logits.dtype).min)
    y = jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(logits), v)
    y = _dense(x.shape[-1], 'dense_layer')(y.reshape(x.shape))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return nn.LayerNorm(epsilon=_EPS, name='layer_norm')(x + y)


class Mlp(nn.Module):
  """Dense to `intermediate_dim`, GELU."""
  intermediate_dim: int

  @nn.compact
  def __call__(self, x):
    return nn.gelu(_dense(self.intermediate_dim, 'dense_layer')(x))


class MlpBlock(nn.Module):
  """MLP, projection back, dropout, residual, LayerNorm."""
  intermediate_dim: int
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, x, *, deterministic):
    y = Mlp(self.intermediate_dim, name='mlp')(x)
    y = _dense(x.shape[-1], 'dense_layer')(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return nn.LayerNorm(epsilon=_EPS, name='layer_norm')(x + y)


class EncoderLayer(nn.Module):
  """One post-LN block: `attention_block`, then `mlp_block`."""
  num_heads: int
  intermediate_dim: int
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, x, mask, *, deterministic):
    x = AttentionBlock(self.num_heads, self.dropout_rate,
                       name='attention_block')(
                           x, mask, deterministic=deterministic)
    return MlpBlock(self.intermediate_dim, self.dropout_rate,
                    name='mlp_block')(x, deterministic=deterministic)


class LayerSequence(nn.Module):
  """`num_layers` blocks, `layers_{i}`."""
  num_layers: int
  num_heads: int
  intermediate_dim: int
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, x, mask, *, deterministic):
    for i in range(self.num_layers):
      x = EncoderLayer(self.num_heads, self.intermediate_dim,
                       self.dropout_rate, name=f'layers_{i}')(
                           x, mask, deterministic=deterministic)
    return x


class EncoderBlock(nn.Module):
  """Holds the `layer_sequence`, as flaxformer's EncoderBlock."""
  layer_sequence: LayerSequence

  def __call__(self, x, mask, *, deterministic):
    return self.layer_sequence(x, mask, deterministic=deterministic)


class BertEncoder(nn.Module):
  """Embeddings, LayerNorm, post-LN blocks: (batch, tokens, hidden_size).

  Attributes:
    config: a key of BERT_CONFIGS ('base', 'large', 'testing').
    dropout_rate: dropout on embeddings and block outputs, in training.
  """
  config: str = 'base'
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, token_ids, *, train=False, segment_ids=None):
    """Token id 0 is padding: masked as a key (and query) in attention."""
    if self.config not in BERT_CONFIGS:
      raise ValueError(f'Unknown BERT config {self.config!r}; expected one '
                       f'of {tuple(BERT_CONFIGS)}.')
    hidden, inner, layers, heads, vocab, max_length = BERT_CONFIGS[self.config]
    n, length = token_ids.shape
    if length > max_length:
      raise ValueError(f'{length} tokens exceed BERT-{self.config}\'s '
                       f'{max_length} positions.')
    positions = jnp.broadcast_to(jnp.arange(length), (n, length))
    if segment_ids is None:
      segment_ids = jnp.zeros_like(token_ids)
    x = Embedder(hidden, vocab, max_length, name='embedder')(
        token_ids, positions, segment_ids)
    x = nn.LayerNorm(epsilon=_EPS, name='layer_norm')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    valid = token_ids != 0
    mask = valid[:, :, None] & valid[:, None, :]
    # Unbound (parent=None): EncoderBlock adopts it as its `layer_sequence`.
    blocks = LayerSequence(layers, heads, inner, self.dropout_rate, parent=None)
    return EncoderBlock(blocks, name='encoder_block')(
        x, mask, deterministic=not train)
