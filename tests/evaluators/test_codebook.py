"""The codebook evaluator's figures (`evaluators/codebook.py`); a tokenizer
run checks them end to end (tests/tasks/test_beit.py)."""

import numpy as np
import pytest
import scipy.stats

from vit_jax.evaluators import codebook as codebook_eval


def test_codebook_usage_and_perplexity():
  counts = np.array([5, 0, 3, 2, 0])
  share, perplexity = codebook_eval.usage(counts)
  assert share == pytest.approx(3 / 5)
  p = np.array([5, 3, 2]) / 10
  assert perplexity == pytest.approx(np.exp(scipy.stats.entropy(p)))
