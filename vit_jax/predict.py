r"""Top-k classes of images, from a checkpoint (.npz or training workdir).

  python -m vit_jax.predict --model_name=ViT-B_16 --checkpoint=ViT-B_16.npz \
      cat.jpg dog.png

Images are resized as the evaluation pipeline does (`input_pipeline.
preprocess_eval`) to the resolution that the checkpoint's position embedding
implies, unless `--size` says otherwise. Class names: ImageNet-1k or -21k for
heads of 1,000 or 21,843 classes, `--labels=FILE` (one name per line) for
others, else class indices.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from etils import epath
import jax
import ml_collections
import numpy as np
import tensorflow as tf

from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import models

FLAGS = flags.FLAGS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
LABEL_FILES = {1000: 'imagenet2012_labels.txt',
               21843: 'imagenet21k_labels.txt'}


# The side that a checkpoint's position table implies; here for callers of
# the command line's functions.
image_size = checkpoint.image_size


def load_classifier(model_name, path, size=None):
  """(model, params, image side) for the checkpoint at `path`."""
  model, params, size = checkpoint.load_model(
      models.MODEL_CONFIGS[model_name], path, size)
  if not model.num_classes:
    raise ValueError(f'{path} has no `head`: it cannot classify.')
  return model, params, size


def read_image(path, size):
  """The image at `path` as the model sees it: (size, size, 3) in [-1, 1]."""
  if not epath.Path(path).exists():
    raise FileNotFoundError(f'{path}: no such file.')
  data = epath.Path(path).read_bytes()
  try:
    image = tf.io.decode_image(data, channels=3, expand_animations=False)
  except tf.errors.InvalidArgumentError as e:
    raise ValueError(f'{path} is not an image that can be decoded (JPEG, PNG, '
                     'GIF or BMP).') from e
  pp = ml_collections.ConfigDict({'crop': size})
  return input_pipeline.preprocess_eval(image, pp).numpy()


def class_names(num_classes, labels_path=None):
  """Names of the classes, from `labels_path` or the shipped ImageNet lists."""
  if labels_path is None and num_classes in LABEL_FILES:
    labels_path = os.path.join(DATA, LABEL_FILES[num_classes])
  if labels_path is None:
    return [str(i) for i in range(num_classes)]
  lines = epath.Path(labels_path).read_text().splitlines()
  names = [line.strip() for line in lines if line.strip()]
  if len(names) != num_classes:
    raise ValueError(f'{labels_path} names {len(names)} classes, but the '
                     f'head has {num_classes}.')
  return names


def predict(model, params, images):
  """Class probabilities (softmax) of a batch of preprocessed images."""
  logits = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(
      params, np.stack(images))
  return np.asarray(jax.nn.softmax(logits.astype(np.float32)))


def main(argv):
  paths = argv[1:]
  if not paths:
    raise app.UsageError('Give one or more image files.')
  tf.config.set_visible_devices([], 'GPU')  # TF only decodes images
  model, params, size = load_classifier(FLAGS.model_name, FLAGS.checkpoint,
                                        FLAGS.size)
  names = class_names(params['head']['kernel'].shape[-1], FLAGS.labels)
  images, good = [], []
  for path in paths:
    try:
      images.append(read_image(path, size))
      good.append(path)
    except (OSError, ValueError, tf.errors.OpError) as e:
      print(f'{path}: error: {e}', file=sys.stderr)
  if good:
    for path, probs in zip(good, predict(model, params, images)):
      print(f'{path}:')
      for i in np.argsort(-probs)[:FLAGS.top_k]:
        print(f'  {probs[i]:.4f}  {names[i]}')
  return 0 if len(good) == len(paths) else 1


if __name__ == '__main__':
  # Defined here, not on import, so that other modules may define theirs.
  flags.DEFINE_string('model_name', None, 'Preset, e.g. ViT-B_16.')
  flags.DEFINE_string('checkpoint', None, 'The .npz file or workdir.')
  flags.DEFINE_string('labels', None, 'Class names, one per line.')
  flags.DEFINE_integer('size', None, "Image side (default: the checkpoint's).")
  flags.DEFINE_integer('top_k', 5, 'Classes printed per image.')
  flags.mark_flags_as_required(['model_name', 'checkpoint'])
  app.run(main)
