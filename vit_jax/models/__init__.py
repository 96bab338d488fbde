"""The models: `get_model(name, **kw)`, the presets and the classes.

One module per architecture (`vit`, with `encoder`, `posemb`, `attention`
and `layers`; `resnet`, `mixer`, `swin`, `navit`, `mae`, `dino`, `flexi`,
`lit`, `bert`), one per family of presets (`families/`, registered in
`registry`), the CPU backward passes (`ops`). Run
`python -m vit_jax.models --name=ViT-B_16` to print a preset's parameter
count and output shape. `from_pretrained(src)` gives the model, parameters
and eval transform of any checkpoint (`vit_jax.pretrained`).
"""

import importlib

# pylint: disable=unused-import
from vit_jax.models import families  # registers every family
from vit_jax.models.lit import LitModel
from vit_jax.models.mixer import MlpMixer
from vit_jax.models.registry import MODEL_CONFIGS
from vit_jax.models.registry import count_params
from vit_jax.models.registry import get_model
from vit_jax.models.registry import model_class
from vit_jax.models.resnet import ResNetV2
from vit_jax.models.swin import SwinTransformer
from vit_jax.models.vit import VisionTransformer
# The original's building blocks, by its names.
from vit_jax.models.vit import AddPositionEmbs
from vit_jax.models.vit import Encoder
from vit_jax.models.vit import Encoder1DBlock
from vit_jax.models.vit import MlpBlock
from vit_jax.models import registry

# The original's `models.model_configs` (its `configs/models.py`): the
# presets, `model_configs.MODEL_CONFIGS`.
model_configs = registry

# From any checkpoint to a model: `vit_jax.pretrained`'s, an entry point (it
# reads and converts files, which the models never do), so it is fetched
# when first asked for rather than imported up the floors from here.
_FROM_PRETRAINED = ('from_pretrained', 'Pretrained')


def __getattr__(name):
  if name in _FROM_PRETRAINED:
    return getattr(importlib.import_module('vit_jax.pretrained'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted([*globals(), *_FROM_PRETRAINED])
