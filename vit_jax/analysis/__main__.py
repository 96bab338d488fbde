r"""The paper's Figures 6 and 7 for a checkpoint, and DINO's class-token
attention per head: PNGs and analysis.json.

  python -m vit_jax.analysis --model_name=ViT-B_16 --checkpoint=ViT-B_16.npz \
      --out=/tmp/figures cat.jpg dog.png
  python -m vit_jax.analysis --config=configs/default.py \
      --checkpoint=/tmp/vit_default/ViT-fmnist.npz --out=/tmp/figures

The model is the one the checkpoint's record names (an export, a workdir),
a preset (`--model_name`) or a config file's (`--config`).
Image files are prepared as `predict` prepares them (the checkpoint's
`NAME.transform.json`, `--crop_pct`, `--interpolation`...).
The class-token figure (`class_token_attention.png`) is skipped, with a
note, for models without a class token ('gap', 'map', 'unpooled').
Without image files the attention figures use the first `--num_images` test
images of the config's dataset, or, with a preset alone, Gaussian noise;
`analysis.json` says which. The embedding figures need no images.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

# pylint: disable=g-import-not-at-top
import matplotlib

# Files only, with or without a display: the command, not the figures
# module, chooses (a notebook keeps its inline backend).
matplotlib.use('Agg')

from absl import app
from absl import flags
from absl import logging
import numpy as np
from ml_collections import config_flags
import tensorflow as tf

from vit_jax import cli
from vit_jax import predict
from vit_jax import run_config
from vit_jax.analysis import paper_figures
from vit_jax.convert import converter
from vit_jax.convert import transform

FLAGS = flags.FLAGS
HELD = []  # --config.model.* flags parsed against a preset's model
flags.DEFINE_string('model_name', None, 'Preset, e.g. ViT-B_16 (default: '
                    "the checkpoint's record's).")
config_flags.DEFINE_config_file(
    'config', None, 'Experiment config (its model and dataset), instead of '
    '--model_name.')
flags.DEFINE_string('checkpoint', None, 'The .npz file or training workdir.',
                    required=True)
flags.DEFINE_string('out', None, 'Folder for the figures.', required=True)
flags.DEFINE_integer('num_images', 128,
                     'Dataset or noise images for the attention distance.')
flags.DEFINE_integer('rollout_images', 8, 'Images in the rollout figure.')
flags.DEFINE_bool('gray', False, 'The model was trained on gray images: '
                  'sum its filters over the colour channels first.')
transform.define_flags()  # how image files are prepared, as for predict


def run_settings(checkpoint, recorded):
  """(model config dict, config or None): the preset's (default: the one
  the checkpoint's record names), or the config's as `vit_jax.main`
  settles it (`run_config`); the checkpoint's record applied to either."""
  if FLAGS.config is not None and FLAGS.model_name is not None:
    raise app.UsageError('Give at most one of --model_name and --config.')
  if FLAGS.config is None:
    return transform.preset_settings(FLAGS.model_name, recorded,
                                     source=FLAGS.checkpoint)[0], None
  with FLAGS.config.unlocked():  # whose record applies
    FLAGS.config.pretrained_path = checkpoint
  config = run_config.resolve(
      FLAGS.config, config_flags.get_override_values(FLAGS['config']), HELD)
  return config.model.to_dict(), config


def inputs(paths, size, recorded, config):
  """(images, a note saying what they are)."""
  if paths:
    spec = predict.transform_for(
        FLAGS.checkpoint, recorded, size,
        FLAGS.model_name or (recorded or {}).get('model_name') or '')
    return (np.stack([predict.read_image(p, spec) for p in paths]),
            f'the {len(paths)} image files given')
  if config is not None:
    where = f'{config.dataset}:{config.pp.test}'
    return (paper_figures.dataset_images(config, size,
                                         FLAGS.num_images),
            f'the first {FLAGS.num_images} images of {where}')
  noise = np.random.default_rng(0).normal(0, .5, (FLAGS.num_images, size,
                                                  size, 3))
  return (np.clip(noise, -1, 1).astype(np.float32),
          f'{FLAGS.num_images} Gaussian noise images (no images or dataset '
          'given)')


def main(argv):
  tf.config.set_visible_devices([], 'GPU')  # TF only decodes images
  if not FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  checkpoint, recorded = converter.checkpoint_and_record(FLAGS.checkpoint)
  model_config, config = run_settings(checkpoint, recorded)
  model, params, size = paper_figures.load_model(model_config, checkpoint)
  images, note = inputs(argv[1:], size, recorded, config)
  print(f'Attention figures from {note}; embedding figures from the '
        'parameters alone.', flush=True)
  results = paper_figures.analyze(model, params, images,
                                  images[:FLAGS.rollout_images], FLAGS.gray)
  paths = paper_figures.write(results, FLAGS.out, {
      'checkpoint': FLAGS.checkpoint, 'attention_inputs': note})
  distance = results['mean_attention_distance']
  for layer, heads in enumerate(distance, start=1):  # as in the figure
    print(f'layer {layer}: mean attention distance (px) ' +
          ' '.join(f'{d:.1f}' for d in heads))
  for name, why in results['skipped'].items():
    print(f'No {name}.png: {why}')
  print('Wrote ' + ', '.join(paths + [os.path.join(FLAGS.out,
                                                   'analysis.json')]))
  return 0


if __name__ == '__main__':
  sys.argv, HELD = run_config.held_model_flags(sys.argv)
  cli.run(main)
