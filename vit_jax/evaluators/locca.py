"""LocCa's decoder, evaluated on the test scenes (`data/locca.py`'s tasks).

'locca': for every test scene, greedy decoding of
  its caption from [CAP]: exact match, token F1 and CIDEr-D against the
    scene's caption (`caption_scores`);
  each object's box from [REF] and its phrase (4 tokens, each the best box
    bin): `ref_box_accuracy`, the fraction with IoU >= 0.5 against the true
    box, and `ref_box_iou`, their mean IoU;
  each object's phrase from [GRD] and its true box:
    `grounded_exact_match`.
The model is the recipe's (`models.siglip2_recipe`): `encode` and `logits`.
"""

import functools

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from vit_jax.data import locca
from vit_jax.evaluators import caption_scores
from vit_jax.evaluators import common
from vit_jax.evaluators import registry

IOU_THRESHOLD = 0.5


def _host(x):
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def prompted_greedy(model, params, memory, prompts, lengths, steps: int,
                    allowed=None):
  """Greedy continuation of each row's prompt (`prompts` (B, L), the first
  `lengths` tokens real) for `steps` tokens, recomputing the decoder over
  the whole row each step; `allowed` (lo, hi): only ids in [lo, hi).
  Returns (B, L) rows: prompts then their continuations."""
  rows = jnp.arange(prompts.shape[0])

  def body(i, seq):
    logits = model.apply({'params': params}, memory, seq, method='logits')
    at = jnp.minimum(lengths - 1 + i, seq.shape[1] - 1)
    scores = logits[rows, at]
    if allowed is not None:
      ids = jnp.arange(scores.shape[-1])
      scores = jnp.where((ids >= allowed[0]) & (ids < allowed[1]), scores,
                         -jnp.inf)
    write = jnp.minimum(at + 1, seq.shape[1] - 1)
    return seq.at[rows, write].set(jnp.argmax(scores, -1).astype(seq.dtype))

  return jax.lax.fori_loop(0, steps, body, prompts)


def decode_step(params, images, phrases, phrase_lengths, boxes, *, model,
                vocab, bins, max_len):
  """(caption rows, ref rows, grounded rows) of a batch: images (B, ...),
  phrases (B * O, P) without </s>, their lengths, boxes (B * O, 4) bins."""
  memory = model.apply({'params': params}, images, method='encode')
  objects = phrases.shape[0] // images.shape[0]
  per_object = jnp.repeat(memory, objects, axis=0)
  token = lambda task: locca.task_token(vocab, task)
  n = images.shape[0]
  caption = jnp.zeros((n, max_len), jnp.int32).at[:, 0].set(token('caption'))
  caption = prompted_greedy(model, params, memory, caption,
                            jnp.ones((n,), jnp.int32), max_len - 1,
                            allowed=(0, vocab))
  m, p = phrases.shape
  ref = jnp.zeros((m, max_len), jnp.int32).at[:, 0].set(token('ref'))
  ref = ref.at[:, 1:1 + p].set(phrases[:, :max_len - 1])
  ref = prompted_greedy(model, params, per_object, ref, 1 + phrase_lengths,
                        locca.BOX_TOKENS,
                        allowed=(vocab + len(locca.TASKS),
                                 vocab + len(locca.TASKS) + bins))
  first = vocab + len(locca.TASKS)
  grounded = jnp.zeros((m, max_len), jnp.int32).at[:, 0].set(
      token('grounded'))
  grounded = grounded.at[:, 1:1 + locca.BOX_TOKENS].set(boxes + first)
  grounded = prompted_greedy(
      model, params, per_object, grounded,
      jnp.full((m,), 1 + locca.BOX_TOKENS, jnp.int32),
      max_len - 1 - locca.BOX_TOKENS, allowed=(0, vocab))
  return caption, ref, grounded


def _cut(rows, start, eos):
  """Each row's tokens from `start` (per row) to its first `eos`."""
  out = []
  for row, s in zip(rows.tolist(), start):
    row = row[s:]
    out.append(row[:row.index(eos)] if eos in row else row)
  return out


@registry.register('locca')
class Evaluator(common.Evaluator):
  """`type='locca'`: settings `dataset`, `split`, `samples` (captions
  kept); metrics `exact_match`, `token_f1`, `cider_d`, `ref_box_accuracy`,
  `ref_box_iou`, `grounded_exact_match`, `scenes`, `objects`, `samples`."""

  def __init__(self, name, settings, *, config, model, mesh, tokenizer,
               **_):
    super().__init__(name, settings)
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    self.mesh, self.tokenizer = mesh, tokenizer
    self.bins = config.siglip2.box_bins
    self.samples = settings.get('samples', 8)
    self.example = functools.partial(locca.eval_example, tokenizer=tokenizer)
    self.step = jax.jit(functools.partial(
        decode_step, model=model, vocab=tokenizer.vocab_size, bins=self.bins,
        max_len=config.siglip2.decoder.max_len))

  def __call__(self, params):
    tok, eos = self.tokenizer, self.tokenizer.eos_token
    captions, references, ious, exact, phrases_seen = [], [], [], [], 0
    for batch in common.batches(self.info, self.data, self.mesh,
                                example=self.example):
      real = _host(batch['mask']) > 0
      valid = _host(batch['valid']) & real[:, None]
      phrases = _host(batch['phrases']).reshape(-1, tok.max_len)
      lengths = np.argmax(phrases == eos, axis=1)
      true_boxes = _host(batch['boxes']).reshape(-1, 4)
      caption, ref, grounded = (_host(x) for x in self.step(
          params, batch['image'], jnp.asarray(phrases), jnp.asarray(lengths),
          jnp.asarray(locca.quantize(true_boxes, self.bins))))
      texts = tok.decode(_pad(_cut(caption, [1] * len(caption), eos), eos))
      captions += [t for t, r in zip(texts, real) if r]
      references += [[r] for r, k in zip(
          tok.decode(_host(batch['reference'])), real) if k]
      keep = valid.reshape(-1)
      first = tok.vocab_size + len(locca.TASKS)
      rows = np.arange(len(ref))
      boxes = ref[rows[:, None], (1 + lengths)[:, None] +
                  np.arange(locca.BOX_TOKENS)] - first
      ious += list(locca.box_iou(locca.dequantize(boxes, self.bins),
                                 true_boxes)[keep])
      said = tok.decode(_pad(_cut(grounded, [1 + locca.BOX_TOKENS] *
                                  len(grounded), eos), eos))
      wanted = tok.decode(phrases)
      exact += [s == w for s, w, k in zip(said, wanted, keep) if k]
      phrases_seen += int(keep.sum())
    ious = np.asarray(ious)
    return {
        'exact_match': float(np.mean([caption_scores.exact_match(p, r) for
                                      p, r in zip(captions, references)])),
        'token_f1': float(np.mean([caption_scores.token_f1(p, r) for
                                   p, r in zip(captions, references)])),
        'cider_d': float(caption_scores.cider_d(captions, references)[0]),
        'ref_box_accuracy': float(np.mean(ious >= IOU_THRESHOLD)),
        'ref_box_iou': float(np.mean(ious)),
        'grounded_exact_match': float(np.mean(exact)),
        'scenes': len(captions), 'objects': phrases_seen,
        'samples': [{'caption': p, 'reference': r[0]} for p, r in
                    zip(captions[:self.samples], references)]}

  def summary(self, metrics):
    return (f'decoder: captions exact {metrics["exact_match"]:.4f}, '
            f'CIDEr-D {metrics["cider_d"]:.3f}; ref box acc@0.5 '
            f'{metrics["ref_box_accuracy"]:.4f} (IoU '
            f'{metrics["ref_box_iou"]:.3f}); grounded exact '
            f'{metrics["grounded_exact_match"]:.4f} ({metrics["scenes"]} '
            f'scenes, {metrics["objects"]} objects)')


def _pad(rows, eos):
  """Token lists -> a (n, longest + 1) array, each ended by `eos`."""
  width = max([len(r) for r in rows] + [0]) + 1
  out = np.full((len(rows), width), eos, np.int64)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out
