"""The evaluators: built from `config.evals`, called with parameters,
returning metrics (`common.Evaluator`). Importing one registers it
(`registry.register`); adding one is its module here and one line below."""

# pylint: disable=unused-import
from vit_jax.evaluators import classification
from vit_jax.evaluators import fewshot
from vit_jax.evaluators import knn
from vit_jax.evaluators import zeroshot
from vit_jax.evaluators import navit
from vit_jax.evaluators import segmentation
from vit_jax.evaluators import captioning
from vit_jax.evaluators import codebook
from vit_jax.evaluators import video
from vit_jax.evaluators import locca
from vit_jax.evaluators import depth
