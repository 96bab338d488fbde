"""(image, caption) pairs for LiT training, as tf.data streams.

Captions come from one of (`settings(config)`: `config.lit`, or
`config.captioning` for a captioner):
  a folder's captions file: `config.dataset` is a folder holding
    `captions.tsv`, one `relative/image/path<TAB>caption` a line;
  a tfds text feature: `text_key` names a string feature of the dataset;
  class captions: `class_captions[label]` lists captions of each class; every
    example draws one (stateless, from its position), as captions made from
    class names and descriptions.

The stream is a pure function of (seed, position), as `input_pipeline`'s:
images are augmented by `pipeline.preprocess_train`, and the captions
of each batch are tokenized by the tower's tokenizer.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import os

from etils import epath
from etils import epy
import jax
import tensorflow_datasets as tfds

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

from vit_jax.checkpoints import storage
from vit_jax.data import pipeline
from vit_jax.data import tokenizers

CAPTIONS_FILE = 'captions.tsv'


def read_captions_file(folder):
  """([image paths], [captions]) of `folder`/captions.tsv."""
  path = epath.Path(folder) / CAPTIONS_FILE
  paths, captions = [], []
  with path.open() as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      name, sep, caption = line.rstrip('\n').partition('\t')
      if not sep or not caption.strip():
        raise ValueError(f'{path}:{n}: expected "image path<TAB>caption".')
      paths.append(os.fspath(epath.Path(folder) / name))
      captions.append(caption)
  if not paths:
    raise ValueError(f'{path} lists no images.')
  return paths, captions


def settings(config):
  """Where the run's caption settings are: `config.lit` (LiT) or
  `config.captioning`."""
  return config.lit if 'lit' in config else config.captioning


def has_captions_file(config) -> bool:
  return bool(config.dataset) and (
      epath.Path(config.dataset) / CAPTIONS_FILE).is_file()


def captioned_examples(config):
  """All of {'image': encoded bytes, 'caption' (or 'label' with class
  captions)}, in a fixed order."""
  lit = settings(config)
  if has_captions_file(config):
    paths, captions = read_captions_file(config.dataset)
    ds = tf.data.Dataset.from_tensor_slices((paths, captions))
    return ds.map(lambda p, c: {'image': tf.io.read_file(p), 'caption': c})
  builder = pipeline.get_builder(config)
  ds = pipeline.read_encoded(
      builder, pipeline.split_spec(builder, config.pp.train, 'train'))
  if lit.text_key:
    if lit.text_key not in builder.info.features:
      raise ValueError(f'{config.dataset!r} has no feature {lit.text_key!r}; '
                       f'it has {sorted(builder.info.features)}.')
    return ds.map(lambda f: {'image': f['image'], 'caption': f[lit.text_key]})
  check_class_captions(config)
  return ds


def check_class_captions(config):
  """Raises unless captions come from a file, a feature, or one list of
  captions per class of the training dataset."""
  lit = settings(config)
  if has_captions_file(config) or lit.text_key:
    return
  section = 'lit' if 'lit' in config else 'captioning'
  info = pipeline.dataset_info(pipeline.get_builder(config),
                                         config)
  if not lit.class_captions:
    raise ValueError('No captions: give config.dataset a folder with '
                     f'{CAPTIONS_FILE}, or set config.{section}.text_key or '
                     f'config.{section}.class_captions.')
  if len(lit.class_captions) != info.num_classes:
    raise ValueError(f'config.{section}.class_captions has '
                     f'{len(lit.class_captions)} lists for the '
                     f'{info.num_classes} classes.')
  empty = [i for i, c in enumerate(lit.class_captions) if not c]
  if empty:
    raise ValueError(f'config.{section}.class_captions has no captions for '
                     f'classes {empty}.')


def _class_caption(label, seed, class_captions):
  """One of `class_captions[label]`, drawn with the stateless `seed`."""
  options = tf.ragged.constant([list(c) for c in class_captions])[label]
  i = tf.random.stateless_uniform([], seed, 0, tf.size(options, tf.int32),
                                  dtype=tf.int32)
  return options[i]


def train_iterator(config, tokenizer, *, batch_size, start_step=0, rows=None):
  """This process's rows of the global batches {'image', 'tokens'}, from
  step `start_step` on (see `pipeline.shuffled_stream`)."""
  base = captioned_examples(config)
  n = int(base.cardinality())
  if n < 0:
    n = int(base.reduce(0, lambda count, _: count + 1))
  ds, augment_seed = pipeline.shuffled_stream(
      base, n, config, batch_size=batch_size, start_step=start_step,
      rows=rows)
  local_batch = batch_size if rows is None else len(rows)

  def process(position, features):
    image = tf.io.decode_image(features['image'], channels=3,
                               expand_animations=False)
    seed = tf.random.experimental.stateless_fold_in(augment_seed, position)
    caption = features.get('caption')
    if caption is None:
      caption = _class_caption(
          features['label'], tf.random.experimental.stateless_fold_in(seed, 2),
          settings(config).class_captions)
    return {'image': pipeline.preprocess_train(image, seed, config.pp),
            'caption': caption}

  def tokenize(batch):
    tokens = tf.numpy_function(lambda t: tokenizer(t.tolist()),
                               [batch.pop('caption')], tf.int32)
    batch['tokens'] = tf.ensure_shape(tokens,
                                      [local_batch, tokenizer.max_len])
    return batch

  ds = ds.map(process, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(local_batch, drop_remainder=True).map(tokenize)
  return iter(tfds.as_numpy(ds.prefetch(config.prefetch)))


def vocabulary(config, workdir, vocab_size, fit=True):
  """The run's vocabulary file: the caption settings' `vocab_path`, else
  `{workdir}/vocab.model`, SentencePiece fitted once to the training
  captions (with `fit`)."""
  given = settings(config).vocab_path
  path = given or storage.join(workdir, 'vocab.model')
  if fit and not given and not epath.Path(path).exists():
    if jax.process_count() > 1:  # each process would fit its own
      section = 'lit' if 'lit' in config else 'captioning'
      raise ValueError('Fit the vocabulary in a one-process run, or set '
                       f'config.{section}.vocab_path, for a multi-process '
                       'run.')
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    tokenizers.train_sentencepiece(all_captions(config), path, vocab_size)
  return path


def all_captions(config):
  """Every caption text of the training data (to fit a vocabulary)."""
  if has_captions_file(config):
    return read_captions_file(config.dataset)[1]
  if settings(config).text_key:
    ds = captioned_examples(config).map(lambda f: f['caption'])
    return [c.decode() for c in tfds.as_numpy(ds)]
  return [c for captions in settings(config).class_captions for c in captions]


def eval_example(features, *, info, pp, text_key='', tokenizer=None):
  """A test example (`pipeline.eval_dataset`'s `example`): the image as
  the evaluators see it, `mask` 1, and what its references come from: the
  tokens of its `text_key` caption ('reference'), else its class ('label',
  an int: the class captions are the references)."""
  image, label = pipeline.decode(features, info.channels, pp.get('label'))
  out = {'image': pipeline.preprocess_eval(image, pp),
         'mask': tf.constant(1.0)}
  if text_key:
    out['reference'] = tokenizer.preprocess_tf(features[text_key])
  else:
    out['label'] = tf.cast(label, tf.int32)
  return out
