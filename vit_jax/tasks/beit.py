"""BEiT pretraining (`trainer='beit'`) and its visual tokenizer
(`trainer='beit_tokenizer'`), both under `config.beit`.

The tokenizer run trains a `models.beit.VisualTokenizer` (`beit.tokenizer`:
its `kind`, codebook, decoder, and for 'vqkd' the `teacher_path` whose
patch features it reconstructs) and exports `{model_name}.tokenizer.npz`
with `{model_name}.tokenizer.json`, what rebuilds it. The BEiT run reads
them (`beit.tokenizer_path`: that .npz, or the tokenizer's workdir), masks
about `mask_ratio` of each image's patches in blocks (BEiT's Algorithm 1,
from the step's key: a resumed run masks alike), replaces them by the
encoder's `mask_token` and learns to predict their codes. It exports the
encoder, without its mask token, as `{model_name}.npz` in the published
layout: `pretrained_path` fine-tunes it as MAE's.
"""

import json

import chex
import jax
import jax.numpy as jnp

from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import storage
from vit_jax.data import pipeline
from vit_jax.models import beit as models_beit
from vit_jax.models import mae as models_mae
from vit_jax.models import posemb
from vit_jax.models import vit as models_vit
from vit_jax.platform import sharding
from vit_jax.run import optim
from vit_jax.tasks import base
from vit_jax.tasks import registry

RECORD = 'json'  # `{model_name}.tokenizer.json`, beside its .npz
TOKENIZER_KEYS = ('kind', 'codebook_size', 'code_dim', 'decoder')
DECODER_KEYS = ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')
UPDATES = ('ema', 'st')


def _settings(config, what):
  settings = config.get('beit')
  if settings is None or (what == 'tokenizer' and
                          settings.get('tokenizer') is None):
    raise ValueError(f"config.trainer={config.trainer!r} needs "
                     f"config.beit{'.tokenizer' if what == 'tokenizer' else ''}"
                     ' (see configs/beit_fmnist.py).')
  return settings


def encoder_config(config):
  """The encoder's ViT config: a class token or mean pooling, no
  `pre_logits`, no ResNet; its head is dropped."""
  model = dict(config.model.to_dict())
  if model.get('classifier', 'token') not in ('token', 'gap', 'token_gap'):
    raise ValueError("A BEiT encoder pools its class token or its patches: "
                     "config.model.classifier='token', 'gap' or "
                     f"'token_gap', got {model['classifier']!r}.")
  return models_vit.pretrained_encoder_config(
      dict(model, classifier='token'), 'BEiT') | {
          'classifier': model.get('classifier', 'token')}


def num_masked(config) -> int:
  """Patches masked per image: `mask_ratio` of the grid, rounded; checked
  against the block settings."""
  s = config.beit
  grid = posemb.token_grid(config.model, (config.pp.crop,) * 2)
  patches = grid[0] * grid[1]
  if not 0 < s.mask_ratio < 1:
    raise ValueError(f'config.beit.mask_ratio={s.mask_ratio} must be in '
                     '(0, 1).')
  count = round(s.mask_ratio * patches)
  if not 1 <= s.min_patches <= count:
    raise ValueError(f'config.beit.min_patches={s.min_patches} must be in '
                     f'[1, {count}]: the patches masked ({s.mask_ratio} of '
                     f'{patches}).')
  if not 0 < s.min_aspect <= 1:
    raise ValueError(f'config.beit.min_aspect={s.min_aspect} must be in '
                     '(0, 1].')
  return count


def check_tokenizer(config):
  """Fails fast on `config.beit.tokenizer`."""
  t = _settings(config, 'tokenizer').tokenizer
  missing = [k for k in TOKENIZER_KEYS if k not in t] + [
      f'decoder.{k}' for k in DECODER_KEYS if k not in t.get('decoder', {})]
  if missing:
    raise ValueError(f'config.beit.tokenizer lacks {missing}.')
  if t.kind not in models_beit.KINDS:
    raise ValueError(f'config.beit.tokenizer.kind={t.kind!r}; expected one '
                     f'of {models_beit.KINDS}.')
  if not isinstance(t.codebook_size, int) or t.codebook_size < 2:
    raise ValueError(f'config.beit.tokenizer.codebook_size={t.codebook_size!r}'
                     ' must be an integer >= 2.')
  if t.code_dim < 1 or t.decoder.hidden_size % t.decoder.num_heads:
    raise ValueError('config.beit.tokenizer: code_dim must be >= 1 and '
                     'decoder.hidden_size divisible by decoder.num_heads.')
  if t.codebook_update not in UPDATES or not 0 <= t.ema_decay < 1:
    raise ValueError(f'config.beit.tokenizer: codebook_update='
                     f'{t.codebook_update!r} (expected one of {UPDATES}), '
                     f'ema_decay={t.ema_decay} (in [0, 1)).')
  if t.kind == 'vqkd' and not t.teacher_path:
    raise ValueError("config.beit.tokenizer.kind='vqkd' reconstructs a "
                     "teacher's features: set config.beit.tokenizer."
                     'teacher_path (e.g. the default job\'s '
                     '/tmp/vit_default/ViT-fmnist.npz).')
  encoder_config(config)


def _tuples(value):
  """JSON's lists back to tuples (a module's attributes are hashable)."""
  if isinstance(value, dict):
    return {k: _tuples(v) for k, v in value.items()}
  return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def tokenizer_file(path, model_name) -> str:
  """The tokenizer's .npz: `path` itself, or in a workdir
  `{model_name}.tokenizer.npz`."""
  if path.endswith('.npz'):
    return path
  return storage.join(path, f'{model_name}.tokenizer.npz')


def load_tokenizer(path):
  """(VisualTokenizer, params, record) of a tokenizer run's export."""
  record_path = files.beside(path, RECORD)
  if not record_path.exists():
    raise files.CheckpointError(
        f'{path}: not a visual tokenizer (no {record_path.name} beside it); '
        'train one with trainer=\'beit_tokenizer\'.')
  record = json.loads(record_path.read_text())
  model = models_beit.VisualTokenizer(**_tuples(record['model']))
  return model, files.load(path), record


def make_tokenizer(config, target_dim):
  t = config.beit.tokenizer
  return models_beit.VisualTokenizer(
      encoder=encoder_config(config), kind=t.kind,
      codebook_size=t.codebook_size, code_dim=t.code_dim,
      decoder=t.decoder.to_dict(), target_dim=target_dim)


def teacher_features(teacher, params, images):
  """The teacher's patch tokens after its last block and final norm."""
  return teacher.apply({'params': params}, images, indices=1, norm=True,
                       output_fmt='NLC', intermediates_only=True,
                       method='forward_intermediates')[0]


def tokenizer_loss(out, target, settings, kind):
  """(loss, terms) of a tokenizer's outputs against its targets: 1 - cosine
  similarity to a teacher's features ('vqkd') or the pixels' mean squared
  error; + the commitment (and, updated by gradient, codebook) loss of a
  VQ, or a dVAE's KL divergence to the uniform prior over codes."""
  pred = out['pred'].astype(jnp.float32)
  if kind == 'vqkd':
    cos = jnp.sum(models_beit.l2_normalize(pred) *
                  models_beit.l2_normalize(target), -1)
    rec = jnp.mean(1 - cos)
  else:
    rec = jnp.mean((pred - target)**2)
  if kind == 'dvae':
    log_p = jax.nn.log_softmax(out['logits'])
    kl = jnp.mean(jnp.sum(jnp.exp(log_p) * log_p, -1)) + jnp.log(
        out['logits'].shape[-1])
    return rec + settings.kl_weight * kl, {'reconstruction': rec, 'kl': kl}
  codes = out['codes']
  commit = jnp.mean(jnp.sum((out['z'] - jax.lax.stop_gradient(codes))**2, -1))
  loss = rec + settings.commitment * commit
  if settings.codebook_update == 'st':  # the codebook follows its assignments
    loss += jnp.mean(jnp.sum((jax.lax.stop_gradient(out['z']) - codes)**2, -1))
  return loss, {'reconstruction': rec, 'commitment': commit}


def tokenizer_step(state, images, rng, frozen, *, model, teacher, settings,
                   temperature):
  """One tokenizer update; then, for a VQ, the codebook's EMA (with
  `update='ema'`), its usage and the restart of dead codes."""
  k_gumbel, k_restart = jax.random.split(rng)
  if model.kind == 'vqkd':
    target = jax.lax.stop_gradient(
        teacher_features(teacher, frozen['teacher'], images))
  else:
    target = models_mae.patchify(images, models_vit.patch_size(
        model.encoder['patches']))

  def compute_loss(params):
    out = model.apply({'params': params['tokenizer']}, images, train=True,
                      temperature=temperature, rngs={'gumbel': k_gumbel})
    loss, terms = tokenizer_loss(out, target, settings, model.kind)
    return loss, (out, terms)

  (value, (out, terms)), grads = jax.value_and_grad(
      compute_loss, has_aux=True)(state.params)
  state = state.apply_gradients(grads=grads)
  params = dict(state.params)
  index = out['index'].reshape(-1)
  counts = jnp.zeros(model.codebook_size).at[index].add(1.)
  decay = settings.ema_decay
  metrics = {'loss': value, **terms,
             'codes_in_batch': jnp.mean(counts > 0)}
  if model.kind == 'dvae':
    params['usage'] = decay * params['usage'] + (1 - decay) * counts
    return state.replace(params=params), metrics
  tokenizer = dict(params['tokenizer'])
  z = out['z'].reshape(-1, out['z'].shape[-1])
  if settings.codebook_update == 'ema':
    codebook, usage = models_beit.ema_codebook(
        tokenizer['codebook'], params['usage'], z, index, decay)
  else:
    codebook = tokenizer['codebook']
    usage = decay * params['usage'] + (1 - decay) * counts
  if settings.restart_threshold:
    codebook, usage, metrics['restarted'] = models_beit.restart_dead_codes(
        k_restart, codebook, usage, z, settings.restart_threshold)
  tokenizer['codebook'] = codebook
  params.update(tokenizer=tokenizer, usage=usage)
  return state.replace(params=params), metrics


def _image_batches(task, batch_size, rows, start_step):
  """This process's rows of the training images; labels are not used."""
  for batch in pipeline.train_iterator(
      task.info, task.config, batch_size=batch_size, rows=rows,
      start_step=start_step):
    yield {'image': batch['image']}


@registry.register
class TokenizerTask(base.Task):
  """A visual tokenizer; `{model_name}.tokenizer.npz` is its export."""

  trainers = ('beit_tokenizer',)

  @classmethod
  def check_config(cls, config, data_devices):
    super().check_config(config, data_devices)
    check_tokenizer(config)

  @classmethod
  def input_files(cls, config):
    path = config.beit.tokenizer.get('teacher_path')
    return super().input_files(config) + (
        [('beit.tokenizer.teacher_path', path)] if path else [])

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del training, workdir
    self.config, self.mesh = config, mesh
    self.settings = t = config.beit.tokenizer
    self.image_shape = (1, config.pp.crop, config.pp.crop, 3)
    self.info = info or pipeline.dataset_info(
        pipeline.get_builder(config), config)
    self.teacher = None
    if t.kind == 'vqkd':
      teacher_config = config.model
      self.teacher, teacher_params, _ = loading.load_model(
          teacher_config, t.teacher_path, config.pp.crop)
      target_dim = self.teacher.hidden_size
      self.frozen = jax.device_put(
          {'teacher': teacher_params}, sharding.tree_shardings(
              {'teacher': teacher_params}, mesh, config.sharding_rules,
              config.sharding_strategy))
      print(f'Tokenizer teacher: {t.teacher_path}.', flush=True)
    else:
      ph, pw = models_vit.patch_size(config.model.patches)
      target_dim = ph * pw * 3
    self.model = make_tokenizer(config, target_dim)

  def param_labels(self, params):
    """The usage counts, and a codebook updated by EMA, are not trained."""
    s = self.settings
    ema = s.codebook_update == 'ema' and s.kind != 'dvae'
    labels = jax.tree.map(lambda _: optim.TRAINED, params)
    labels['usage'] = optim.FROZEN
    if ema:
      labels['tokenizer'] = dict(labels['tokenizer'], codebook=optim.FROZEN)
    return labels

  def init_params(self, rng):
    params = self.model.init({'params': rng, 'gumbel': rng},
                             jnp.zeros(self.image_shape), train=False)
    return {'tokenizer': params['params'],
            'usage': jnp.zeros(self.settings.codebook_size)}

  def temperature(self, step):
    """A dVAE's Gumbel-softmax temperature: from `temperature[0]` to
    `temperature[1]` on a cosine over the run (DALL-E: 1 to 1/16)."""
    start, end = self.settings.temperature
    frac = jnp.minimum(step / max(self.config.total_steps, 1), 1.)
    return end + (start - end) * (1 + jnp.cos(jnp.pi * frac)) / 2

  def train_step(self, state, batch, *, rng, frozen=None):
    chex.assert_rank(batch['image'], 4)
    return tokenizer_step(
        state, batch['image'], jax.random.fold_in(rng, state.step), frozen,
        model=self.model, teacher=self.teacher, settings=self.settings,
        temperature=self.temperature(state.step))

  def batches(self, *, batch_size, rows, start_step):
    return _image_batches(self, batch_size, rows, start_step)

  def exported_params(self, params):
    return params['tokenizer']

  def exported_files(self, params):
    return {'.tokenizer': params}

  def exported_records(self):
    """None here: `finish` writes the tokenizer's own record."""
    return {}

  def finish(self, params, workdir):
    """Beside the export: what rebuilds the tokenizer."""
    del params
    if jax.process_index():
      return
    m = self.model
    npz = storage.join(workdir, f'{self.config.model_name}.tokenizer.npz')
    storage.write_json(str(files.beside(npz, RECORD)), {
        'model': {'encoder': m.encoder, 'kind': m.kind,
                  'codebook_size': m.codebook_size, 'code_dim': m.code_dim,
                  'decoder': m.decoder, 'target_dim': m.target_dim},
        'teacher_path': self.settings.get('teacher_path'),
        'pp': self.config.pp.to_dict()})


@registry.register
class Task(base.Task):
  """BEiT: a ViT predicts the tokenizer's codes of its masked patches."""

  trainers = ('beit',)

  @classmethod
  def check_config(cls, config, data_devices):
    super().check_config(config, data_devices)
    _settings(config, 'beit')
    if not config.beit.get('tokenizer_path'):
      raise ValueError("config.trainer='beit' needs config.beit."
                       'tokenizer_path: a tokenizer run\'s workdir or its '
                       '.tokenizer.npz (trainer=\'beit_tokenizer\').')
    num_masked(config)
    encoder_config(config)

  @classmethod
  def input_files(cls, config):
    return super().input_files(config) + [(
        'beit.tokenizer_path',
        tokenizer_file(config.beit.tokenizer_path, config.model_name))]

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del training, workdir
    self.config, self.mesh = config, mesh
    s = config.beit
    self.encoder_config = encoder_config(config)
    self.grid = posemb.token_grid(config.model, (config.pp.crop,) * 2)
    self.num_masked = num_masked(config)
    self.info = info or pipeline.dataset_info(
        pipeline.get_builder(config), config)
    path = tokenizer_file(s.tokenizer_path, config.model_name)
    self.tokenizer, tokenizer_params, _ = load_tokenizer(path)
    grid = posemb.token_grid(self.tokenizer.encoder, (config.pp.crop,) * 2)
    if grid != self.grid:
      raise ValueError(f'config.beit.tokenizer_path={path}: its tokens are a '
                       f'{grid} grid at pp.crop={config.pp.crop}; the encoder '
                       f'makes {self.grid}: use the same patch size.')
    self.frozen = jax.device_put(
        {'tokenizer': tokenizer_params}, sharding.tree_shardings(
            {'tokenizer': tokenizer_params}, mesh, config.sharding_rules,
            config.sharding_strategy))
    print(f'BEiT targets: the {self.tokenizer.codebook_size} codes of the '
          f'{self.tokenizer.kind!r} tokenizer {path}.', flush=True)
    self.model = models_beit.Pretrainer(
        encoder=self.encoder_config, vocab_size=self.tokenizer.codebook_size)
    self.encoder = models_vit.VisionTransformer(num_classes=None,
                                                **self.encoder_config)
    self.image_shape = (1, config.pp.crop, config.pp.crop, 3)

  def init_params(self, rng):
    patches = self.grid[0] * self.grid[1]
    return self.model.init(rng, jnp.zeros(self.image_shape), train=False,
                           mask=jnp.zeros((1, patches), bool))['params']

  @property
  def exported_model(self):
    return self.encoder

  def exported_params(self, params):
    return {k: v for k, v in params['encoder'].items() if k != 'mask_token'}

  def initial_params(self, params):
    """The encoder from `pretrained_path` (continued pretraining), or None."""
    path = pretrained.pretrained_path(self.config)
    if not path:
      return None
    loaded = loading.load_params(
        path, init_params=self.exported_params(params),
        model_config=self.config.model, new_grid=self.grid)
    params['encoder'] = {**loaded,
                         'mask_token': params['encoder']['mask_token']}
    print(f'BEiT from the encoder {path}.', flush=True)
    return params

  def train_step(self, state, batch, *, rng, frozen):
    """One micro-batch: block masks from the step's key, the codes of the
    masked patches predicted."""
    images = batch['image']
    chex.assert_rank(images, 4)
    s = self.config.beit
    mask_rng, dropout_rng = jax.random.split(
        jax.random.fold_in(rng, state.step))
    targets = self.tokenizer.apply({'params': frozen['tokenizer']}, images,
                                   method='tokens')
    mask = models_beit.block_masks(
        mask_rng, images.shape[0], self.grid, self.num_masked,
        min_patches=s.min_patches, min_aspect=s.min_aspect)

    def compute_loss(params):
      logits = self.model.apply({'params': params}, images, train=True,
                                mask=mask, rngs={'dropout': dropout_rng})
      return models_beit.masked_token_loss(logits, targets, mask)

    (value, accuracy), grads = jax.value_and_grad(
        compute_loss, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads), {
        'loss': value, 'masked_accuracy': accuracy,
        'masked_fraction': jnp.mean(mask)}

  def batches(self, *, batch_size, rows, start_step):
    return _image_batches(self, batch_size, rows, start_step)
