"""An image model as a backbone: the module whose `forward_intermediates`
gives a checkpoint's image features, whatever model holds it."""

from vit_jax.models import dino
from vit_jax.models import lit
from vit_jax.models import mae
from vit_jax.models import mixer
from vit_jax.models import swin
from vit_jax.models import vit

# Models that hold a ViT beside other parts: DINO's heads, MAE's decoder,
# the text tower.
WRAPPERS = (dino.DinoModel, mae.MaskedAutoencoder, lit.LitModel)
BACKBONES = (vit.VisionTransformer, swin.SwinTransformer, mixer.MlpMixer)


def image_encoder(model, params):
  """(module, its parameters) of `model`'s image features: the model, or a
  wrapper's ViT (`image_encoder`)."""
  if isinstance(model, WRAPPERS):
    return model.image_encoder(params)
  if not isinstance(model, BACKBONES):
    raise ValueError(
        f'{type(model).__name__} has no forward_intermediates; the image '
        f'models that do: {", ".join(c.__name__ for c in BACKBONES)}, and '
        f'the ViT inside {", ".join(c.__name__ for c in WRAPPERS)}.')
  return model, params
