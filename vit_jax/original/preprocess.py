"""The original's `vit_jax.preprocess`: LiT's tokenizers and its text and
image pipelines (`vit_jax.data.tokenizers`), beside the eval transform of
converted checkpoints and its record (`vit_jax.convert.transform`)."""

# pylint: disable=unused-import,wildcard-import
from vit_jax.convert.transform import *
from vit_jax.data.tokenizers import BertTokenizer
from vit_jax.data.tokenizers import PreprocessImages
from vit_jax.data.tokenizers import SentencepieceTokenizer
from vit_jax.data.tokenizers import get_pp
from vit_jax.data.tokenizers import tokenizer_class as get_tokenizer
