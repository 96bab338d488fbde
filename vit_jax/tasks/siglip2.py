"""SigLIP 2's recipe (`trainer='siglip2'`, Tschannen et al., 2025): SigLIP's
sigmoid loss on two towers trained from scratch, with LocCa's decoder and,
for the last part of training, SILC's and TIPS' self-distillation.

The loss, each term a field of `config.siglip2` (docs/siglip2.md):

  sigmoid(zimg, ztxt)                          SigLIP, chunked over devices
  + decoder_weight * mean over tasks of CE     LocCa: caption, ref -> box,
                                               box -> phrase (`data/locca`)
  + active * ssl_factor * (silc_weight * SILC + tips_weight * TIPS)

SILC: the student's pooled features of `crops.num_local` local views
against an EMA teacher's of one global view, through a DINO head (centred,
sharpened targets). TIPS: the student sees that global view with
`mask_ratio` of its patches masked and matches the teacher's patch scores
at the masked places (iBOT's loss). `active` is step >= ssl_start *
total_steps: until then the two terms are not computed (`lax.cond`), the
teacher follows the student exactly and the heads and mask token keep
their initial values, so at the switch the teacher starts from the student
and the heads from their random init, as the paper's.

The image tower is a ViT, or with `config.model.naflex` a NaViT fed one
image a sequence at a patch budget drawn per step from `naflex_budgets`,
each image's width stretched by a factor in `naflex_aspects` (NaFlex: the
padding masked in the tower and in the decoder's cross-attention); SILC and
TIPS need the ViT.

State: 'student' (the model: trained), and with self-distillation
'teacher' (image tower and heads), 'center', 'tips_center' (frozen labels:
no gradient, no optimizer state), checkpointed and sharded like any.
"""

from etils import epath
import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.checkpoints import record
from vit_jax.checkpoints import storage
from vit_jax.data import locca
from vit_jax.data import tokenizers
from vit_jax.data import multicrop
from vit_jax.models import dino as models_dino
from vit_jax.models import lit
from vit_jax.models import navit as models_navit
from vit_jax.models import posemb
from vit_jax.models import siglip2_recipe
from vit_jax.run import optim
from vit_jax.tasks import base
from vit_jax.tasks import dino
from vit_jax.tasks import registry

FROZEN_KEYS = ('teacher', 'center', 'tips_center')
# The student's parts that the teacher averages.
TEACHER_KEYS = ('img', 'img_pool', 'silc', 'tips')
# Parts that wait for the switch (the heads, the ViT's mask token).
WAITING_KEYS = ('silc', 'tips')


def check_settings(config):
  """Fails fast on `config.siglip2`."""
  s = config.get('siglip2')
  if s is None:
    raise ValueError("config.trainer='siglip2' needs config.siglip2 (see "
                     'configs/siglip2_scenes.py).')
  for key in ('decoder_weight', 'silc_weight', 'tips_weight', 'ssl_factor'):
    if s[key] < 0:
      raise ValueError(f'config.siglip2.{key}={s[key]}: a weight is >= 0.')
  if not 0 <= s.parallel_fraction <= 1:
    raise ValueError(f'config.siglip2.parallel_fraction={s.parallel_fraction}'
                     ': a probability, in [0, 1].')
  if not 0 <= s.ssl_start < 1:
    raise ValueError(f'config.siglip2.ssl_start={s.ssl_start}: a fraction of '
                     'training, in [0, 1).')
  if not 0 < s.mask_ratio < 1 or not 0 <= s.momentum_teacher < 1:
    raise ValueError('config.siglip2: mask_ratio in (0, 1), '
                     'momentum_teacher in [0, 1).')
  if s.box_bins < 2:
    raise ValueError(f'config.siglip2.box_bins={s.box_bins}: at least 2.')
  if ssl_on(config) and config.model.naflex:
    raise ValueError('SILC and TIPS train the fixed-resolution ViT: set '
                     'config.siglip2.silc_weight and tips_weight to 0 with '
                     'config.model.naflex.')
  if config.model.naflex and not s.naflex_budgets:
    raise ValueError('config.model.naflex needs config.siglip2.'
                     'naflex_budgets (patches per image).')
  low, high = s.get('naflex_aspects') or (1., 1.)
  if config.model.naflex and not 0 < low <= high:
    raise ValueError(f'config.siglip2.naflex_aspects={(low, high)}: a range '
                     '0 < low <= high of width / height stretches.')
  if config.accum_steps > 1 and ssl_on(config):
    raise ValueError("Self-distillation takes accum_steps=1: the teacher's "
                     'average follows every optimizer update.')
  return s


def ssl_on(config) -> bool:
  s = config.siglip2
  return bool(s.ssl_factor and (s.silc_weight or s.tips_weight))


def ssl_start_step(config) -> int:
  """The first step with SILC and TIPS on."""
  return int(round(config.siglip2.ssl_start * config.total_steps))


def decoder_loss(logits, targets, weights):
  """LocCa's loss: each task's normalized token cross-entropy (rows (3B,
  ...) task-major), averaged over the tasks that have a scored token."""
  n = len(locca.TASKS)
  split = lambda x: x.reshape(n, -1, *x.shape[1:])
  logits, targets, weights = split(logits), split(targets), split(weights)
  per_task = jnp.stack([losses.token_cross_entropy(logits[t], targets[t],
                                                   weights[t])
                        for t in range(n)])
  present = (weights.sum((1, 2)) > 0).astype(jnp.float32)
  return jnp.sum(per_task * present) / jnp.maximum(jnp.sum(present), 1)


def parallel_inputs(inputs, parallel, mask_id):
  """CapPa's parallel prediction: the rows `parallel` read [MASK] after
  their task token, and attend to the whole sequence."""
  masked = inputs.at[:, 1:].set(mask_id)
  return jnp.where(parallel[:, None], masked, inputs)


def student_ssl(model, student, batch, targets, masks, settings):
  """(SILC, TIPS) losses of the student against the teacher's targets."""
  mask, masked, weight = masks
  local = dino.crop_major(batch['local'])
  pooled, _ = model.apply({'params': student}, local, train=True,
                          method='image_features')
  scores = model.apply({'params': student}, pooled, method='silc_scores')
  silc = losses.silc_loss(dino.by_view(scores, targets[0].shape[0]),
                          targets[0], settings.student_temp)
  _, tokens = model.apply({'params': student}, batch['global'][:, 0],
                          train=True, mask=mask, method='image_features')
  picked = jnp.take_along_axis(tokens, masked[..., None], axis=1)
  patch_scores = model.apply({'params': student}, picked,
                             method='tips_scores')
  tips = losses.ibot_loss(patch_scores, targets[1], weight,
                          settings.student_temp)
  return silc, tips


def teacher_scores(model, params, batch, masked):
  """The teacher's (pooled SILC scores (B, K), TIPS scores at `masked`
  patches (B, m, K)) of the global view."""
  weights = {**params['student'], **params['teacher']}
  pooled, tokens = model.apply({'params': weights}, batch['global'][:, 0],
                               method='image_features')
  picked = jnp.take_along_axis(tokens, masked[..., None], axis=1)
  return jax.lax.stop_gradient((
      model.apply({'params': weights}, pooled, method='silc_scores'),
      model.apply({'params': weights}, picked, method='tips_scores')))


def _where(flag, new, old):
  return jax.tree.map(lambda n, o: jnp.where(flag, n, o), new, old)


def train_step(state, batch, rng, *, model, config, mesh):
  """One update of every term (module docstring)."""
  s, params, step = config.siglip2, state.params, state.step
  rng = jax.random.fold_in(rng, step)
  rng_parallel, rng_mask, rng_dropout = jax.random.split(rng, 3)
  has_ssl, has_decoder = 'teacher' in params, model.decoder is not None
  active = step >= ssl_start_step(config)
  images = batch['image'] if 'image' in batch else {
      k: batch[k] for k in models_navit.BATCH_KEYS}

  if has_ssl:
    grid = posemb.token_grid(model.image, batch['global'].shape[2:4])
    masks = models_dino.random_masks(
        rng_mask, batch['global'].shape[0], grid[0] * grid[1],
        probability=1., ratio=(s.mask_ratio, s.mask_ratio))
    k = s.head.num_prototypes
    zeros = (jnp.zeros((masks[1].shape[0], k)),
             jnp.zeros((*masks[1].shape, k)))
    scores = jax.lax.cond(
        active, lambda: teacher_scores(model, params, batch, masks[1]),
        lambda: zeros)
    targets = (losses.centered_softmax(scores[0], params['center'],
                                       s.teacher_temp),
               losses.centered_softmax(scores[1], params['tips_center'],
                                       s.teacher_temp))

  if has_decoder:
    n = len(locca.TASKS)
    flat = lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, x.shape[-1])
    inputs, dec_targets, dec_weights = (flat(batch[k]) for k in
                                        ('inputs', 'targets', 'weights'))
    rows = inputs.shape[0] // n
    parallel = jnp.concatenate([
        jax.random.uniform(rng_parallel, (rows,)) < s.parallel_fraction,
        jnp.zeros((rows * (n - 1),), bool)])
    inputs = parallel_inputs(inputs, parallel, model.decoder['vocab_size'])

  sigmoid = (losses.CONTRASTIVE['sigmoid'] if not config.siglip_chunked else
             lambda *a: losses.sigmoid_loss_chunked(*a, mesh=mesh))

  def compute_loss(student):
    apply = lambda *a, **kw: model.apply({'params': student}, *a, **kw)
    pooled, tokens = apply(images, train=True, method='image_features',
                           rngs={'dropout': rng_dropout})
    zimg = apply(pooled, method='embed_image')
    ztxt = apply(batch['tokens'], train=True, method='embed_text',
                 rngs={'dropout': rng_dropout})
    t, b = jnp.exp(student['t'][0]), student['b'][0]
    terms = {'sigmoid_loss': sigmoid(zimg, ztxt, t, b)}
    total = terms['sigmoid_loss']
    if has_decoder:
      memory = jnp.concatenate([tokens] * n)
      real = None
      if 'segment_ids' in batch:  # NaFlex: padding is not attended to
        real = jnp.concatenate([batch['segment_ids'] > 0] * n)
      logits = apply(memory, inputs, parallel=parallel, memory_mask=real,
                     method='logits')
      terms['decoder_loss'] = decoder_loss(logits, dec_targets, dec_weights)
      total += s.decoder_weight * terms['decoder_loss']
    if has_ssl:
      silc, tips = jax.lax.cond(
          active, lambda: student_ssl(model, student, batch, targets, masks,
                                      s),
          lambda: (jnp.float32(0.), jnp.float32(0.)))
      terms.update(silc_loss=silc, tips_loss=tips)
      total += s.ssl_factor * (s.silc_weight * silc + s.tips_weight * tips)
    return total, (terms, t, zimg, ztxt)

  (value, (terms, t, zimg, ztxt)), grads = jax.value_and_grad(
      compute_loss, has_aux=True)(params['student'])
  grads = {k: (grads if k == 'student' else jax.tree.map(jnp.zeros_like, v))
           for k, v in params.items()}
  new_state = state.apply_gradients(grads=grads)
  metrics = {'loss': value, **terms, 'temperature': t,
             'retrieval': losses.retrieval_accuracy(zimg[:256], ztxt[:256])}
  if not has_ssl:
    return new_state, metrics
  new = dict(new_state.params)
  student = dict(new['student'])
  for key in WAITING_KEYS:  # untouched until the switch
    student[key] = _where(active, student[key], params['student'][key])
  image = dict(student['img'])
  image['mask_token'] = jnp.where(active, image['mask_token'],
                                  params['student']['img']['mask_token'])
  student['img'] = image
  new['student'] = student
  part = {k: student[k] for k in TEACHER_KEYS}
  start = ssl_start_step(config)
  momentum = dino.teacher_momentum(step - start, config.total_steps - start,
                                   s.momentum_teacher)
  new['teacher'] = _where(active, dino.ema(params['teacher'], part,
                                           momentum), part)
  new['center'] = jnp.where(active, dino.new_center(
      params['center'], scores[0], s.center_momentum), params['center'])
  m = scores[1].shape[0] * scores[1].shape[1]
  new['tips_center'] = jnp.where(active, dino.new_center(
      params['tips_center'], scores[1].reshape(m, -1), s.center_momentum,
      masks[2].reshape(m)), params['tips_center'])
  metrics.update(teacher_momentum=momentum,
                 ssl_active=active.astype(jnp.float32))
  return new_state.replace(params=new), metrics


def param_labels(params):
  """The student is trained; teacher and centres are not."""
  return {k: optim.FROZEN if k in FROZEN_KEYS else optim.TRAINED
          for k in params}


def make_model(config, text_vocab: int):
  """The recipe's model of `config.model`, its decoder and heads as
  `config.siglip2` turns them on."""
  s, m = config.siglip2, config.model
  image = m.image.to_dict()
  if ssl_on(config) and image.get('posemb', 'learn') == 'learn':
    # The local views' grid is smaller: the table is resized to it.
    image['posemb_grid'] = image.get('posemb_grid') or posemb.token_grid(
        image, (config.pp.crop,) * 2)
  decoder = None
  if s.decoder_weight:
    decoder = dict(s.decoder.to_dict(), vocab_size=locca.decoder_vocab_size(
        text_vocab, s.box_bins))
  head = s.head.to_dict() if ssl_on(config) else None
  return siglip2_recipe.RecipeModel(
      image=image, text=m.text.to_dict(), out_dim=m.out_dim, naflex=m.naflex,
      decoder=decoder, silc_head=head, tips_head=head,
      temperature_init=m.temperature_init, bias_init=m.bias_init,
      model_name=config.model_name)


@registry.register
class Task(base.Task):
  """SigLIP 2: two towers, LocCa's decoder, SILC and TIPS."""

  trainers = ('siglip2',)
  param_labels = staticmethod(param_labels)

  @classmethod
  def check_config(cls, config, data_devices):
    check_settings(config)
    # The shared checks see the image tower as the run's model.
    image = config.copy_and_resolve_references()
    with image.unlocked():
      image.model = config.model.image
    super().check_config(image, data_devices)
    if ssl_on(config):
      multicrop.check(config.siglip2.crops, config.pp.crop,
                      config.model.image.patches.size)

  @classmethod
  def input_files(cls, config):
    path = config.lit.get('vocab_path')
    return super().input_files(config) + (
        [('lit.vocab_path', path)] if path else [])

  def __init__(self, config, workdir, mesh, *, training=True):
    check_settings(config)
    self.config, self.workdir, self.mesh = config, workdir, mesh
    s = config.siglip2
    path = locca.vocabulary(config, workdir, config.model.text.vocab_size,
                            fit=training)
    self.tokenizer = tokenizers.get_tokenizer('sentencepiece', path,
                                              config.model.text_max_len)
    if self.tokenizer.vocab_size > config.model.text.vocab_size:
      raise ValueError(f'The vocabulary {path} has '
                       f'{self.tokenizer.vocab_size} tokens, the text tower '
                       f'only {config.model.text.vocab_size} embeddings.')
    self.model = make_model(config, self.tokenizer.vocab_size)
    if training and s.decoder_weight:
      locca.check_lengths(self.tokenizer, *locca.training_texts(config),
                          s.decoder.max_len)

  def _example(self):
    crop, s = self.config.pp.crop, self.config.siglip2
    return (jnp.zeros((1, crop, crop, 3)),
            jnp.zeros((1, self.config.model.text_max_len), jnp.int32),
            jnp.zeros((1, s.decoder.max_len), jnp.int32))

  def init_params(self, rng):
    student = self.model.init(rng, *self._example(),
                              method='init_all')['params']
    if not ssl_on(self.config):
      return {'student': student}
    k = self.config.siglip2.head.num_prototypes
    return {'student': student,
            'teacher': jax.tree.map(jnp.copy, {key: student[key]
                                               for key in TEACHER_KEYS}),
            'center': jnp.zeros((1, k)), 'tips_center': jnp.zeros((1, k))}

  def check_initial_files(self):
    pass  # from scratch

  def train_step(self, state, batch, *, rng):
    return train_step(state, batch, rng, model=self.model, config=self.config,
                      mesh=self.mesh)

  def batches(self, *, batch_size, rows, start_step):
    return locca.train_iterator(
        self.config, self.tokenizer, batch_size=batch_size, rows=rows,
        start_step=start_step, ssl=ssl_on(self.config),
        naflex=self.config.model.naflex)

  def exported_params(self, params):
    return params['student']

  @property
  def towers(self):
    """The exported model: the recipe's two towers as a SigLIP `LitModel`
    (its image tower a ViT with the MAP head; NaFlex's with `posemb_grid`,
    its table resized to each image's grid), which every tool opens."""
    m = self.config.model
    image = {k: v for k, v in self.model.image.items()
             if k not in ('posemb', 'max_grid')}
    image.update(classifier='map', posemb='learn')
    if m.naflex:
      image['posemb_grid'] = (m.image.max_grid,) * 2
    return lit.LitModel(
        image=image, text_model='text_transformer', text=m.text.to_dict(),
        out_dim=m.out_dim, temperature_init=m.temperature_init,
        bias_init=m.bias_init, model_name=self.config.model_name,
        pp={'tokenizer_name': 'sentencepiece', 'max_len': m.text_max_len,
            'size': self.config.pp.crop})

  def exported_files(self, params):
    """The two towers in `LitModel`'s tree (`towers`); LocCa's decoder
    beside, in `.decoder.npz`. The heads of SILC and TIPS and the mask
    token are the recipe's training aids, not exported."""
    img = {k: v for k, v in params['img'].items() if k != 'mask_token'}
    if 'img_pool' in params:
      img['MAPHead_0'] = params['img_pool']
    img['head'] = params['img_head']
    out = {'': {'img': img, 'txt': params['txt'], 't': params['t'],
                'b': params['b']}}
    if 'text_decoder' in params:
      out['.decoder'] = {'text_decoder': params['text_decoder']}
    return out

  def exported_records(self):
    """The towers' record, naming the tokenizer beside (`vocab`)."""
    return {'': {**record.of_run(self.config, self.towers),
                 'vocab': 'vocab.model'}}

  def finish(self, params, workdir):
    """Beside the export: the vocabulary."""
    del params
    if jax.process_index():
      return
    source = locca.vocabulary(self.config, workdir, 0, fit=False)
    npz = storage.join(workdir, f'{self.config.model_name}.npz')
    files.beside(npz, 'vocab.model').write_bytes(
        epath.Path(source).read_bytes())

