"""Caption scores: CIDEr-D against pycocoevalcap's own scorer
(scripts/make_caption_scores_golden.py) and worked by hand from the paper's
equations, token F1 and exact match by hand, and the inputs refused."""

import ast
import json
import math
import os

import numpy as np
import pytest

from tests import helpers
from vit_jax.evaluators import caption_scores


def test_normalize():
  assert caption_scores.normalize(' A T-shirt,  two BAGS!\n') == [
      'a', 'tshirt', 'two', 'bags']
  assert caption_scores.normalize('...') == []


def test_exact_match():
  assert caption_scores.exact_match('A red bag.', ['the bag', 'a red bag']) == 1
  assert caption_scores.exact_match('a red bag', ['the red bag']) == 0
  assert caption_scores.exact_match('a bag', ['a bag bag']) == 0


@pytest.mark.parametrize('prediction,references,expected', [
    # Shared: 'bag'. P = 1/3, R = 1/2, F1 = 2 (1/6) / (5/6) = 0.4.
    ('a red bag', ['the bag'], 0.4),
    # The best reference counts.
    ('a red bag', ['the bag', 'A red bag!'], 1.),
    # A multiset: one 'bag' of three is shared. P = 1/3, R = 1/2.
    ('bag bag bag', ['a bag'], 0.4),
    # Articles count: 'bag' shared, P = R = 1/2.
    ('a bag', ['the bag'], 0.5),
    ('a bag', ['the shoe'], 0.),
    # Empty after normalizing: 1 if both are, else 0.
    ('...', ['!'], 1.),
    ('', ['a bag'], 0.),
    ('a bag', [''], 0.),
])
def test_token_f1(prediction, references, expected):
  assert caption_scores.token_f1(prediction, references) == pytest.approx(
      expected, rel=1e-12)


def test_cider_d_matches_pycocoevalcap():
  """8 images: a prediction equal to a reference, repeated words, no
  overlap, one far longer than its references, 2 to 5 references each."""
  with open(os.path.join(helpers.DATA, 'cider_golden.json')) as f:
    golden = json.load(f)
  score, scores = caption_scores.cider_d(golden['predictions'],
                                         golden['references'])
  assert scores.shape == (8,)
  np.testing.assert_allclose(scores, golden['scores'], rtol=1e-6)
  assert score == pytest.approx(golden['corpus_score'], rel=1e-6)
  assert golden['scores'][2] == 0 and 0 < golden['scores'][3] < 0.1


def test_cider_d_by_hand():
  """Two images: A, reference 'a cat', prediction 'a cat cat'; B, reference
  and prediction 'a dog'.

  idf(g) = log(images) - log(max(1, df(g))) with images = 2; write
  L = log 2. 'a' is in both reference sets: idf 0. 'cat', 'dog', 'a cat',
  'a dog' are in one: idf L; 'cat cat' and 'a cat cat' in none: idf L too.

  B: per n, the prediction's vector is the reference's, so the cosine is 1
  for n = 1, 2; there are no 3- or 4-grams, so 0 for n = 3, 4. Equal
  lengths: no penalty. 10 * (1 + 1 + 0 + 0) / 4 = 5.

  A: n = 1: candidate (a: 0, cat: 2L), reference (a: 0, cat: L); clipped
  numerator min(2L, L) L = L^2, norms 2L and L: 1/2. n = 2: candidate
  (a cat: L, cat cat: L), reference (a cat: L): L^2 / (sqrt(2) L L) =
  1/sqrt(2). n = 3: the reference has none: 0. Lengths 3 and 2:
  penalty exp(-1 / (2 * 6^2)) = exp(-1/72).
  """
  penalty = math.exp(-1 / 72)
  a = 10 * penalty * (1 / 2 + 1 / math.sqrt(2)) / 4
  score, scores = caption_scores.cider_d(['a cat cat', 'A dog.'],
                                         [['a cat'], ['a dog']])
  np.testing.assert_allclose(scores, [a, 5.], rtol=1e-12)
  assert score == pytest.approx((a + 5) / 2, rel=1e-12)
  # The case tells the clipping and the length penalty: without either, A
  # would score otherwise.
  unclipped = 10 * penalty * (1 + 1 / math.sqrt(2)) / 4
  unpenalized = 10 * (1 / 2 + 1 / math.sqrt(2)) / 4
  assert abs(unclipped - a) > 1 and abs(unpenalized - a) > 0.04


def test_cider_d_needs_a_corpus():
  """Alone, an image's n-grams all have idf log 1 - log 1 = 0; with an
  unrelated second image the same prediction scores."""
  assert caption_scores.cider_d(['a dog'], [['a dog']])[0] == 0
  assert caption_scores.cider_d(['a dog', 'x'], [['a dog'], ['a cat']])[
      1][0] == pytest.approx(5, rel=1e-12)


def test_cider_d_averages_references():
  """Adding a reference with nothing in common halves the score."""
  corpus = ['a dog', 'a cat'], [['a dog'], ['a cat']]
  _, one = caption_scores.cider_d(*corpus)
  _, two = caption_scores.cider_d(corpus[0], [['a dog', 'zebra'], ['a cat']])
  assert two[0] == pytest.approx(one[0] / 2, rel=1e-12)


@pytest.mark.parametrize('predictions,references,match', [
    (['a dog'], [['a dog'], ['a cat']], '1 predictions but 2 lists'),
    (['a dog', 'a cat'], [['a dog'], []], r'references\[1\]: expected a '
     'non-empty list'),
    (['a dog'], ['a dog'], r'references\[0\]: expected a non-empty list'),
    ([], [], 'No predictions'),
])
def test_cider_d_refuses(predictions, references, match):
  with pytest.raises(ValueError, match=match):
    caption_scores.cider_d(predictions, references)


@pytest.mark.parametrize('score', [caption_scores.exact_match,
                                   caption_scores.token_f1])
def test_scores_refuse_no_references(score):
  with pytest.raises(ValueError, match='expected a non-empty list'):
    score('a dog', [])
  with pytest.raises(ValueError, match='expected a non-empty list'):
    score('a dog', 'a dog')


def test_imports_neither_jax_nor_tensorflow():
  """The scores run where predictions are decoded: standard library and
  numpy only."""
  tree = ast.parse(open(caption_scores.__file__).read())
  imported = {a.name.split('.')[0] for node in ast.walk(tree)
              if isinstance(node, (ast.Import, ast.ImportFrom))
              for a in (node.names if isinstance(node, ast.Import) else
                        [ast.alias(node.module)])}
  assert imported <= {'collections', 'string', 'numpy'}, imported
