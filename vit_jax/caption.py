r"""Captions of images, from a captioner (`trainer='captioning'`).

  python -m vit_jax.caption --checkpoint=/tmp/cappa shoe.png bag.png
  python -m vit_jax.caption --checkpoint=/tmp/cappa/ViT-fmnist-cappa.npz \
      --beam=4 shoe.png

Prints each image's path and its caption: greedy, or by beam search
(`--beam`, length-normalised). `--checkpoint` is a finished run's workdir
or its export's .npz, beside which lie the decoder, the vocabulary and the
record (`tasks.captioning.load_captioner`). Each image is prepared by the
checkpoint's eval transform: its run's `pp`, as its evaluators saw the
test split.
"""

import functools
import json
import sys

from absl import app
from absl import flags
from etils import epath
import jax
import ml_collections
import numpy as np
from PIL import Image
import tensorflow as tf

from vit_jax import cli
from vit_jax.checkpoints import storage
from vit_jax.data import pipeline
from vit_jax.models import decoding
from vit_jax.run import run_record
from vit_jax.tasks import captioning

FLAGS = flags.FLAGS


def export(checkpoint: str) -> str:
  """The export's .npz of `checkpoint` (a workdir: its run's)."""
  if not epath.Path(checkpoint).exists():
    raise FileNotFoundError(f'--checkpoint={checkpoint} not found.')
  if not epath.Path(checkpoint).is_dir():
    return checkpoint
  record = epath.Path(storage.join(checkpoint, run_record.CONFIG))
  if not record.exists():
    raise FileNotFoundError(f'{checkpoint} holds no {run_record.CONFIG}: not '
                            'a workdir of a run.')
  return captioning.export_path(
      checkpoint, json.loads(record.read_text())['model_name'])


def read_image(path, pp):
  """The image at `path`, as the run's evaluators prepared test images."""
  with Image.open(path) as image:
    pixels = np.asarray(image.convert('RGB'))
  return pipeline.preprocess_eval(tf.constant(pixels), pp).numpy()


def main(argv):
  paths = argv[1:]
  if not paths:
    raise app.UsageError('Give one or more image files.')
  model, params, tokenizer, record = captioning.load_captioner(
      export(FLAGS.checkpoint))
  pp = ml_collections.ConfigDict(record['pp'])
  images, good = [], []
  for path in paths:
    try:
      images.append(read_image(path, pp))
      good.append(path)
    except (OSError, ValueError) as e:
      print(f'Error: {e}' if path in str(e) else f'Error: {path}: {e}',
            file=sys.stderr)
  if good:
    run = jax.jit(functools.partial(
        decoding.captions, model, bos=tokenizer.bos_token,
        eos=tokenizer.eos_token, max_len=tokenizer.max_len, beam=FLAGS.beam))
    for path, text in zip(good, tokenizer.decode(run(params,
                                                     np.stack(images)))):
      print(f'{path}: {text}')
  return 0 if len(good) == len(paths) else 1


def define_flags():
  flags.DEFINE_string('checkpoint', None, "A captioning run's workdir, or "
                      'its exported .npz.')
  flags.DEFINE_integer('beam', 1, 'Beam width; 1: greedy.', lower_bound=1)
  flags.mark_flags_as_required(['checkpoint'])


if __name__ == '__main__':
  # Defined here, not on import, so that other modules may define theirs.
  define_flags()
  cli.run(main)
