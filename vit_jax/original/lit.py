"""The original's conveniences of `LitModel`: its published files and its
text and image pipelines, by `model_name`. The model itself
(`vit_jax/models/lit.py`) reads no files and builds no pipelines."""

import os

from etils import epath
from etils import epy

from vit_jax.checkpoints import files
from vit_jax.models import lit

with epy.lazy_imports():  # TensorFlow loads when a pipeline is asked for
  from vit_jax.data import tokenizers  # pylint: disable=g-import-not-at-top

def load_variables(self, path=None, cache=True):
  """{'params': ...} of `path`, else of `{model_name}.npz` here, else of
  the published file (copied here first with `cache`)."""
  if path is None:
    path = local = f'{self.model_name}.npz'
    if not os.path.exists(local):
      path = f'{lit.BASE_PATH}/{self.model_name}.npz'
      if cache:
        epath.Path(path).copy(local)
        path = local
  return {'params': files.load(path)}


def vocab_path(self) -> str:
  ext = {'bert': 'txt', 'sentencepiece': 'model'}[self.pp.tokenizer_name]
  return f'{lit.BASE_PATH}/{self.model_name}.{ext}'


def get_tokenizer(self):
  return tokenizers.get_tokenizer(self.pp.tokenizer_name, self.vocab_path,
                                  self.pp.max_len)


def get_image_preprocessing(self, crop=False):
  return tokenizers.PreprocessImages(size=self.pp.size, crop=crop)


def get_pp(self, crop=False):
  return tokenizers.get_pp(
      tokenizer_name=self.pp.tokenizer_name, vocab_path=self.vocab_path,
      max_len=self.pp.max_len, size=self.pp.size, crop=crop)


def install() -> None:
  """Gives `lit.LitModel` the original's methods and `vocab_path`."""
  for method in (load_variables, get_tokenizer, get_image_preprocessing,
                 get_pp):
    setattr(lit.LitModel, method.__name__, method)
  lit.LitModel.vocab_path = property(vocab_path)
