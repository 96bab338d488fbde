"""Zero-shot classification with a LiT model: classes named, never trained.

Each class's text embedding is the mean over prompt templates ('a photo of a
{}.') of the normalized embeddings of the filled-in texts, normalized again
(as CLIP and LiT); an image's class is the nearest (largest dot product).
`trainer='zeroshot'` reports the accuracy on a test split (tfds or folder).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import sharding
from vit_jax import storage
from vit_jax import tokenizers
from vit_jax import train

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
  """Masked counts of correct nearest-class predictions."""
  predicted, _ = classify(model, params, batch['image'], classes)
  correct = predicted == jnp.argmax(batch['label'], -1)
  return {'correct': jnp.sum(correct * batch['mask']),
          'count': jnp.sum(batch['mask'])}


def eval_config(config):
  """`config` with the zero-shot test data as its dataset: `zeroshot.dataset`
  and `zeroshot.split`, by default the training dataset's test split."""
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.dataset = config.zeroshot.get('dataset') or config.dataset
    split = config.zeroshot.get('split') or config.pp.test
    config.pp.train = config.pp.test = split  # no training split needed
  return config


def class_names(config, info):
  """`config.zeroshot.class_names`, else the dataset's label names."""
  names = list(config.zeroshot.class_names or ())
  if not names:
    names = list(info.builder.info.features['label'].names)
    if all(n.isdigit() for n in names):
      raise ValueError(f'{config.dataset!r} has no class names (labels '
                       f'{names[:3]}...); set config.zeroshot.class_names.')
  if len(names) != info.num_classes:
    raise ValueError(f'{len(names)} class names for the {info.num_classes} '
                     'classes of the dataset.')
  return [n.replace('_', ' ') for n in names]


def evaluate(model, params, classes, info, config, mesh, step=None):
  """Zero-shot accuracy over every test example.

  `step` is a jitted `eval_step` of `model` to reuse (one compilation).
  """
  batches = input_pipeline.eval_batches(
      info, config,
      batch_size=input_pipeline.host_batch_size(config.batch_eval))
  step = step or jax.jit(functools.partial(eval_step, model=model))
  totals = None
  for batch in train._global_batches(batches, mesh, config.batch_eval):  # pylint: disable=protected-access
    out = step(params, batch, classes)
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
  totals = jax.device_get(totals)
  count = float(totals['count'])
  return {'zeroshot_accuracy': float(totals['correct']) / count,
          'count': int(count)}


def make_evaluator(model, tokenizer, names, info, config, mesh):
  """params -> zero-shot accuracy on the test split, compiled once for every
  evaluation of a run."""
  embed = text_embedder(model)
  step = jax.jit(functools.partial(eval_step, model=model))
  templates = tuple(config.zeroshot.templates)

  def run(params):
    classes = class_embeddings(model, params, tokenizer, names, templates,
                               embed=embed)
    return evaluate(model, params, classes, info, config, mesh, step=step)
  return run


def lit_checkpoint_path(config, workdir):
  """`pretrained_path`, `{pretrained_dir}/{model_name}.npz`, or the workdir's
  exported `{model_name}.npz` (a finished `trainer='lit'` run)."""
  path = train.pretrained_path(config) or storage.join(
      workdir, f'{config.model_name}.npz')
  try:
    storage.local_copy(path)  # fetched once if remote
  except FileNotFoundError:
    raise FileNotFoundError(
        f'No LiT checkpoint at {path}: set pretrained_path, or give the '
        "workdir of a finished trainer='lit' run.") from None
  return path


def vocab_path(config, workdir):
  """`config.lit.vocab_path`, else the vocabulary a LiT run fitted."""
  return config.lit.vocab_path or storage.join(workdir, 'vocab.model')


def zeroshot(config, workdir):
  """`trainer='zeroshot'`: a LiT checkpoint's zero-shot test accuracy."""
  from vit_jax import train_lit  # pylint: disable=g-import-not-at-top
  mesh = sharding.make_mesh(config.mesh)
  train_lit.validate_lit_config(config, mesh.shape['data'])
  config = eval_config(config)
  info = input_pipeline.get_dataset_info(input_pipeline.get_builder(config),
                                         config)
  names = class_names(config, info)
  model, path = train_lit.make_lit_model(config), lit_checkpoint_path(
      config, workdir)
  tokenizer = tokenizers.get_tokenizer(
      config.model.pp.tokenizer_name, vocab_path(config, workdir),
      config.model.pp.max_len)
  abstract = train_lit.abstract_params(config, model)
  params = checkpoint.inspect_params(
      params=checkpoint.load(path), expected=abstract,
      source=f'Checkpoint {path}')
  params = jax.device_put(params, jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))
  result = make_evaluator(model, tokenizer, names, info, config,
                          mesh)(params)
  print(f'{path}: zero-shot accuracy {result["zeroshot_accuracy"]:.4f} '
        f'({result["count"]} examples, {len(names)} classes)', flush=True)
  train.write_results(config, workdir, result, checkpoint=path)
  return result
