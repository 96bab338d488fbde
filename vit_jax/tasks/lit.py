"""Image-text training (`trainer='lit'`) with the softmax (CLIP) or sigmoid
(SigLIP) contrastive loss (`config.lit.loss`): LiT, a text tower matched to
a locked image tower, or with `config.lit.locked=False` both towers trained
(CLIP, SigLIP; from scratch unless given weights).

A locked image tower is locked three ways: its embeddings are computed
outside the gradient (under `stop_gradient`), the optimizer gives its
parameters no update and keeps no state for them (labels 'frozen'), and it
runs in inference mode (no dropout; a ViT has no batch statistics).

The sigmoid loss is chunked over the devices (`losses.sigmoid_loss_chunked`)
unless `config.siglip_chunked=False`, which all-gathers the embeddings.
"""

import functools


from etils import epath
from flax import traverse_util
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax import models
from vit_jax.data import captions as caption_data
from vit_jax.data import tokenizers
from vit_jax.models import bert as models_bert
from vit_jax.models import lit as models_lit
from vit_jax.run import optim
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import record
from vit_jax.checkpoints import storage
from vit_jax.tasks import base
from vit_jax.tasks import registry


# Captions of the batch among which the `retrieval` metric looks.
RETRIEVAL_ROWS = 256


def validate_lit_config(config):
  """Fails fast on settings a LiT run cannot use."""
  if config.lit.loss not in losses.CONTRASTIVE:
    raise ValueError(f'config.lit.loss={config.lit.loss!r}; expected one of '
                     f'{tuple(losses.CONTRASTIVE)}.')
  if config.lit.loss == 'sigmoid' and config.model.bias_init is None:
    raise ValueError("config.lit.loss='sigmoid' needs a learned bias: set "
                     'config.model.bias_init (SigLIP uses -10).')
  if config.model.pp.tokenizer_name not in tokenizers.TOKENIZERS:
    raise ValueError(f'config.model.pp.tokenizer_name='
                     f'{config.model.pp.tokenizer_name!r}; expected one of '
                     f'{tokenizers.TOKENIZERS}.')


def get_tokenizer(config, workdir, fit=True):
  """The configured vocabulary; without one, SentencePiece fitted to the
  training captions once (`fit`), in `{workdir}/vocab.model`."""
  path = config.lit.vocab_path or storage.join(workdir, 'vocab.model')
  if fit and not config.lit.vocab_path and not epath.Path(path).exists() and (
      config.model.pp.tokenizer_name != 'sentencepiece'):
    raise ValueError('Only a SentencePiece vocabulary can be fitted here; '
                     'set config.lit.vocab_path to the tokenizer file (a '
                     'BERT vocab.txt, CLIP tokenizer.json, SigLIP '
                     'spiece.model or SigLIP 2 tokenizer.model).')
  path = caption_data.vocabulary(config, workdir,
                                 config.model.text.get('vocab_size'), fit)
  tokenizer = tokenizers.get_tokenizer(config.model.pp.tokenizer_name, path,
                                       config.model.pp.max_len)
  text = config.model.text
  if config.model.text_model == 'bert':
    vocab = models_bert.BERT_CONFIGS[text.get('config', 'base')][4]
  else:
    vocab = text.get('vocab_size', models_lit.TextTransformer.vocab_size)
  if tokenizer.vocab_size > vocab:
    raise ValueError(f'The vocabulary {path} has {tokenizer.vocab_size} '
                     f'tokens, the text tower only {vocab} embeddings.')
  return tokenizer


def _example_inputs(config):
  """One image and one token sequence of the configured sizes."""
  return {'images': jnp.zeros((1, config.pp.crop, config.pp.crop, 3)),
          'tokens': jnp.zeros((1, config.model.pp.max_len), jnp.int32)}


def abstract_params(config, model):
  """The model's parameter shapes; raises if the towers' embeddings differ
  in width (`out_dim`)."""
  (zimg, ztxt, _), variables = jax.eval_shape(
      lambda: model.init_with_output(jax.random.key(0),
                                     **_example_inputs(config)))
  if zimg.shape[-1] != ztxt.shape[-1]:
    raise ValueError(
        f'The image tower embeds in {zimg.shape[-1]} dimensions, the text '
        f'tower in {ztxt.shape[-1]}: set config.model.out_dim (image, text) '
        'so that they agree.')
  return variables['params']


def frozen_image_tower(params):
  """Optimizer labels: the image tower frozen, the rest trained."""
  return traverse_util.path_aware_map(
      lambda key, _: optim.FROZEN if key[0] == 'img' else optim.TRAINED, params)


@registry.register
class Task(base.Task):
  """A LiT model, its locked tower, contrastive step and caption batches."""

  trainers = ('lit',)

  @classmethod
  def input_files(cls, config):
    vocab = [('lit.vocab_path', config.lit.get('vocab_path'))] if (
        'lit' in config and config.lit.get('vocab_path')) else []
    return super().input_files(config) + vocab

  @classmethod
  def evaluates(cls, config):
    cls = models.model_class(config.model_name, config.model)
    return cls is models_lit.LitModel

  def __init__(self, config, workdir, mesh, *, training=True):
    validate_lit_config(config)
    self.config, self.workdir, self.mesh = config, workdir, mesh
    self.locked = config.lit.get('locked', True)
    self.param_labels = frozen_image_tower if self.locked else None
    self.model = models_lit.LitModel(**config.model)
    abstract_params(config, self.model)  # checks the towers' widths agree
    if training:
      caption_data.check_class_captions(config)
    self.tokenizer = get_tokenizer(config, workdir, fit=training)

  def init_params(self, rng):
    return self.model.init(rng, **_example_inputs(self.config))['params']

  def check_initial_files(self):
    full = pretrained.pretrained_path(self.config)
    if self.locked and not (full or self.config.lit.image_init):
      raise ValueError('A locked image tower needs weights: set '
                       'config.lit.image_init (an image model .npz) or '
                       'pretrained_path (a LiT .npz), or train both towers '
                       '(config.lit.locked=False).')
    for path in (full, self.config.lit.image_init):
      if path:
        storage.local_copy(path)  # fails fast; fetched once if remote

  def initial_params(self, params):
    """All from `pretrained_path` (a LiT .npz), else the image tower from
    `config.lit.image_init` (an image model's or a LiT .npz), else None
    (both towers from scratch)."""
    full = pretrained.pretrained_path(self.config)
    if full:
      return loading.load_params(full, init_params=params,
                                    model_config={})
    if not self.config.lit.image_init:
      return None
    params['img'] = loading.load_params(
        self.config.lit.image_init, init_params=params['img'],
        model_config=self.config.model.image)
    return params

  def train_step(self, state, batch, *, rng):
    """One step on the text tower (and t, b) against locked image
    embeddings, or on both towers."""
    zimg = None
    if self.locked:
      zimg, _, _ = state.apply_fn({'params': state.params},
                                  images=batch['image'])
      zimg = jax.lax.stop_gradient(zimg)
    loss_fn = self.loss_fn()

    def compute_loss(params):
      images = None if self.locked else batch['image']
      z_image, ztxt, out = state.apply_fn(
          {'params': params}, images=images, tokens=batch['tokens'],
          train=True, train_image=not self.locked,
          rngs={'dropout': jax.random.fold_in(rng, state.step)})
      z_image = zimg if self.locked else z_image
      b = out['b'][0] if 'b' in out else None
      return loss_fn(z_image, ztxt, out['t'][0], b), (z_image, ztxt,
                                                      out['t'][0])

    (value, (z_image, ztxt, t)), grads = jax.value_and_grad(
        compute_loss, has_aux=True)(state.params)
    # Among the first captions only: all would form the batch x batch
    # similarities that the chunked loss avoids.
    metrics = {'loss': value, 'temperature': t,
               'retrieval': losses.retrieval_accuracy(
                   z_image[:RETRIEVAL_ROWS], ztxt[:RETRIEVAL_ROWS])}
    return state.apply_gradients(grads=grads), metrics

  def loss_fn(self):
    """(zimg, ztxt, t, b) -> the configured contrastive loss."""
    if self.config.lit.loss == 'sigmoid' and self.config.get(
        'siglip_chunked', True):
      return functools.partial(losses.sigmoid_loss_chunked, mesh=self.mesh)
    return losses.CONTRASTIVE[self.config.lit.loss]

  def batches(self, *, batch_size, rows, start_step):
    """This process's rows of the (image, tokens) batches."""
    return caption_data.train_iterator(self.config, self.tokenizer,
                                       batch_size=batch_size, rows=rows,
                                       start_step=start_step)

  def _vocabulary(self, workdir) -> epath.Path:
    return epath.Path(caption_data.vocabulary(
        self.config, workdir, self.config.model.text.get('vocab_size'),
        fit=False))

  def exported_records(self):
    """The model's, and its tokenizer's file beside it (`vocab`)."""
    return {'': {**record.of_run(self.config, self.exported_model),
                 'vocab': self._vocabulary(self.workdir).name}}

  def finish(self, params, workdir):
    """Beside the export: the tokenizer that its record names."""
    del params
    if jax.process_index():
      return
    source = self._vocabulary(workdir)
    npz = storage.join(workdir, f'{self.config.model_name}.npz')
    files.beside(npz, source.name).write_bytes(source.read_bytes())

  def checkpoint(self, path):
    """(model, params) of the LiT checkpoint at `path` (an .npz or a
    workdir)."""
    model, params, _ = loading.load_model(
        {}, path, model=self.model,
        abstract_params=abstract_params(self.config, self.model))
    return model, params
