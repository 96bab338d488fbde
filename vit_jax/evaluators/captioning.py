"""A captioner's evaluators (`models.captioning.Captioner`).

'captioning': captions of the test split, greedy (or by beam search),
  against its references: exact match, token F1 and CIDEr-D
  (`caption_scores`); a few samples are kept in the results.
'scoring': CapPa's scoring classifier. Each class's prompts (templates
  filled with its name) are scored by their log-likelihood under the model
  given the image, averaged over the templates; the best class is the
  prediction.

The references: a dataset's caption feature (`captioning.text_key`), else
the class captions of each example's class (`captioning.class_captions`).
"""

import functools

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np

from vit_jax.data import captions as caption_data
from vit_jax.evaluators import caption_scores
from vit_jax.evaluators import common
from vit_jax.evaluators import registry
from vit_jax.evaluators import zeroshot
from vit_jax.models import captioning
from vit_jax.models import decoding

DEFAULT_TEMPLATES = ('a {}', 'a photo of a {}')


def _host(x):
  """A global array's rows, on every process."""
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


@registry.register('captioning')
class Evaluator(common.Evaluator):
  """`type='captioning'`: settings `dataset`, `split`, `beam` (1: greedy),
  `samples` (captions kept); metrics `exact_match`, `token_f1`,
  `cider_d`, `count` and `samples`."""

  def __init__(self, name, settings, *, config, model, mesh, tokenizer,
               **_):
    super().__init__(name, settings)
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    self.settings = caption_data.settings(config)
    self.mesh, self.tokenizer = mesh, tokenizer
    self.samples = settings.get('samples', 8)
    self.example = functools.partial(
        caption_data.eval_example, text_key=self.settings.text_key,
        tokenizer=tokenizer)
    self.step = jax.jit(functools.partial(
        decoding.captions, model, bos=tokenizer.bos_token,
        eos=tokenizer.eos_token, max_len=tokenizer.max_len,
        beam=settings.get('beam', 1)))

  def references(self, batch):
    if self.settings.text_key:
      return [[r] for r in self.tokenizer.decode(_host(batch['reference']))]
    return [list(self.settings.class_captions[i])
            for i in _host(batch['label'])]

  def __call__(self, params):
    predicted, references = [], []
    for batch in common.batches(self.info, self.data, self.mesh,
                                example=self.example):
      real = _host(batch['mask']) > 0
      texts = self.tokenizer.decode(_host(self.step(params, batch['image'])))
      predicted += [t for t, r in zip(texts, real) if r]
      references += [r for r, k in zip(self.references(batch), real) if k]
    return {
        'exact_match': float(np.mean([caption_scores.exact_match(p, r) for
                                      p, r in zip(predicted, references)])),
        'token_f1': float(np.mean([caption_scores.token_f1(p, r) for
                                   p, r in zip(predicted, references)])),
        'cider_d': float(caption_scores.cider_d(predicted, references)[0]),
        'count': len(predicted),
        'samples': [{'caption': p, 'reference': r[0]} for p, r in
                    zip(predicted[:self.samples], references)]}

  def summary(self, metrics):
    return (f'captions: exact match {metrics["exact_match"]:.4f}, token F1 '
            f'{metrics["token_f1"]:.4f}, CIDEr-D {metrics["cider_d"]:.3f} '
            f'({metrics["count"]} examples)')


def class_scores(model, params, images, prompts, *, bos, eos, templates):
  """(batch, classes) mean log-likelihoods of each class's prompts
  (`prompts`: (classes * templates, L) tokens, class-major)."""
  memory = model.apply({'params': params}, images, method='encode')

  def score(prompt):
    targets = jnp.broadcast_to(prompt, (images.shape[0], prompt.shape[0]))
    logits = model.apply({'params': params}, memory,
                         captioning.shift_right(targets, bos),
                         method='logits')
    return captioning.log_likelihood(logits, targets, eos)

  scores = jax.lax.map(score, prompts)  # (prompts, batch)
  return scores.reshape(-1, templates, images.shape[0]).mean(1).T


def scoring_step(params, batch, prompts, *, model, bos, eos, templates):
  scores = class_scores(model, params, batch['image'], prompts, bos=bos,
                        eos=eos, templates=templates)
  correct = jnp.argmax(scores, -1) == jnp.argmax(batch['label'], -1)
  return {'scoring_accuracy': common.masked_average(correct, batch['mask'])}


@registry.register('scoring')
class ScoringEvaluator(common.Evaluator):
  """`type='scoring'`: settings `dataset`, `split`, `class_names`
  (default: the dataset's), `templates`; metrics `scoring_accuracy` and
  `count`."""

  def __init__(self, name, settings, *, config, model, mesh, tokenizer,
               **_):
    super().__init__(name, settings)
    templates = tuple(settings.get('templates') or DEFAULT_TEMPLATES)
    zeroshot.check_templates(templates)
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'))
    self.names = zeroshot.class_names(settings, self.info, self.data.dataset)
    self.mesh = mesh
    self.prompts = jnp.asarray(tokenizer(
        [t.format(n) for n in self.names for t in templates]))
    self.step = jax.jit(functools.partial(
        scoring_step, model=model, bos=tokenizer.bos_token,
        eos=tokenizer.eos_token, templates=len(templates)))

  def __call__(self, params):
    return common.masked_means(self.step, params, self.info, self.data,
                               self.mesh, self.prompts)

  def summary(self, metrics):
    return (f'scoring accuracy {metrics["scoring_accuracy"]:.4f} '
            f'({metrics["count"]} examples, {len(self.names)} classes)')

  def scalars(self, metrics):
    return {'scoring_accuracy': metrics['scoring_accuracy']}
