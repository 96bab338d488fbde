"""LiT (Zhai et al., 2022): a locked ViT and a text tower; BERT towers read
the BERT tokenizer's ids, text transformers SentencePiece's."""

import ml_collections

from vit_jax.models import lit
from vit_jax.models import registry
from vit_jax.models.families import vit as vit_families

_TEXT_S = dict(width=384, num_layers=12, mlp_dim=1536, num_heads=6,
               vocab_size=16_000)
_TEXT_TI = dict(width=192, num_layers=12, mlp_dim=768, num_heads=3,
                vocab_size=16_000)
# name: (image preset, out_dim (image, text), text_model, text)
_LITS = {
    'LiT-B16B': ('ViT-B_16', (768, 768), 'bert', {'config': 'base'}),
    # Trained twice as long, without the image projection.
    'LiT-B16B_2': ('ViT-B_16', (None, 768), 'bert', {'config': 'base'}),
    'LiT-L16L': ('ViT-L_16', (None, 1024), 'bert', {'config': 'large'}),
    'LiT-L16S': ('ViT-L_16', (None, 1024), 'text_transformer', _TEXT_S),
    'LiT-L16Ti': ('ViT-L_16', (None, 1024), 'text_transformer', _TEXT_TI),
}


def _lit(name, image, out_dim, text_model, text):
  """A LiT ConfigDict with the original's fields, plus the loss's inits."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'image': vit_families.vit_config(image, *vit_families.VITS[image]),
      'out_dim': out_dim,
      'text_model': text_model,
      'text': dict(text),
      'pp': {'tokenizer_name': 'bert' if text_model == 'bert' else
                               'sentencepiece', 'size': 224, 'max_len': 16},
      # The published models store log(t); these only set a fresh model's.
      'temperature_init': 1.0,
      'bias_init': None,  # a float adds SigLIP's learned bias `b`
  })


registry.register(registry.Family(
    'LiT', lit.LitModel, [_lit(name, *row) for name, row in _LITS.items()],
    native=None))


def two_towers(name, image, text, out_dim, tokenizer, max_len, *,
               temperature_init=1.0, bias_init=None, size=224):
  """A two-tower preset (CLIP's, SigLIP's) of the image preset config
  `image` and the TextTransformer fields `text`."""
  image = image.to_dict()
  image.pop('model_name')
  return ml_collections.ConfigDict({
      'model_name': name,
      'image': image,
      'out_dim': out_dim,
      'text_model': 'text_transformer',
      'text': dict(text),
      'pp': {'tokenizer_name': tokenizer, 'size': size, 'max_len': max_len},
      'temperature_init': temperature_init,
      'bias_init': bias_init,
  })
