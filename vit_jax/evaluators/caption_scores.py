"""Scores of predicted captions against reference captions.

- `exact_match`: 1 if the prediction equals one of the references, else 0.
- `token_f1`: the F1 of the tokens that the prediction and a reference share
  (as SQuAD scores answers: Rajpurkar et al., EMNLP 2016), the best over the
  references.
- `cider_d`: CIDEr-D (Vedantam et al., CVPR 2015, "CIDEr: Consensus-based
  Image Description Evaluation"), as the COCO caption toolkit computes it
  (pycocoevalcap's `cider/cider_scorer.py`): the cosine similarity of tf-idf
  weighted n-grams (n = 1..4), the prediction's weights clipped by the
  reference's, under a Gaussian penalty on the length difference, averaged
  over n and the references, times 10.

All three compare the words of `normalize`, which stands in for the PTB
tokenizer (Java) that COCO's toolkit runs first. Pure Python and numpy, so
that they run wherever the predictions are decoded.
"""

import collections
import string

import numpy as np

MAX_N = 4  # CIDEr-D's longest n-gram
SIGMA = 6.  # CIDEr-D's length penalty: exp(-(len_c - len_r)^2 / (2 sigma^2))

_NO_PUNCTUATION = str.maketrans('', '', string.punctuation)


def normalize(text: str) -> list:
  """Lower-case words of `text`, punctuation removed.

  It stands in for the PTB tokenizer (Java) that COCO's toolkit runs before
  scoring: the two agree on lower-case words without punctuation. Removing
  punctuation rather than splitting on it keeps a hyphenated word
  ("t-shirt") one token.
  """
  return text.lower().translate(_NO_PUNCTUATION).split()


def _check_references(references, name='references'):
  if isinstance(references, str) or len(references) == 0:
    raise ValueError(f'{name}: expected a non-empty list of reference '
                     f'captions; got {references!r}.')


def exact_match(prediction: str, references) -> float:
  """1.0 if the normalized prediction equals a normalized reference."""
  _check_references(references)
  words = normalize(prediction)
  return float(any(words == normalize(r) for r in references))


def _f1(prediction, reference):
  """F1 of two token lists, tokens counted as a multiset."""
  if not prediction or not reference:
    return float(prediction == reference)
  shared = sum((collections.Counter(prediction) &
                collections.Counter(reference)).values())
  if not shared:
    return 0.
  precision, recall = shared / len(prediction), shared / len(reference)
  return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references) -> float:
  """SQuAD's token F1 (no article dropped), the best over `references`."""
  _check_references(references)
  words = normalize(prediction)
  return max(_f1(words, normalize(r)) for r in references)


def _ngrams(words):
  """Counts of the n-grams of `words`, n = 1..MAX_N."""
  return collections.Counter(tuple(words[i:i + n])
                             for n in range(1, MAX_N + 1)
                             for i in range(len(words) - n + 1))


def _cider_d_one(candidate, references, idf):
  """CIDEr-D of one candidate (token list) against its references.

  The toolkit measures a caption's length by its bigrams; two lengths then
  differ as the words do unless a caption is empty, which scores 0 anyway.
  """
  captions = [candidate, *references]
  counts = [_ngrams(c) for c in captions]
  vocab = sorted(set().union(*counts))
  # (1 + references, vocab): tf-idf weights; the candidate is row 0.
  weights = np.array([[c[g] * idf(g) for g in vocab] for c in counts])
  order = np.eye(MAX_N)[[len(g) - 1 for g in vocab]]  # (vocab, MAX_N)
  norms = np.sqrt(weights ** 2 @ order)
  cand, refs = weights[0], weights[1:]
  # Clipping: a candidate's repeats earn no more than the reference has.
  dots = (np.minimum(cand, refs) * refs) @ order
  denominators = norms[0] * norms[1:]
  cosines = np.divide(dots, denominators, out=np.zeros_like(dots),
                      where=denominators > 0)
  lengths = np.array([len(c) for c in captions])
  penalty = np.exp(-(lengths[1:] - lengths[0]) ** 2 / (2 * SIGMA ** 2))
  return 10 * float(np.mean(cosines * penalty[:, None]))


def cider_d(predictions, references):
  """CIDEr-D of each prediction against its references.

  The document frequency of an n-gram is the number of predictions whose
  references hold it, over the whole evaluated corpus, so a score depends on
  the corpus it is computed in (as in COCO's toolkit).

  Args:
    predictions: N captions (str).
    references: N non-empty lists of reference captions (str).

  Returns:
    (the mean over the corpus, (N,) float64 scores).
  """
  if len(predictions) != len(references):
    raise ValueError(f'{len(predictions)} predictions but '
                     f'{len(references)} lists of references.')
  if not predictions:
    raise ValueError('No predictions to score.')
  for i, refs in enumerate(references):
    _check_references(refs, f'references[{i}]')
  predictions = [normalize(p) for p in predictions]
  references = [[normalize(r) for r in refs] for refs in references]
  document_frequency = collections.Counter(
      g for refs in references for g in set().union(*map(_ngrams, refs)))
  log_images = np.log(len(predictions))
  # An n-gram that no reference holds weighs as one that only one holds.
  idf = lambda g: log_images - np.log(max(1, document_frequency[g]))
  scores = np.array([_cider_d_one(p, refs, idf)
                     for p, refs in zip(predictions, references)])
  return float(scores.mean()), scores
