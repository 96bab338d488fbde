"""`python -m vit_jax.models --name=PRESET`: parameters and output shape."""

from absl import flags
import jax
import jax.numpy as jnp

from vit_jax import cli
from vit_jax import models
from vit_jax.models import registry

FLAGS = flags.FLAGS


def _main(argv):
  del argv
  if models.model_class(FLAGS.name) is models.LitModel:
    count = models.count_params(models.get_model(FLAGS.name))
    print(f'{FLAGS.name}: {count:,} parameters')
    return
  model = models.get_model(FLAGS.name, num_classes=FLAGS.num_classes)
  size = FLAGS.size or registry.native_resolution(FLAGS.name) or 224
  shape, kind = (FLAGS.batch, size, size, 3), 'images'
  config = models.MODEL_CONFIGS[FLAGS.name]
  if 'tubelet' in config or 'attention_type' in config:  # video: clips
    frames = FLAGS.frames
    if config.get('num_frames') and not FLAGS['frames'].present:
      frames = config.num_frames  # a TimeSformer's: its weights'
    shape, kind = (FLAGS.batch, frames, size, size, 3), 'clips'
  logits, _ = jax.eval_shape(lambda: model.init_with_output(  # no compute
      jax.random.key(1), jnp.zeros(shape), train=False))
  print(f'{FLAGS.name}: {models.count_params(model, shape):,} parameters; '
        f'{kind} {shape} -> logits {tuple(logits.shape)}')


if __name__ == '__main__':
  flags.DEFINE_string('name', 'ViT-B_16', 'Model preset.')
  flags.DEFINE_integer('num_classes', 1000, 'Head size.')
  flags.DEFINE_integer('size', None, "Image side (default: the preset's "
                       'native resolution, else 224).')
  flags.DEFINE_integer('batch', 2, 'Batch size.')
  flags.DEFINE_integer('frames', 32, "A video model's frames per clip "
                       "(Scenic's Kinetics configs: 32; a TimeSformer: its "
                       "preset's).")
  cli.run(_main)
