"""Tokenizers on tiny vocabularies built here, expected ids by hand; and
on transformers' tiny CLIP and SigLIP tokenizers, against their own ids."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from vit_jax.data import tokenizers

VOCAB = ['[PAD]', '[UNK]', '[CLS]', '[SEP]', 'a', 'photo', 'of', 'dog',
         '##s', 'cat', '.', 'cafe']


@pytest.fixture
def vocab_path(tmp_path):
  path = tmp_path / 'vocab.txt'
  path.write_text('\n'.join(VOCAB) + '\n')
  return str(path)


def test_bert_wordpiece_lowercase_cls_and_padding(vocab_path):
  tok = tokenizers.get_tokenizer('bert', vocab_path, max_len=8)
  got = tok(['A photo of DOGS.', 'Café cat', 'a zebra'])
  # [CLS] a photo of dog ##s . [PAD]; accents stripped; unknown -> [UNK].
  np.testing.assert_array_equal(got, [[2, 4, 5, 6, 7, 8, 10, 0],
                                      [2, 11, 9, 0, 0, 0, 0, 0],
                                      [2, 4, 1, 0, 0, 0, 0, 0]])
  assert got.dtype == np.int32


def test_bert_truncates_after_cls(vocab_path):
  tok = tokenizers.get_tokenizer('bert', vocab_path, max_len=4)
  np.testing.assert_array_equal(tok(['a photo of a cat']), [[2, 4, 5, 6]])


def test_bert_rejects_a_non_bert_vocabulary(tmp_path):
  path = tmp_path / 'v.txt'
  path.write_text('a\nb\n')
  with pytest.raises(ValueError, match=r'no \[CLS\]'):
    tokenizers.get_tokenizer('bert', str(path), 8)


CORPUS = ['a photo of a dog', 'a photo of a cat', 'a drawing of a dog',
          'a cat and a dog', 'the photo of the cat'] * 20


@pytest.fixture
def spm_path(tmp_path):
  return tokenizers.train_sentencepiece(CORPUS, str(tmp_path / 'sp.model'),
                                        vocab_size=24)


def test_sentencepiece_sticky_eos(spm_path):
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=spm_path)
  tok = tokenizers.get_tokenizer('sentencepiece', spm_path, max_len=32)
  eos = sp.piece_to_id('</s>')
  assert eos == tok.eos_token == 2
  got = tok(['a photo of a dog', 'a cat'])
  for row, text in zip(got, ['a photo of a dog', 'a cat']):
    n = int(np.argmax(row == eos))  # first </s>
    assert sp.decode(row[:n].tolist()) == text
    assert (row[n:] == eos).all()

  short = tokenizers.get_tokenizer('sentencepiece', spm_path, max_len=3)(
      ['a photo of a dog'])
  np.testing.assert_array_equal(short[0], got[0][:2].tolist() + [eos])


def test_unknown_tokenizer_and_missing_files(tmp_path, vocab_path):
  with pytest.raises(ValueError, match='Unknown tokenizer'):
    tokenizers.get_tokenizer('gpt2', vocab_path, 8)
  with pytest.raises(FileNotFoundError):
    tokenizers.get_tokenizer('sentencepiece', str(tmp_path / 'x.model'), 8)
  with pytest.raises(ValueError, match='not a SentencePiece model'):
    tokenizers.get_tokenizer('sentencepiece', vocab_path, 8)
  with pytest.raises(TypeError, match='sequence of texts'):
    tokenizers.get_tokenizer('bert', vocab_path, 8)('a dog')


# transformers' folders (scripts/make_transformers_golden.py) and the ids
# their own tokenizers gave the script's PROMPTS (max_length=16); each has a
# prompt cut to 16 tokens.
TRANSFORMERS = os.path.join(helpers.DATA, 'transformers')
PROMPTS = ['a photo of a Dog.', 'A PICTURE of a cat, sitting!', 'a bird']


@pytest.mark.parametrize('name,filename', [('clip', 'tokenizer.json'),
                                           ('siglip', 'spiece.model')])
def test_transformers_tokenizers_give_transformers_ids(name, filename):
  with np.load(os.path.join(helpers.DATA, 'transformers_golden.npz')) as g:
    want = g[f'{name}/input_ids']
  tok = tokenizers.get_tokenizer(
      name, os.path.join(TRANSFORMERS, name, filename), 16)
  got = tok(PROMPTS)
  assert got.dtype == np.int32
  np.testing.assert_array_equal(got, want)
  folder = tokenizers.tokenizer_from_folder(os.path.join(TRANSFORMERS, name),
                                            16)
  assert type(folder) is type(tok)  # pylint: disable=unidiomatic-typecheck
  graph = tf.data.Dataset.from_tensor_slices(PROMPTS).map(tok.preprocess_tf)
  np.testing.assert_array_equal(list(graph.as_numpy_iterator()), want)


# 'a bird' ends at `end`; both pad tokens are id 0.
@pytest.mark.parametrize('name,filename,pad,end', [
    ('clip', 'tokenizer.json', '!', 6), ('siglip', 'spiece.model', '<pad>', 7)])
def test_transformers_pad_token_from_tokenizer_config(tmp_path, name,
                                                      filename, pad, end):
  shutil.copy(os.path.join(TRANSFORMERS, name, filename), tmp_path)
  (tmp_path / 'tokenizer_config.json').write_text(json.dumps(
      {'pad_token': {'content': pad}}))
  got = tokenizers.tokenizer_from_folder(str(tmp_path), 16)(['a bird'])
  assert (got[0, end + 1:] == 0).all() and got[0, end] != 0


def test_folder_without_a_tokenizer(tmp_path):
  with pytest.raises(ValueError, match='no tokenizer'):
    tokenizers.tokenizer_from_folder(str(tmp_path), 16)
