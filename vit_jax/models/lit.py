"""LiT: Locked-image text Tuning (Zhai et al., CVPR 2022), in Flax Linen.

An image tower (a vit_jax VisionTransformer, `img`) and a text tower (`txt`)
embed into one space; both embeddings are L2-normalized and compared by dot
products times a learned temperature exp(`t`) (plus, for SigLIP's sigmoid
loss, a learned bias `b`). The parameter tree is the original release's, so
its published `.npz` files load with `checkpoints.loading.load_params`
(the original's `load_variables` and pipelines: `vit_jax/original/lit.py`):

  img/...        the ViT; its `head` (if any) projects to the shared space
  txt/...        `BertModel` (`BertEncoder_0`, `head`) or `TextTransformer`
                 (`Embed_0`, `pos_embedding`, `Encoder_0`, `head`)
  t              log temperature, (1,)
"""

from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax.models import bert as models_bert
from vit_jax.models import vit as models_vit

# Where the published LiT files are (the original's `load_variables`).
BASE_PATH = 'gs://vit_models/lit'
# Which token's output a `TextTransformer` returns.
POOLS = ('last', 'argmax', 'eos')



class BertModel(nn.Module):
  """BERT encoder; the CLS token's output, projected by `head`.

  Attributes:
    num_classes: width of the `head` projection; None for no head.
    config: a key of `models_bert.BERT_CONFIGS`.
    dropout_rate: dropout in training (the published models use none).
  """
  num_classes: Optional[int] = None
  config: str = 'base'
  dropout_rate: float = 0.

  @nn.compact
  def __call__(self, tokens, *, train=False):
    out = {}
    x = out['transformed'] = models_bert.BertEncoder(
        self.config, self.dropout_rate, name='BertEncoder_0')(
            tokens, train=train)
    x = out['pre_logits'] = x[:, 0]  # the CLS token
    if self.num_classes:
      x = out['logits'] = nn.Dense(self.num_classes, name='head')(x)
    return x, out


class TextTransformer(nn.Module):
  """Pre-LN transformer on token embeddings plus learned positions.

  Its output is one token's: by default the *last*, which the SentencePiece
  tokenizer keeps an end-of-sequence token (`tokenizers.
  SentencepieceTokenizer`); CLIP's towers read their end token wherever it
  is (`pool`).

  Attributes:
    num_classes: width of the `head` projection; None for no head.
    layer_norm_eps, gelu_approximate, quick_gelu: see `models_vit.Encoder`
      (CLIP's: 1e-5 and QuickGELU).
    causal: each token attends to itself and those before it only (CLIP).
    pool: which token's output: 'last'; 'argmax', the position of the
      largest token id (the end token of CLIP's vocabulary: transformers'
      legacy pooling); 'eos', the first position of `eos_token`.
    eos_token: the end token's id, for pool='eos'.
    norm, swiglu, qkv_bias, out_bias, mlp_bias: see `models_vit.Encoder`
      (AIMv2's: RMSNorm, SwiGLU, no biases).
  """
  num_classes: Optional[int] = None
  width: int = 512
  num_layers: int = 12
  mlp_dim: int = 2048
  num_heads: int = 8
  dropout_rate: float = 0.
  vocab_size: int = 32_000
  layer_norm_eps: float = 1e-6
  gelu_approximate: bool = True
  quick_gelu: bool = False
  causal: bool = False
  pool: str = 'last'
  eos_token: Optional[int] = None
  norm: str = 'layer'
  swiglu: bool = False
  qkv_bias: str = 'qkv'
  out_bias: bool = True
  mlp_bias: bool = True

  @nn.compact
  def __call__(self, tokens, *, train=False):
    if self.pool not in POOLS or (self.pool == 'eos') != (
        self.eos_token is not None):
      raise ValueError(f'pool={self.pool!r}, eos_token={self.eos_token}: '
                       f'expected one of {POOLS}, with an eos_token for (and '
                       "only for) 'eos'.")
    out = {}
    x = out['embedded'] = nn.Embed(self.vocab_size, self.width)(tokens)
    _, length, d = x.shape
    x = x + self.param('pos_embedding',
                       nn.initializers.normal(stddev=1 / np.sqrt(d)),
                       (1, length, d), x.dtype)
    x = models_vit.Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim,
        num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=0., add_position_embedding=False,
        layer_norm_eps=self.layer_norm_eps,
        gelu_approximate=self.gelu_approximate, quick_gelu=self.quick_gelu,
        norm=self.norm, swiglu=self.swiglu, qkv_bias=self.qkv_bias,
        out_bias=self.out_bias, mlp_bias=self.mlp_bias)(
            x, train=train,
            mask=nn.make_causal_mask(tokens) if self.causal else None)
    x = out['pre_logits'] = self._pool(x, tokens)
    if self.num_classes:
      x = out['logits'] = nn.Dense(self.num_classes, name='head')(x)
    return x, out

  def _pool(self, x, tokens):
    """The output (batch, D) of the token that `pool` names."""
    if self.pool == 'last':
      return x[:, -1]
    if self.pool == 'argmax':
      index = jnp.argmax(tokens, axis=-1)
    else:  # argmax of booleans: the first True (0 if none, as transformers)
      index = jnp.argmax(tokens == self.eos_token, axis=-1)
    return jnp.take_along_axis(x, index[:, None, None], axis=1)[:, 0]


TEXT_MODELS = {'bert': BertModel, 'text_transformer': TextTransformer}


def _normalized(z):
  """(z / |z|, |z|), as the original (with its 1e-8)."""
  norm = jnp.linalg.norm(z, axis=1, keepdims=True)
  return z / (norm + 1e-8), norm


class LitModel(nn.Module):
  """Two towers and a learned temperature (and bias, for the sigmoid loss).

  Attributes:
    image: VisionTransformer attributes (e.g. a preset's config) of the
      image tower; `num_classes` comes from `out_dim`.
    text_model: 'bert' or 'text_transformer'.
    text: attributes of the text tower.
    out_dim: (image, text) projection widths (an int: both); None for no
      projection (then the tower's own width is the shared one).
    pp: tokenizer_name (one of `tokenizers.TOKENIZERS`), max_len and image
      size of the preset, for `tokenizers.get_tokenizer`.
    temperature_init: initial exp(t).
    bias_init: initial `b`; None for no bias (the softmax loss).
  """
  image: Any
  text_model: str
  text: Any
  out_dim: Any = (None, None)
  pp: Any = None
  temperature_init: float = 1.
  bias_init: Optional[float] = None
  model_name: Optional[str] = None

  def __post_init__(self):
    # `pp.max_len` as in the original, whose pp is a ConfigDict; `pp[...]`
    # works too. Frozen: a module's attributes are hashable.
    if self.pp is not None and not isinstance(
        self.pp, ml_collections.FrozenConfigDict):
      object.__setattr__(self, 'pp', ml_collections.FrozenConfigDict(self.pp))
    super().__post_init__()

  def image_encoder(self, params):
    """(the image tower, its parameters of `params`): what
    `forward_intermediates` and feature extraction run."""
    return models_vit.VisionTransformer(
        **{**self.image, 'num_classes': self._dims()[0]},
        parent=None), params['img']

  def _dims(self):
    """The (image, text) projection widths."""
    return ((self.out_dim,) * 2 if isinstance(self.out_dim, int)
            else self.out_dim)

  @nn.compact
  def __call__(self, *, images=None, tokens=None, train=False,
               train_image=False):
    """Returns (zimg, ztxt, out): normalized embeddings (None for an absent
    input) and a dict with `t` (the temperature exp(t)), `b` if any, and
    intermediate values. The image tower runs in training mode only with
    `train_image` (LiT's is locked)."""
    if self.text_model not in TEXT_MODELS:
      raise ValueError(f'Unknown text_model {self.text_model!r}; expected one '
                       f'of {tuple(TEXT_MODELS)}.')
    img_dim, txt_dim = self._dims()
    zimg = ztxt = None
    out = {}
    if tokens is not None:
      if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError('tokens must be (batch, max_len) integers, got '
                         f'{tokens.dtype} {tokens.shape}.')
      tower = TEXT_MODELS[self.text_model](
          **{'num_classes': txt_dim, **(self.text or {})}, name='txt')
      ztxt, txt_out = tower(tokens, train=train)
      out.update({f'txt/{k}': v for k, v in txt_out.items()})
      ztxt, out['txt/norm'] = _normalized(ztxt)
      out['txt/normalized'] = ztxt
    if images is not None:
      tower = models_vit.VisionTransformer(
          **{**self.image, 'num_classes': img_dim}, name='img')
      zimg, out['img/norm'] = _normalized(tower(images, train=train_image))
      out['img/normalized'] = zimg
    t = self.param('t', nn.initializers.constant(np.log(self.temperature_init)),
                   (1,), jnp.float32)
    out['t'] = jnp.exp(t)
    if self.bias_init is not None:
      out['b'] = self.param('b', nn.initializers.constant(self.bias_init),
                            (1,), jnp.float32)
    return zimg, ztxt, out
