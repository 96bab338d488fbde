"""SigLIP 2 (Tschannen et al., 2025): SigLIP's towers, Gemma's tokenizer.

The image towers are SigLIP's (no class token, the MAP head `MAPHead_0`,
tanh GELU, Google's [-1, 1] inputs). big_vision's README_siglip2.md: the
fixed-size checkpoints are its `vit.py` and `two_towers.py` of SigLIP, "the
only difference is the vocab size (256k) and the tokenizer (Gemma)"; its
demo colab reads text of 64 tokens.

One preset per architecture: the published 224/256/384/512 px files of one
size differ only in their tables' grid, which the image size sets at init
(`image_size=` of `from_pretrained`, the record, or the table itself), as
for SigLIP's presets.

'-naflex': the NaFlex towers (B/16, So400m/16): a 16 x 16 table, resized
bilinearly to each image's grid of patches (`posemb_grid`), so one
checkpoint runs at any (H, W); timm's `naflexvit_*_siglip` files convert to
them (`convert.naflex`).

Shapes, from big_vision's `models/vit.py` `decode_variant`: B 768 wide, 12
layers, 12 heads, MLP 3072; L 1024, 24, 16, 4096; So400m 1152, 27, 16,
4304; g-opt 1536, 40, 16, 6144 (also timm's `vit_giantopt_patch16_siglip_256`:
embed_dim 1536, depth 40, num_heads 16, mlp_ratio 4). The text towers are
as wide as the image towers, but g-opt's: the demo colab
(SigLIP2_demo.ipynb) says "the g-opt vision encoder is paired with a
So400m text encoder", projected to EMBDIM 1536 (`out_dim=[None, EMBDIM]`).
"""

from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.families import lit as lit_families
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch)
_SIGLIP2S = {
    'SigLIP2-testing': (32, 64, 2, 2, 16),
    'SigLIP2-B_32': (768, 3072, 12, 12, 32),
    'SigLIP2-B_16': (768, 3072, 12, 12, 16),
    'SigLIP2-L_16': (1024, 4096, 16, 24, 16),
    'SigLIP2-So400m_14': (1152, 4304, 16, 27, 14),
    'SigLIP2-So400m_16': (1152, 4304, 16, 27, 16),
    'SigLIP2-g_16': (1536, 6144, 16, 40, 16),
}
# The text tower where it is not the image tower's size (g-opt's So400m).
_TEXT = {'SigLIP2-g_16': _SIGLIP2S['SigLIP2-So400m_16'][:4]}
# The smallest published side, where it is not 224.
_NATIVE = {'SigLIP2-B_32': 256, 'SigLIP2-L_16': 256,
           'SigLIP2-So400m_16': 256, 'SigLIP2-g_16': 256}
_NAFLEX = ('SigLIP2-testing', 'SigLIP2-B_16', 'SigLIP2-So400m_16')
# NaFlex's table: 16 x 16 (big_vision's `nposemb=16`, timm's pos_embed_grid_size).
NAFLEX_GRID = (16, 16)
VOCAB_SIZE = 256_000  # Gemma's tokenizer
MAX_LEN = 64


def _image(name, row):
  return vit_families.vit_config(name, *row, 0.0, 'map')


def _naflex(name, row):
  config = _image(f'{name}-naflex', row)
  config.posemb_grid = NAFLEX_GRID
  return config


def _towers(image):
  """'NAME-towers': both towers (transformers' Siglip2Model): a text
  transformer read at its last token, Gemma's vocabulary."""
  name = image.model_name
  base = name.removesuffix('-naflex')
  hidden, mlp, heads, layers = _TEXT.get(base, _SIGLIP2S[base][:4])
  text = dict(width=hidden, num_heads=heads, num_layers=layers, mlp_dim=mlp,
              vocab_size=VOCAB_SIZE, layer_norm_eps=1e-6,
              gelu_approximate=True, quick_gelu=False, causal=False,
              pool='last')
  return lit_families.two_towers(
      f'{name}-towers', image, text, (None, image.hidden_size), 'gemma',
      MAX_LEN, temperature_init=10.0, bias_init=-10.0,
      size=_NATIVE.get(base, 224))


_FIXED = [_image(name, row) for name, row in _SIGLIP2S.items()]
_FLEX = [_naflex(name, _SIGLIP2S[name]) for name in _NAFLEX]

registry.register(vit_families.vit_family(
    'SigLIP 2', _FIXED, native_sizes=dict(_NATIVE)))
registry.register(vit_families.vit_family(
    'SigLIP 2 NaFlex', _FLEX, native=None, timm_layout='naflex',
    timm_architecture=r'naflexvit_\w+_siglip'))
registry.register(registry.Family(
    'SigLIP 2 towers', lit.LitModel, [_towers(c) for c in _FIXED + _FLEX],
    native=None))
