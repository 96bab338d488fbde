"""`python -m vit_jax.convert SRC DST`: see `vit_jax.convert`."""

from absl import flags

from vit_jax import cli
from vit_jax.convert import converter

FLAGS = flags.FLAGS

def main(argv):
  if len(argv) != 3:
    raise ValueError('Usage: python -m vit_jax.convert SRC DST (SRC: a timm '
                     'or transformers folder, weights file or hub name, or '
                     'a .npz).')
  name = converter.convert(argv[1], argv[2], FLAGS.model_name)
  print(f'{argv[1]} -> {argv[2]} ({name})')


if __name__ == '__main__':
  flags.DEFINE_string('model_name', None,
                      'Preset (default: inferred from the shapes).')
  cli.run(main)
