"""SigLIP 2's data on Fashion-MNIST scenes: the LocCa decoder's targets, the
self-distillation views, and NaFlex's sequence lengths.

LocCa (Wan et al., 2024) trains one decoder on three tasks, each example on
all three. A sequence is a task token, then (teacher-forced) its prompt and
target, then </s>; the loss is on the target and </s>:

  caption   [CAP] caption </s>
  ref       [REF] phrase  box </s>       (referring expression -> box)
  grounded  [GRD] box  phrase </s>       (grounded captioning: box -> phrase)

A box is 4 tokens, [ymin, xmin, ymax, xmax] each quantized to `bins` bins
(round(c * (bins - 1))). Token ids: the text vocabulary's (V), then the
three task tokens (V, V + 1, V + 2), then the bins (V + 3 ...): the
decoder's vocabulary is V + 3 + bins, and its [MASK] the next id. Each
example's object (its box and phrase) is drawn from its scene's objects,
statelessly from its stream position; a scene with none trains only its
caption.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

from etils import epath
from etils import epy
import jax
import numpy as np
import tensorflow_datasets as tfds

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

from vit_jax.checkpoints import storage
from vit_jax.data import multicrop
from vit_jax.data import packing
from vit_jax.data import pipeline
from vit_jax.data import tokenizers

TASKS = ('caption', 'ref', 'grounded')
BOX_TOKENS = 4
MAX_OBJECTS = 4  # the scenes' most items: the evaluator's objects per scene


def decoder_vocab_size(text_vocab: int, bins: int) -> int:
  """The decoder's vocabulary: text, task tokens, box bins."""
  return text_vocab + len(TASKS) + bins


def task_token(text_vocab: int, task: str) -> int:
  return text_vocab + TASKS.index(task)


def quantize(boxes, bins: int):
  """[..., 4] coordinates in [0, 1] -> bin indices 0..bins - 1."""
  return np.clip(np.rint(np.asarray(boxes) * (bins - 1)), 0,
                 bins - 1).astype(np.int32)


def dequantize(indices, bins: int):
  return np.asarray(indices, np.float32) / (bins - 1)


def box_iou(a, b):
  """IoU of [..., 4] [ymin, xmin, ymax, xmax] boxes."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  h = np.clip(np.minimum(a[..., 2], b[..., 2]) -
              np.maximum(a[..., 0], b[..., 0]), 0, None)
  w = np.clip(np.minimum(a[..., 3], b[..., 3]) -
              np.maximum(a[..., 1], b[..., 1]), 0, None)
  area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])
  union = area(a) + area(b) - h * w
  return np.where(union > 0, h * w / np.maximum(union, 1e-12), 0.)


def text_ids(tokenizer, texts):
  """Each text's pieces, without </s> (the tokenizer's rows, cut)."""
  rows = tokenizer(list(texts))
  eos = tokenizer.eos_token
  return [list(r[:list(r).index(eos)]) if eos in r else list(r)
          for r in rows.tolist()]


def sequences(tokenizer, captions, phrases, boxes, has_object, *, bins: int,
              max_len: int) -> dict:
  """The decoder's teacher-forced rows for the three tasks, each (B, 3,
  max_len), tasks in the order of TASKS: 'inputs' (the sequence), 'targets' (the next token) and
  'weights' (1 on the target's tokens and </s>)."""
  vocab, eos = tokenizer.vocab_size, tokenizer.eos_token
  caption_ids, phrase_ids = (text_ids(tokenizer, t) for t in
                             (captions, phrases))
  box_ids = quantize(boxes, bins) + vocab + len(TASKS)
  out = {k: np.zeros((len(captions), len(TASKS), max_len), dtype)
         for k, dtype in (('inputs', np.int32), ('targets', np.int32),
                          ('weights', np.float32))}
  for i, caption in enumerate(caption_ids):
    box, phrase = list(box_ids[i]), phrase_ids[i]
    rows = (([], caption), (phrase, box), (box, phrase))
    for t, (prompt, target) in enumerate(rows):
      seq = [task_token(vocab, TASKS[t])] + prompt + target + [eos]
      scored = np.zeros(len(seq))
      scored[1 + len(prompt):] = 1.
      if t and not has_object[i]:
        scored[:] = 0.  # no object: only the caption trains
      seq, scored = seq[:max_len + 1], scored[:max_len + 1]
      n = len(seq) - 1
      out['inputs'][i, t, :n] = seq[:-1]
      out['targets'][i, t, :n] = seq[1:]
      out['weights'][i, t, :n] = scored[1:]
  return out


def check_lengths(tokenizer, captions, phrases, max_len: int):
  """Raises if `max_len` cuts a caption or a phrase's sequence."""
  longest = max([len(c) + 2 for c in text_ids(tokenizer, captions)] +
                [len(p) + BOX_TOKENS + 2 for p in text_ids(tokenizer,
                                                           phrases)])
  if longest - 1 > max_len:
    raise ValueError(f'config.siglip2.decoder.max_len={max_len} cuts '
                     f'decoder sequences of {longest - 1} tokens: set it to '
                     f'at least {longest - 1}.')


def training_texts(config):
  """(captions, phrases) of the training split."""
  builder = pipeline.get_builder(config)
  ds = builder.as_dataset(split=pipeline.split_spec(builder, config.pp.train,
                                                    'train'),
                          decoders={'image': tfds.decode.SkipDecoding(),
                                    'segmentation_mask':
                                        tfds.decode.SkipDecoding()})
  captions, phrases = [], []
  for ex in tfds.as_numpy(ds.map(lambda f: (f['caption'],
                                            f['objects']['phrase']))):
    captions.append(ex[0].decode())
    phrases.extend(p.decode() for p in ex[1])
  return captions, phrases


def vocabulary(config, workdir, vocab_size: int, fit: bool = True):
  """`config.lit.vocab_path`, else `{workdir}/vocab.model`: SentencePiece
  fitted once (with `fit`) to the training captions and phrases."""
  given = config.lit.vocab_path
  path = given or storage.join(workdir, 'vocab.model')
  if fit and not given and not epath.Path(path).exists():
    if jax.process_count() > 1:  # each process would fit its own
      raise ValueError('Fit the vocabulary in a one-process run, or set '
                       'config.lit.vocab_path, for a multi-process run.')
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    captions, phrases = training_texts(config)
    tokenizers.train_sentencepiece(captions + phrases, path, vocab_size)
  return path


def _one_object(objects, seed):
  """(box, phrase, whether the scene has any) of a random object."""
  n = tf.shape(objects['bbox'])[0]
  i = tf.random.stateless_uniform([], seed, 0, tf.maximum(n, 1),
                                  dtype=tf.int32)
  i = tf.where(n > 0, i, n)  # index n: the padding row below
  box = tf.concat([tf.reshape(objects['bbox'], [-1, 4]),
                   tf.zeros([1, 4])], 0)[i]
  phrase = tf.concat([objects['phrase'], tf.constant([''])], 0)[i]
  return box, phrase, n > 0


def ssl_views(image, seed, config):
  """SILC's views of a uint8 image: one global (`pp.crop`) and
  `crops.num_local` local ones, DINO's augmentations, normalized."""
  crops = config.siglip2.crops
  fold = lambda i: tf.random.experimental.stateless_fold_in(seed, i)
  settings = dict(blur_sigma=tuple(crops.blur_sigma), solarize_p=0.)
  out = {'global': tf.stack([multicrop.view(
      image, fold(0), size=config.pp.crop, scale=crops.global_scale,
      blur_p=multicrop.BLUR_P[0], **settings)])}
  out['local'] = tf.stack([multicrop.view(
      image, fold(1 + i), size=crops.local_size, scale=crops.local_scale,
      blur_p=multicrop.BLUR_P[2], **settings)
                           for i in range(crops.num_local)])
  return {k: pipeline.normalize(v * 2. - 1., config.pp)
          for k, v in out.items()}


def naflex_budget(seed: int, step: int, budgets) -> int:
  """The patch budget of training step `step`: one of `budgets`, drawn
  from (seed, step), so that every process and a resumed run agree."""
  rng = np.random.default_rng([seed, step, 2])
  return int(budgets[rng.integers(len(budgets))])


def naflex_aspects(seed: int, step: int, batch_size: int, aspects):
  """The width / height stretch of each image of training step `step`,
  log-uniform in `aspects` (low, high), drawn from (seed, step)."""
  low, high = aspects
  rng = np.random.default_rng([seed, step, 3])
  return np.exp(rng.uniform(np.log(low), np.log(high), batch_size))


def naflex_batch(pixels, budget: int, patch: int, pp, stretch=None) -> dict:
  """uint8 NHWC images -> NaViT's batch (one image a sequence, padded to
  `budget` tokens), each at its `naflex_grid`, aspect ratio kept; with
  `stretch` (one a image) its width stretched first, as an image of that
  aspect: the scenes' boxes, captions and phrases stay true."""
  stretch = np.ones(len(pixels)) if stretch is None else stretch
  examples = []
  for image, factor in zip(pixels, stretch):
    height, width = image.shape[:2]
    grid = packing.naflex_grid(height, max(1, round(width * factor)), patch,
                               budget)
    examples.append([packing.example(image, 0, *grid, patch,
                                     mean=pp.get('mean'), std=pp.get('std'))])
  batch = packing.pack(examples, budget, 1, patch * patch * pixels.shape[-1])
  del batch['labels']
  return batch


def train_iterator(config, tokenizer, *, batch_size, start_step=0,
                   rows=None, ssl=False, naflex=False):
  """This process's rows of the training batches: 'image' (the scene
  resized to `pp.crop`, no augmentation: SigLIP 2 keeps the image-text
  losses on the original image) or with `naflex` NaViT's batch keys at the
  step's patch budget, 'tokens' (the caption, for the text tower), the
  decoder's 'inputs', 'targets', 'weights' (B, 3, L) and with `ssl` the
  views 'global' (B, 1, ...) and 'local' (B, num_local, ...)."""
  info = pipeline.dataset_info(pipeline.get_builder(config), config)
  ds, augment_seed = pipeline.shuffled_stream(
      pipeline.read_encoded(info.builder, info.train_split), info.num_train,
      config, batch_size=batch_size, start_step=start_step, rows=rows)
  s = config.siglip2

  def process(position, features):
    image, _ = pipeline.decode(features, info.channels, config.pp.label)
    seed = tf.random.experimental.stateless_fold_in(augment_seed, position)
    box, phrase, has = _one_object(
        features['objects'], tf.random.experimental.stateless_fold_in(seed, 3))
    out = {'caption': features['caption'], 'box': box, 'phrase': phrase,
           'has_object': has}
    out['pixels' if naflex else 'image'] = (
        image if naflex else pipeline.preprocess_eval(image, config.pp))
    if ssl:
      out.update(ssl_views(image, tf.random.experimental.stateless_fold_in(
          seed, 4), config))
    return out

  def texts(batch):
    captions = [c.decode() for c in batch.pop('caption')]
    phrases = [p.decode() for p in batch.pop('phrase')]
    batch['tokens'] = tokenizer(captions)
    batch.update(sequences(tokenizer, captions, phrases, batch.pop('box'),
                           batch.pop('has_object'), bins=s.box_bins,
                           max_len=s.decoder.max_len))
    return batch

  ds = ds.map(process, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch_size if rows is None else len(rows), drop_remainder=True)
  patch = config.model.image.patches.size[0]
  for step, batch in enumerate(tfds.as_numpy(ds.prefetch(config.prefetch)),
                               start_step):
    batch = texts(batch)
    if naflex:
      budget = naflex_budget(config.seed, step, s.naflex_budgets)
      stretch = naflex_aspects(config.seed, step, batch_size,
                               s.naflex_aspects)
      batch.update(naflex_batch(batch.pop('pixels'), budget, patch,
                                config.pp,
                                stretch if rows is None else stretch[rows]))
    yield batch


def eval_example(features, *, info, pp, tokenizer):
  """A test scene (`pipeline.eval_dataset`'s `example`): the image, its
  caption's tokens, up to MAX_OBJECTS objects' boxes and phrase tokens,
  which are real ('valid'), and `mask` 1."""
  image, _ = pipeline.decode(features, info.channels, pp.get('label'))
  objects = features['objects']
  n = tf.minimum(tf.shape(objects['bbox'])[0], MAX_OBJECTS)
  pad = MAX_OBJECTS - n
  boxes = tf.pad(tf.reshape(objects['bbox'], [-1, 4])[:n], [[0, pad], [0, 0]])
  phrases = tf.pad(objects['phrase'][:n], [[0, pad]])
  return {'image': pipeline.preprocess_eval(image, pp),
          'reference': tokenizer.preprocess_tf(features['caption']),
          'boxes': tf.ensure_shape(boxes, [MAX_OBJECTS, 4]),
          'phrases': tf.ensure_shape(
              tf.numpy_function(lambda t: tokenizer(list(t)), [phrases],
                                tf.int32), [MAX_OBJECTS, tokenizer.max_len]),
          'valid': tf.range(MAX_OBJECTS) < n,
          'mask': tf.constant(1.0)}
