"""ViViT (Arnab et al., ICCV 2021): video ViTs on tubelets of 2 frames of
16x16 px, at ViT-B's widths; Scenic's Kinetics configs
(projects/vivit/configs/kinetics400): the unfactorised model 1
(`vivit_base_k400`, 'token') and the factorised encoder, model 2, with a
4-block temporal encoder (`vivit_base_factorised_encoder`). Their weights
start from an image ViT's (`vit_jax.checkpoints.inflate`), so they take
its inputs ([-1, 1]).

Parameters for Kinetics-400 (400 classes) on 32 frames of 224 px
(`jax.eval_shape`): ViViT-B_16x2 88_954_000 (its joint table alone
(1 + 16·196) x 768 = 2_409_216), ViViT-B_16x2-FE 115_062_928 (the
embedding and spatial encoder as ViT-B/16's, the temporal encoder of 4
blocks and a 17-entry table 28_366_080). Scenic's model.py builds the same
tensors but for the head's name (`output_projection`); neither its code nor
its configs state a count, so these are computed, not compared.
"""

from vit_jax.models import registry
from vit_jax.models import vivit
from vit_jax.models.families import vit as vit_families

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, tubelet,
#        temporal layers (None: unfactorised))
_VIVITS = {
    'ViViT-testing': (32, 64, 2, 2, 4, 2, None),
    'ViViT-testing-FE': (32, 64, 2, 2, 4, 2, 1),
    'ViViT-B_16x2': (768, 3072, 12, 12, 16, 2, None),
    'ViViT-B_16x2-FE': (768, 3072, 12, 12, 16, 2, 4),
}


def vivit_config(name, hidden, mlp, heads, layers, patch, tubelet,
                 temporal_layers):
  """A ViViT ConfigDict: a ViT's fields (no dropout, as Scenic's Kinetics
  configs) and the video's."""
  config = vit_families.vit_config(name, hidden, mlp, heads, layers, patch,
                                   0.0, 'token')
  for field in ('posemb', 'num_registers', 'posemb_prefix', 'fc_norm'):
    del config[field]  # image-only options: vivit.ViViT takes none
  config.tubelet = tubelet
  if temporal_layers is None:
    config.encoder, config.temporal_posemb = 'unfactorised', 'joint'
  else:
    config.encoder, config.temporal_posemb = 'factorised', 'separate'
    config.temporal_transformer = config.transformer.to_dict()
    config.temporal_transformer.num_layers = temporal_layers
  return config


registry.register(registry.Family(
    'ViViT', vivit.ViViT,
    [vivit_config(name, *row) for name, row in _VIVITS.items()]))
