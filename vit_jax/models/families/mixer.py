"""MLP-Mixer (Tolstikhin et al., 2021), with the original's fields; timm's
mixer_* weights convert. Its token-mixing MLPs fix its token count."""

import ml_collections

from vit_jax.models import mixer
from vit_jax.models import registry

# name: (hidden_dim, num_blocks, tokens_mlp_dim, channels_mlp_dim, patch)
_MIXERS = {
    'Mixer-testing': (16, 2, 8, 32, 16),
    'Mixer-B_16': (768, 12, 384, 3072, 16),
    'Mixer-B_32': (768, 12, 384, 3072, 32),
    'Mixer-L_16': (1024, 24, 512, 4096, 16),
}


def _mixer(name, hidden, blocks, tokens_mlp, channels_mlp, patch):
  """An MLP-Mixer ConfigDict with the original's fields."""
  return ml_collections.ConfigDict({
      'model_name': name,
      'patches': {'size': (patch, patch)},
      'hidden_dim': hidden,
      'num_blocks': blocks,
      'tokens_mlp_dim': tokens_mlp,
      'channels_mlp_dim': channels_mlp,
      'dtype': 'float32',
  })


registry.register(registry.Family(
    'Mixer', mixer.MlpMixer,
    [_mixer(name, *row) for name, row in _MIXERS.items()], native=None,
    timm_layout='mixer'))
