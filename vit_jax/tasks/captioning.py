"""Captioning (`trainer='captioning'`): an image encoder and a text decoder
(`models.captioning.Captioner`), by CapPa's cross-attention or LLaVA's
projector and prefix LM (`config.captioning.connector`).

The encoder is `pretrained_path`'s (any checkpoint a preset loads, or the
ViT inside DINO, MAE, LiT), else `config.model` fresh. What trains is
`config.captioning.trained`:
  'all': encoder and decoder (CapPa from scratch);
  'decoder': projector and LM, the encoder frozen (LLaVA's second stage);
  'projector': the projector alone, the LM from `decoder_init` (LLaVA's
    first stage).
A frozen encoder is an argument of the jitted step, never updated and
without optimizer state (as a teacher). The loss is the tokens'
cross-entropy; with probability `masked_pred_prob` an example is trained by
parallel prediction instead of teacher forcing (CapPa).

The export is the encoder in the published layout (`{model_name}.npz`) and
beside it the decoder (`.decoder.npz`), the vocabulary (`.vocab.model`)
and what rebuilds the captioner (`.captioner.json`): `load_captioner`.
"""

import dataclasses
import json

from etils import epath
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.checkpoints import record
from vit_jax.checkpoints import storage
from vit_jax.data import captions as caption_data
from vit_jax.data import tiling
from vit_jax.data import tokenizers
from vit_jax.models import backbone
from vit_jax.models import captioning
from vit_jax.models import fusion
from vit_jax.platform import sharding
from vit_jax.run import optim
from vit_jax.tasks import base
from vit_jax.tasks import encoders
from vit_jax.tasks import registry

TRAINED = ('all', 'decoder', 'projector')
# Tokenizers with the <s> and </s> that a decoder starts and ends with.
TOKENIZERS = ('sentencepiece', 'siglip')


def check_settings(config):
  """Fails fast on `config.captioning` settings that cannot run."""
  s = config.get('captioning')
  if s is None:
    raise ValueError("trainer='captioning' needs config.captioning.")
  if s.connector not in captioning.CONNECTORS:
    raise ValueError(f'config.captioning.connector={s.connector!r}; expected '
                     f'one of {captioning.CONNECTORS}.')
  if s.trained not in TRAINED:
    raise ValueError(f'config.captioning.trained={s.trained!r}; expected one '
                     f'of {TRAINED}.')
  if not 0 <= s.masked_pred_prob <= 1:
    raise ValueError(f'config.captioning.masked_pred_prob='
                     f'{s.masked_pred_prob}: a probability, in [0, 1].')
  if s.masked_pred_prob and s.connector in captioning.PREFIX_LM:
    raise ValueError("Parallel prediction (masked_pred_prob) is CapPa's: set "
                     f"it to 0 with connector={s.connector!r}.")
  if s.trained == 'projector' and (s.connector not in captioning.PREFIX_LM
                                   or not s.decoder_init):
    raise ValueError("trained='projector' trains LLaVA's projector alone: it "
                     f"needs a connector of {captioning.PREFIX_LM} and a "
                     "decoder_init (a captioner's .decoder.npz).")
  if config.pp.get('tiles') and s.connector == 'cross_attention':
    raise ValueError('config.pp.tiles (InternVL\'s tiles) feed a prefix LM: '
                     f'set config.captioning.connector to one of '
                     f'{captioning.PREFIX_LM}.')
  if s.tokenizer not in TOKENIZERS:
    raise ValueError(f'config.captioning.tokenizer={s.tokenizer!r}; a '
                     f'captioner needs one of {TOKENIZERS} (with <s>, </s>).')
  check_fusion(config)


def check_fusion(config):
  """Fails fast on `config.captioning.encoders` that cannot be fused."""
  s = config.captioning
  if not s.get('encoders'):
    return
  if s.trained == 'all':
    raise ValueError('config.captioning.encoders are frozen (Prismatic): set '
                     "config.captioning.trained to 'decoder' or 'projector'.")
  if config.pp.get('mean') is not None or config.pp.get('std') is not None:
    raise ValueError('config.captioning.encoders normalize their own inputs '
                     '(each entry\'s mean and std): leave config.pp.mean and '
                     'std unset.')
  for i, e in enumerate(s.encoders):
    missing = {'path', 'size'} - set(e)
    if missing:
      raise ValueError(f'config.captioning.encoders[{i}] lacks '
                       f'{sorted(missing)}.')


def get_tokenizer(config, workdir):
  """`vocab_path`'s tokenizer, else SentencePiece fitted once to the
  training captions in `{workdir}/vocab.model`."""
  s = config.captioning
  path = caption_data.vocabulary(config, workdir, s.vocab_size)
  return tokenizers.get_tokenizer(s.tokenizer, path, s.max_len)


def check_lengths(config, tokenizer):
  """Raises if the tokenizer cuts a class caption (and its </s>)."""
  texts = [c for cs in config.captioning.class_captions or () for c in cs]
  if config.captioning.text_key or not texts:
    return  # a dataset's captions are many: not read here
  longest = max(tokenizer.lengths(texts)) + 1
  if longest > tokenizer.max_len:
    raise ValueError(f'config.captioning.max_len={tokenizer.max_len} cuts '
                     f'captions of {longest} tokens with their </s>: set it '
                     f'to at least {longest}.')


def make_captioner(encoder, settings, vocab_size):
  """The Captioner of `config.captioning` on the `encoder` module."""
  return captioning.Captioner(
      encoder=encoder, connector=settings['connector'],
      block=settings['block'], norm=settings['norm'],
      decoder=dict(settings['decoder'], vocab_size=vocab_size,
                   max_len=settings['max_len']))


def _attributes(module):
  """A module's constructor arguments, as JSON keeps them (a fused
  encoder's encoders as [class name, attributes])."""
  fields = {f.name: getattr(module, f.name) for f in dataclasses.fields(module)
            if f.init and f.name not in ('parent', 'name')}
  if isinstance(module, fusion.FusedEncoder):
    fields['encoders'] = [(type(m).__name__, _attributes(m))
                          for m in module.encoders]
  return json.loads(json.dumps(fields, default=_json_value))


def _json_value(value):
  """A dtype (a ViT's `jnp.float32`) by its name, a mapping (ConfigDict)
  as a dict."""
  if isinstance(value, (type, np.dtype)):
    return jnp.dtype(value).name
  return dict(value)


def _tuples(value):
  """JSON's lists back to tuples (a module's attributes are hashable)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load_captioner(path):
  """(Captioner, params, tokenizer, record) of an export's `.npz`."""
  record_path = files.beside(path, 'captioner.json')
  if not record_path.exists():
    raise files.CheckpointError(f'{path} is not a captioner export: no '
                                f'{record_path.name} beside it.')
  saved = json.loads(record_path.read_text())
  classes = {c.__name__: c for c in backbone.BACKBONES}
  encoder_config = _tuples(saved['encoder_config'])
  if saved['encoder'] == fusion.FusedEncoder.__name__:
    encoder = fusion.FusedEncoder(**dict(encoder_config, encoders=tuple(
        classes[name](**c) for name, c in encoder_config['encoders'])))
  else:
    encoder = classes[saved['encoder']](**encoder_config)
  tokenizer = tokenizers.get_tokenizer(
      saved['tokenizer'], str(files.beside(path, 'vocab.model')),
      saved['captioning']['max_len'])
  model = make_captioner(encoder, saved['captioning'], tokenizer.vocab_size)
  params = {'encoder': files.load(path),
            **files.load(files.beside(path, 'decoder.npz'))}
  if isinstance(encoder, fusion.FusedEncoder):
    params['encoder'] = {f'encoders_{i}': files.load(
        files.beside(path, f'encoder{i}.npz') if i else path)
                         for i in range(len(encoder.encoders))}
  return model, params, tokenizer, saved


def export_path(path, model_name):
  """The export's .npz of `path`: itself, or in a workdir `{model_name}.npz`."""
  if epath.Path(path).is_dir():
    path = storage.join(path, f'{model_name}.npz')
    if not epath.Path(path).exists():
      raise FileNotFoundError(f'{path} not found: the run has not finished '
                              'its export.')
  return str(path)


@registry.register
class Task(base.Task):
  """A captioner, its token loss and caption batches."""

  trainers = ('captioning',)
  planned = True

  @classmethod
  def check_config(cls, config, data_devices):
    super().check_config(config, data_devices)
    check_settings(config)

  @classmethod
  def input_files(cls, config):
    s = config.captioning
    return super().input_files(config) + [
        (f'captioning.{k}', s[k]) for k in ('vocab_path', 'decoder_init')
        if s.get(k)] + [(f'captioning.encoders[{i}].path', e['path'])
                        for i, e in enumerate(s.get('encoders') or ())]

  @classmethod
  def evaluates(cls, config):
    return config.get('captioning') is not None

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    self.config, self.workdir, self.mesh = config, workdir, mesh
    s = config.captioning
    if not training:  # `checkpoint` reads the model and vocabulary
      return
    if info is None:
      caption_data.check_class_captions(config)
      self.tokenizer = get_tokenizer(config, workdir)
      check_lengths(config, self.tokenizer)
      vocab_size = self.tokenizer.vocab_size
      self.special = (self.tokenizer.bos_token, self.tokenizer.eos_token)
    else:  # `vit_jax.plan` builds the step without data or vocabulary
      vocab_size, self.special = s.vocab_size, (1, 2)
    if s.get('encoders'):
      encoder, self._encoder_params = encoders.load_fused(config)
    else:
      encoder, self._encoder_params = encoders.load_encoder(config)
    self.model = make_captioner(encoder, s.to_dict(), vocab_size)
    self.param_labels = self._labels if s.trained == 'projector' else None
    if s.trained != 'all':
      self.frozen = {'encoder': self._encoder_params}
      self.frozen = jax.device_put(self.frozen, sharding.tree_shardings(
          self.frozen, mesh, config.sharding_rules, config.sharding_strategy))

  @staticmethod
  def _labels(params):
    """LLaVA's first stage: the projector alone trains."""
    return {k: jax.tree.map(lambda _, k=k: optim.TRAINED if k == 'projector'
                            else optim.FROZEN, v) for k, v in params.items()}

  def _example(self, batch_size=1):
    pp = self.config.pp
    tiles = (tiling.slots(pp.tiles['max']),) if pp.get('tiles') else ()
    return (jnp.zeros((batch_size, *tiles, pp.crop, pp.crop, 3)),
            jnp.zeros((batch_size, self.config.captioning.max_len), jnp.int32))

  def init_params(self, rng):
    params = dict(self.model.init(rng, *self._example())['params'])
    if self.frozen is not None:
      del params['encoder']  # the step's argument, not the state's
    return params

  def initial_params(self, params):
    """The encoder's loaded (or seeded) parameters; the decoder (and
    projector) from `decoder_init`, if given."""
    if 'encoder' in params:
      params['encoder'] = self._encoder_params
    path = self.config.captioning.decoder_init
    if path:
      loaded = files.load(path)
      for key in params.keys() & loaded.keys() - {'encoder'}:
        have, want = (jax.tree.map(files.shape_of, t)
                      for t in (loaded[key], params[key]))
        if have != want:
          raise files.CheckpointError(
              f'{path}: its {key!r} does not fit this captioner '
              '(another width, depth or vocabulary).')
        params[key] = loaded[key]
    return params

  def train_step(self, state, batch, *, rng, frozen=None):
    """One micro-batch: teacher forcing, or parallel prediction with
    probability `masked_pred_prob` per example."""
    s, model = self.config.captioning, self.model
    targets, images = batch['tokens'], batch['image']
    rng = jax.random.fold_in(rng, state.step)
    bos, eos = self.special
    parallel = jax.random.uniform(rng, (targets.shape[0],)) < \
        s.masked_pred_prob
    inputs = jnp.where(parallel[:, None], model.decoder['vocab_size'],
                       captioning.shift_right(targets, bos))
    if frozen is not None:
      tokens = jax.lax.stop_gradient(model.apply(
          {'params': frozen}, images, method='image_tokens'))

    def compute_loss(params):
      if frozen is None:
        memory = model.apply({'params': params}, images, train=True,
                             method='encode', rngs={'dropout': rng})
      else:
        memory = model.apply({'params': params}, tokens, method='connect')
      logits = model.apply({'params': {**params, **(frozen or {})}}, memory,
                           inputs, parallel=parallel, method='logits')
      weights = captioning.caption_weights(targets, eos)
      return losses.token_cross_entropy(logits, targets, weights), (
          logits, weights)

    (value, (logits, weights)), grads = jax.value_and_grad(
        compute_loss, has_aux=True)(state.params)
    correct = (jnp.argmax(logits, -1) == targets) * weights
    return state.apply_gradients(grads=grads), {
        'loss': value, 'token_accuracy': correct.sum() / weights.sum()}

  def batches(self, *, batch_size, rows, start_step):
    return caption_data.train_iterator(self.config, self.tokenizer,
                                       batch_size=batch_size, rows=rows,
                                       start_step=start_step)

  def abstract_batch(self, batch_size):
    image, tokens = self._example(batch_size)
    return {'image': jax.ShapeDtypeStruct(image.shape, image.dtype),
            'tokens': jax.ShapeDtypeStruct(tokens.shape, tokens.dtype)}

  def checkpoint(self, path):
    """(captioner, params) of an export (its .npz, or a workdir's)."""
    model, params, self.tokenizer, _ = load_captioner(
        export_path(path, self.config.model_name))
    self.special = (self.tokenizer.bos_token, self.tokenizer.eos_token)
    return model, params

  def exported_params(self, params):
    """The whole captioner's: the evaluators read both parts."""
    return {**params, **(self.frozen or {})}

  def exported_records(self):
    """The encoder's (the decoder's is `captioner.json`, by `finish`); of
    fused encoders, the first's."""
    encoder = self.model.encoder
    if isinstance(encoder, fusion.FusedEncoder):
      encoder = encoder.encoders[0]
    return {'': record.of_run(self.config, encoder)}

  def exported_files(self, params):
    """The encoder (fused: the first; the others `.encoder{i}`) and the
    decoder."""
    encoder = dict(params['encoder'])
    if isinstance(self.model.encoder, fusion.FusedEncoder):
      encoder = {f'.encoder{i}' if i else '': encoder[f'encoders_{i}']
                 for i in range(len(encoder))}
    else:
      encoder = {'': encoder}
    return {**encoder,
            '.decoder': {k: v for k, v in params.items() if k != 'encoder'}}

  def finish(self, params, workdir):
    """Beside the export: the vocabulary, and what rebuilds the model."""
    del params
    if jax.process_index():
      return
    npz = storage.join(workdir, f'{self.config.model_name}.npz')
    s = self.config.captioning
    vocab = caption_data.vocabulary(self.config, workdir, s.vocab_size,
                                    fit=False)
    files.beside(npz, 'vocab.model').write_bytes(
        epath.Path(vocab).read_bytes())
    storage.write_json(str(files.beside(npz, 'captioner.json')), {
        'encoder': type(self.model.encoder).__name__,
        'encoder_config': _attributes(self.model.encoder),
        'captioning': {k: s[k] for k in ('connector', 'block', 'norm',
                                         'max_len')} | {
                                             'decoder': s.decoder.to_dict()},
        'tokenizer': s.tokenizer,
        'pp': self.config.pp.to_dict()})

