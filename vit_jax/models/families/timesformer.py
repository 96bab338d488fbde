"""TimeSformer (Bertasius et al., ICML 2021): ViT-B/16 (or its widths) on
clips, divided space-time attention; the published weights' configs
(facebook/timesformer-base-finetuned-k400, -hr-finetuned-k400,
-large-finetuned-k400, as transformers' conversion script sets them):

- TimeSformer-B_16x8: 8 frames of 224 px.
- TimeSformer-HR: 16 frames of 448 px (a 28 x 28 grid).
- TimeSformer-L: 96 frames of 224 px.

Their weights take ImageNet's mean and std and exact (erf) GELU, as the
hub's (TimesformerVideoProcessor); the width, depth and heads of all three
are ViT-B's: 'L' is the long clip, not ViT-L. Parameters with a 400-class
head (`jax.eval_shape`), equal to transformers' TimesformerForVideo-
Classification of the same config (tests/data/timesformer_param_counts.
json): B_16x8 121_566_352, HR 122_024_080, L 121_633_936.
"""

import ml_collections

from vit_jax.models import registry
from vit_jax.models import timesformer

# name: (hidden_size, mlp_dim, num_heads, num_layers, patch, frames, side)
_TIMESFORMERS = {
    'TimeSformer-testing': (32, 64, 2, 2, 8, 4, 32),
    'TimeSformer-B_16x8': (768, 3072, 12, 12, 16, 8, 224),
    'TimeSformer-HR': (768, 3072, 12, 12, 16, 16, 448),
    'TimeSformer-L': (768, 3072, 12, 12, 16, 96, 224),
}
NATIVE_SIZES = {name: row[-1] for name, row in _TIMESFORMERS.items()}


def timesformer_config(name, hidden, mlp, heads, layers, patch, frames,
                       side):
  """A TimeSformer ConfigDict: divided space-time attention, no dropout,
  erf GELU (the published weights')."""
  del side  # the family's `native_sizes`
  return ml_collections.ConfigDict(dict(
      model_name=name, patches=dict(size=(patch, patch)), hidden_size=hidden,
      transformer=dict(num_layers=layers, mlp_dim=mlp, num_heads=heads,
                       dropout_rate=0., attention_dropout_rate=0.,
                       gelu_approximate=False),
      attention_type='divided_space_time', num_frames=frames,
      representation_size=None, classifier='token'))


registry.register(registry.Family(
    'TimeSformer', timesformer.TimeSformer,
    [timesformer_config(name, *row) for name, row in _TIMESFORMERS.items()],
    weights='timm', native_sizes=NATIVE_SIZES))
