"""Zero-shot classification with a LiT model: classes named, never trained.

Each class's text embedding is the mean over prompt templates ('a photo of a
{}.') of the normalized embeddings of the filled-in texts, normalized again
(as CLIP and LiT); an image's class is the nearest (largest dot product).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.evaluators import common
from vit_jax.evaluators import registry

DEFAULT_TEMPLATES = ('a photo of a {}.', 'a {}.', 'a picture of a {}.')


def check_templates(templates):
  for template in templates:
    if '{}' not in template:
      raise ValueError(f'Prompt template {template!r} has no {{}} for the '
                       'class name.')


def text_embedder(model):
  """Jitted (params, tokens) -> normalized text embeddings."""
  return jax.jit(lambda params, tokens: model.apply({'params': params},
                                                    tokens=tokens)[1])


def class_embeddings(model, params, tokenizer, class_names,
                     templates=DEFAULT_TEMPLATES, batch=256, embed=None):
  """(classes, D) normalized means of the templates' text embeddings.

  `embed` is a `text_embedder(model)` to reuse (one compilation).
  """
  check_templates(templates)
  texts = [t.format(name) for name in class_names for t in templates]
  embed = embed or text_embedder(model)
  tokens = tokenizer(texts)
  ztxt = np.concatenate([embed(params, tokens[i:i + batch])
                         for i in range(0, len(tokens), batch)])
  z = ztxt.reshape(len(class_names), len(templates), -1).mean(1)
  return z / np.linalg.norm(z, axis=1, keepdims=True)


def classify(model, params, images, classes):
  """(predicted classes, similarities (n, classes)) of `images`."""
  zimg, _, _ = model.apply({'params': params}, images=images)
  sims = zimg @ classes.T
  return jnp.argmax(sims, axis=1), sims


def eval_step(params, batch, classes, *, model):
  """A masked clu average of correct nearest-class predictions."""
  predicted, _ = classify(model, params, batch['image'], classes)
  correct = predicted == jnp.argmax(batch['label'], -1)
  return {'zeroshot_accuracy': common.masked_average(correct, batch['mask'])}


def class_names(settings, info, dataset):
  """`settings.class_names`, else the dataset's label names."""
  names = list(settings.get('class_names') or ())
  if not names:
    names = list(info.builder.info.features['label'].names)
    if all(n.isdigit() for n in names):
      raise ValueError(f'{dataset!r} has no class names (labels '
                       f'{names[:3]}...); set class_names in its '
                       'config.evals entry.')
  if len(names) != info.num_classes:
    raise ValueError(f'{len(names)} class names for the {info.num_classes} '
                     'classes of the dataset.')
  return [n.replace('_', ' ') for n in names]


@registry.register('zeroshot')
class Evaluator(common.Evaluator):
  """`type='zeroshot'`: settings `dataset` and `split` (default: the run's
  dataset and `pp.test`), `label` (its `pp.label`, default the run's),
  `class_names` (default: the dataset's),
  `templates`; metrics `zeroshot_accuracy` and `count`. Compiles once for
  every evaluation of a run."""

  def __init__(self, name, settings, *, config, model, mesh, tokenizer,
               **_):
    super().__init__(name, settings)
    self.templates = tuple(settings.get('templates') or DEFAULT_TEMPLATES)
    check_templates(self.templates)
    self.info, self.data = common.split_data(
        config, settings.get('dataset'), settings.get('split'),
        settings.get('label'))
    self.names = class_names(settings, self.info, self.data.dataset)
    self.model, self.mesh, self.tokenizer = model, mesh, tokenizer
    self.embed = text_embedder(model)
    self.step = jax.jit(functools.partial(eval_step, model=model))

  def __call__(self, params):
    classes = class_embeddings(self.model, params, self.tokenizer, self.names,
                               self.templates, embed=self.embed)
    return common.masked_means(self.step, params, self.info, self.data,
                               self.mesh, classes)

  def summary(self, metrics):
    return (f'zero-shot accuracy {metrics["zeroshot_accuracy"]:.4f} '
            f'({metrics["count"]} examples, {len(self.names)} classes)')

  def scalars(self, metrics):
    return {'zeroshot_accuracy': metrics['zeroshot_accuracy']}
