"""Model registry: `get_model(name, **kw)` and the model classes.

Run `python -m vit_jax.models --name=ViT-B_16` to print a preset's
parameter count and output shape.
"""

from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax import cli
from vit_jax import model_configs
from vit_jax import models_lit
from vit_jax import models_mixer
from vit_jax import models_resnet
from vit_jax import models_swin
from vit_jax import models_vit
from vit_jax.model_configs import MODEL_CONFIGS

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
  return models_vit.token_grid(config.model, (config.pp.crop,) * 2)


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


def _main(argv):
  del argv
  if model_class(FLAGS.name) is LitModel:
    print(f'{FLAGS.name}: {count_params(get_model(FLAGS.name)):,} parameters')
    return
  model = get_model(FLAGS.name, num_classes=FLAGS.num_classes)
  size = FLAGS.size or model_configs.native_resolution(FLAGS.name) or 224
  shape = (FLAGS.batch, size, size, 3)
  logits, _ = jax.eval_shape(lambda: model.init_with_output(  # no compute
      jax.random.key(1), jnp.zeros(shape), train=False))
  print(f'{FLAGS.name}: {count_params(model, shape):,} parameters; images '
        f'{shape} -> logits {tuple(logits.shape)}')


if __name__ == '__main__':
  flags.DEFINE_string('name', 'ViT-B_16', 'Model preset.')
  flags.DEFINE_integer('num_classes', 1000, 'Head size.')
  flags.DEFINE_integer('size', None, "Image side (default: the preset's "
                       'native resolution, else 224).')
  flags.DEFINE_integer('batch', 2, 'Batch size.')
  FLAGS = flags.FLAGS
  cli.run(_main)
