"""Model registry: `get_model(name, **kw)` and the model classes.

One module per family (`vit`, with `posemb`, `attention` and `layers`;
`resnet`, `mixer`, `swin`, `navit`, `mae`, `lit`, `bert`), the presets and
families (`presets`), the CPU backward passes (`ops`). Run
`python -m vit_jax.models --name=ViT-B_16` to print a preset's parameter
count and output shape.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import lit as models_lit
from vit_jax.models import mixer as models_mixer
from vit_jax.models import posemb
from vit_jax.models import presets as model_configs
from vit_jax.models import resnet as models_resnet
from vit_jax.models import swin as models_swin
from vit_jax.models import vit as models_vit
from vit_jax.models.presets import MODEL_CONFIGS

VisionTransformer = models_vit.VisionTransformer
# The original's building blocks, by its names.
AddPositionEmbs = models_vit.AddPositionEmbs
MlpBlock = models_vit.MlpBlock
Encoder1DBlock = models_vit.Encoder1DBlock
Encoder = models_vit.Encoder
MlpMixer = models_mixer.MlpMixer
LitModel = models_lit.LitModel
ResNetV2 = models_resnet.ResNetV2
SwinTransformer = models_swin.SwinTransformer
CLASSES = {cls.__name__: cls for cls in (VisionTransformer, MlpMixer,
                                         LitModel, ResNetV2, SwinTransformer)}


def get_model(name: str, **kw) -> nn.Module:
  """Returns the model for preset `name`; `kw` overrides its config. The
  class is its family's (`model_configs.FAMILIES`)."""
  config = dict(MODEL_CONFIGS[name].to_dict(), **kw)
  return model_class(name)(**config)


def token_grid(config):
  """The patch grid of `config`'s ViT at `pp.crop`; None for other models
  (a Mixer's token count is fixed, a ResNet has no tokens, a Swin's change
  from stage to stage)."""
  if model_class(config.model_name) is not VisionTransformer:
    return None
  return posemb.token_grid(config.model, (config.pp.crop,) * 2)


def model_class(name: str):
  """The model class of a preset or custom model name (its family's)."""
  return CLASSES[model_configs.family(name).model]


def count_params(model: nn.Module, image_shape=(1, 224, 224, 3)) -> int:
  """Counts parameters from shapes alone (no memory, no compute)."""
  if isinstance(model, LitModel):
    tokens = jnp.zeros((1, model.pp['max_len']), jnp.int32)
    variables = jax.eval_shape(lambda: model.init(
        jax.random.key(0), images=jnp.zeros(image_shape), tokens=tokens))
    return sum(x.size for x in jax.tree.leaves(variables['params']))
  variables = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros(image_shape), train=False))
  return sum(x.size for x in jax.tree.leaves(variables['params']))
