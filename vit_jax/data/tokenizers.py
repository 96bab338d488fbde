"""Text tokenizers of the LiT towers, as the original's `preprocess.py`.

  'bert': WordPiece, lower-cased and accents stripped, with the checkpoint's
    vocabulary file (one token a line): [CLS] first, then up to max_len - 1
    word pieces, padded with 0 (BertModel masks 0 as padding).
  'sentencepiece': the checkpoint's SentencePiece model: pieces and </s>, cut
    to max_len - 1 and padded with </s>, so the last token is always </s>
    (TextTransformer reads the last token).

  'clip': a transformers CLIP folder's `tokenizer.json` (byte-level BPE):
    start and end tokens, cut keeping the end token, padded with the pad
    token of `tokenizer_config.json` beside it (else the end token).
  'siglip': a transformers SigLIP folder's `spiece.model`, on text
    canonicalized as its SiglipTokenizer does (lower case, no punctuation,
    whitespace collapsed), then as 'sentencepiece', padded with the pad
    token of `tokenizer_config.json` beside it (else </s>).
  'gemma': Gemma's SentencePiece `tokenizer.model` (a transformers SigLIP 2
    folder's), as SigLIP 2 reads text (big_vision's `lower|tok(model=
    "gemma", bos="no", eos="sticky")`, transformers' Siglip2Tokenizer):
    lower-cased, no <bos>, pieces and <eos> cut to max_len keeping <eos>
    last, padded with <pad>.

All run offline on the CPU: HuggingFace `tokenizers` (WordPiece, BPE) and
`sentencepiece`, the libraries' own implementations of the algorithms.
The original's tf.data forms follow them: each tokenizer's `preprocess_tf`,
`PreprocessImages` and `get_pp`.
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

import dataclasses
import io
import json
import re
import string
from typing import Iterable, Sequence

from etils import epath
from etils import epy
import numpy as np
import sentencepiece as spm
from tokenizers import Tokenizer
from tokenizers import models as tok_models
from tokenizers import normalizers
from tokenizers import pre_tokenizers
with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

TOKENIZERS = ('bert', 'sentencepiece', 'clip', 'siglip', 'gemma')


def _read(path, mode='r'):
  """A local or remote (gs://...) file's content, through etils.epath."""
  path = epath.Path(path)
  if not path.exists():
    raise FileNotFoundError(f'Vocabulary file not found: {path}')
  return path.read_bytes() if 'b' in mode else path.read_text()


def _check_texts(texts) -> Sequence[str]:
  if isinstance(texts, str):
    raise TypeError('Tokenizers take a sequence of texts; wrap one text in a '
                    'list.')
  return [t.decode() if isinstance(t, bytes) else str(t) for t in texts]


def _pad_token(vocab_path, default: str) -> str:
  """The pad token of the `tokenizer_config.json` beside `vocab_path`
  (transformers' folder), else `default`."""
  path = epath.Path(vocab_path).parent / 'tokenizer_config.json'
  pad = json.loads(path.read_text()).get('pad_token') if path.exists() else None
  if isinstance(pad, dict):  # an AddedToken, as older files have it
    pad = pad.get('content')
  return pad or default


class _GraphForm:
  """`preprocess_tf(text)`: one text's tokens inside a tf.data pipeline."""

  max_len: int

  def preprocess_tf(self, text):
    tokens = tf.numpy_function(lambda t: self([t])[0], [text], tf.int32)
    return tf.ensure_shape(tokens, [self.max_len])


class BertTokenizer(_GraphForm):
  """BERT WordPiece with [CLS] prepended, to (n, max_len) int32."""

  def __init__(self, vocab_path: str, max_len: int):
    vocab = _read(vocab_path).split('\n')
    if vocab and not vocab[-1]:
      vocab.pop()  # the file's final newline
    for special in ('[CLS]', '[UNK]'):
      if special not in vocab:
        raise ValueError(f'{vocab_path} is not a BERT vocabulary: no '
                         f'{special} token.')
    self.max_len = max_len
    self.cls_token = vocab.index('[CLS]')
    self.vocab_size = len(vocab)
    ids = {token: i for i, token in reversed(list(enumerate(vocab)))}
    self._tokenizer = Tokenizer(tok_models.WordPiece(
        ids, unk_token='[UNK]', max_input_chars_per_word=200))
    self._tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    self._tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

  def __call__(self, texts: Iterable[str]) -> np.ndarray:
    encoded = self._tokenizer.encode_batch(_check_texts(texts),
                                           add_special_tokens=False)
    out = np.zeros((len(encoded), self.max_len), np.int32)
    out[:, 0] = self.cls_token
    for row, e in zip(out, encoded):
      pieces = e.ids[:self.max_len - 1]
      row[1:1 + len(pieces)] = pieces
    return out


class SentencepieceTokenizer(_GraphForm):
  """SentencePiece with a sticky </s> last, to (n, max_len) int32."""

  def __init__(self, vocab_path: str, max_len: int):
    try:
      self._sp = spm.SentencePieceProcessor(
          model_proto=_read(vocab_path, 'rb'))
    except RuntimeError as e:
      raise ValueError(f'{vocab_path} is not a SentencePiece model: '
                       f'{e}') from e
    self.max_len = max_len
    self.eos_token = self._sp.piece_to_id('</s>')
    self.bos_token = self._sp.piece_to_id('<s>')  # a captioner's first input
    self.pad_token = self.eos_token
    self.vocab_size = self._sp.get_piece_size()

  def lengths(self, texts) -> list:
    """Each text's number of pieces, uncut and without </s>."""
    return [len(ids) for ids in self._sp.encode(_check_texts(texts))]

  def decode(self, rows) -> list:
    """The texts of token rows, each cut at its first </s>."""
    out = []
    for row in np.asarray(rows).tolist():
      end = row.index(self.eos_token) if self.eos_token in row else len(row)
      out.append(self._sp.decode(row[:end]))
    return out

  def __call__(self, texts: Iterable[str]) -> np.ndarray:
    encoded = self._sp.encode(_check_texts(texts))
    out = np.full((len(encoded), self.max_len), self.pad_token, np.int32)
    for row, ids in zip(out, encoded):
      ids = ids[:self.max_len - 1] + [self.eos_token]
      row[:len(ids)] = ids
    return out


class SiglipTokenizer(SentencepieceTokenizer):
  """SentencePiece on canonical text, as transformers' SiglipTokenizer."""

  def __init__(self, vocab_path: str, max_len: int):
    super().__init__(vocab_path, max_len)
    pad = _pad_token(vocab_path, '</s>')
    self.pad_token = self._sp.piece_to_id(pad)
    if self._sp.id_to_piece(self.pad_token) != pad:
      raise ValueError(f'The pad token {pad!r} is not in {vocab_path}.')

  def __call__(self, texts: Iterable[str]) -> np.ndarray:
    return super().__call__([_canonical(t) for t in _check_texts(texts)])


class GemmaTokenizer(SentencepieceTokenizer):
  """Gemma's SentencePiece on lower-cased text, as SigLIP 2 (module
  docstring): its own <eos> and <pad> pieces."""

  def __init__(self, vocab_path: str, max_len: int):
    super().__init__(vocab_path, max_len)
    self.eos_token, self.pad_token = self._sp.eos_id(), self._sp.pad_id()
    self.bos_token = self._sp.bos_id()
    if min(self.eos_token, self.pad_token) < 0:
      raise ValueError(f'{vocab_path} has no <eos> or no <pad> piece: it is '
                       "not Gemma's tokenizer.")

  def __call__(self, texts: Iterable[str]) -> np.ndarray:
    return super().__call__([t.lower() for t in _check_texts(texts)])


def _canonical(text: str) -> str:
  """`text` as SiglipTokenizer reads it (big_vision's canonical prompts)."""
  text = text.lower().translate(str.maketrans('', '', string.punctuation))
  return re.sub(r'\s+', ' ', text).strip()


class ClipTokenizer(_GraphForm):
  """A transformers `tokenizer.json` with the special tokens it adds (CLIP's
  start and end), cut keeping the last, padded, to (n, max_len) int32."""

  def __init__(self, vocab_path: str, max_len: int):
    try:
      self._tokenizer = Tokenizer.from_str(_read(vocab_path))
    except Exception as e:  # pylint: disable=broad-except
      # (the library raises plain Exceptions)
      raise ValueError(f'{vocab_path} is not a tokenizer.json: {e}') from e
    pad = _pad_token(vocab_path, '<|endoftext|>')
    pad_id = self._tokenizer.token_to_id(pad)
    if pad_id is None:
      raise ValueError(f'The pad token {pad!r} is not in {vocab_path}.')
    self.max_len = max_len
    self.vocab_size = self._tokenizer.get_vocab_size()
    # The library's own truncation leaves room for the special tokens, as
    # transformers' truncation=True does.
    self._tokenizer.enable_truncation(max_len)
    self._tokenizer.enable_padding(length=max_len, pad_id=pad_id,
                                   pad_token=pad)

  def __call__(self, texts: Iterable[str]) -> np.ndarray:
    encoded = self._tokenizer.encode_batch(_check_texts(texts))
    return np.array([e.ids for e in encoded], np.int32).reshape(
        -1, self.max_len)


_CLASSES = dict(zip(TOKENIZERS, (BertTokenizer, SentencepieceTokenizer,
                                 ClipTokenizer, SiglipTokenizer,
                                 GemmaTokenizer)))


def tokenizer_class(name: str):
  """The tokenizer class `name` (one of TOKENIZERS); the original's
  `preprocess.get_tokenizer`."""
  if name not in TOKENIZERS:
    raise ValueError(f'Unknown tokenizer {name!r}; expected one of '
                     f'{TOKENIZERS}.')
  return _CLASSES[name]


def get_tokenizer(name: str, vocab_path: str, max_len: int):
  """The tokenizer `name` (one of TOKENIZERS) of a vocabulary file: 'clip''s
  is a tokenizer.json, 'siglip''s a spiece.model, 'gemma''s a
  tokenizer.model."""
  cls = tokenizer_class(name)
  if max_len < 2:
    raise ValueError(f'max_len={max_len} leaves no room for a token.')
  return cls(vocab_path, max_len)


# A transformers folder's tokenizer file -> the tokenizer that reads it;
# SentencePiece's first: SigLIP 2 folders hold a tokenizer.json too.
_FOLDER_FILES = {'spiece.model': 'siglip', 'tokenizer.model': 'gemma',
                 'tokenizer.json': 'clip'}


def tokenizer_from_folder(folder: str, max_len: int):
  """The tokenizer of a transformers CLIP, SigLIP or SigLIP 2 folder (its
  `save_pretrained` or hub download)."""
  for filename, name in _FOLDER_FILES.items():
    path = epath.Path(folder) / filename
    if path.exists():
      return get_tokenizer(name, str(path), max_len)
  raise ValueError(f'{folder} holds no tokenizer that vit_jax reads: '
                   f'expected one of {tuple(_FOLDER_FILES)}.')


@dataclasses.dataclass(frozen=True)
class PreprocessImages:
  """LiT's images: resized to `size` x `size` (bilinear; with `crop`, the
  short side to `size`, then a central crop), values in [-1, 1]; as the
  original's. `preprocess_tf` takes one uint8 image in a tf.data pipeline,
  a call a list of images (numpy)."""
  size: int
  crop: bool = False

  def preprocess_tf(self, image):
    if self.crop:
      shape = tf.cast(tf.shape(image)[:2], tf.float32)
      hw = tf.cast(tf.round(shape * self.size / tf.reduce_min(shape)),
                   tf.int32)
      image = tf.image.resize(image, hw, method='bilinear')
      top, left = (hw[0] - self.size) // 2, (hw[1] - self.size) // 2
      image = image[top:top + self.size, left:left + self.size]
    else:
      image = tf.image.resize(image, [self.size, self.size], method='bilinear')
    # Back to uint8 first, as the original: its values, rounding included.
    return tf.cast(tf.cast(image, tf.uint8), tf.float32) / 255 * 2 - 1

  def __call__(self, images) -> np.ndarray:
    return np.stack([self.preprocess_tf(tf.constant(image)).numpy()
                     for image in images])


def get_pp(*, tokenizer_name, vocab_path, max_len, size, crop=False):
  """The original's tf.data map function: feature 'image' resized
  (`PreprocessImages`), feature 'text' tokenized into 'tokens'."""
  tokenizer = get_tokenizer(tokenizer_name, vocab_path, max_len)
  images = PreprocessImages(size=size, crop=crop)

  def pp(features):
    features = dict(features)
    if 'image' in features:
      features['image'] = images.preprocess_tf(features['image'])
    if 'text' in features:
      features['tokens'] = tokenizer.preprocess_tf(features['text'])
    return features

  return pp


def train_sentencepiece(texts: Iterable[str], path: str,
                        vocab_size: int) -> str:
  """Trains a SentencePiece model (unigram) on `texts`, writes it to `path`.

  Pieces get ids from 3 on (unk 0, <s> 1, </s> 2, as the published models).
  For small experiments whose captions have no published vocabulary.
  """
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(list(texts)), model_writer=model,
      vocab_size=vocab_size, model_type='unigram', character_coverage=1.0,
      hard_vocab_limit=False, minloglevel=2, num_threads=1)
  epath.Path(path).write_bytes(model.getvalue())
  return path
