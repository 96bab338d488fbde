"""`python -m vit_jax.convert SRC DST [--layout=transformers]`: see
`vit_jax.convert`. An .npz SRC is written in timm's layout (DST a
.safetensors file) or, with --layout=transformers, as a transformers
folder DST (config.json, model.safetensors, preprocessor_config.json)."""

from absl import flags

from vit_jax import cli
from vit_jax.convert import converter
from vit_jax.convert import export

FLAGS = flags.FLAGS

def main(argv):
  if len(argv) != 3:
    raise ValueError('Usage: python -m vit_jax.convert SRC DST (SRC: a timm '
                     'or transformers folder, weights file or hub name, or a '
                     '.npz; --layout=transformers: DST a folder).')
  name = converter.convert(argv[1], argv[2], FLAGS.model_name, FLAGS.layout)
  print(f'{argv[1]} -> {argv[2]} ({name})')


if __name__ == '__main__':
  flags.DEFINE_string('model_name', None,
                      'Preset (default: the .npz record\'s, else inferred '
                      'from the shapes).')
  flags.DEFINE_enum('layout', 'timm', export.LAYOUTS,
                    "An .npz's output: timm's .safetensors, or a "
                    "transformers folder (config.json, model.safetensors, "
                    'preprocessor_config.json).')
  cli.run(main)
