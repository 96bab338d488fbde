"""SigLIP 2's recipe, term by term: the decoder's sequences (box tokens)
and loss, SILC's and TIPS' cross-entropies, and one whole step's terms
against numpy written from the papers' equations; the switch-on of
self-distillation at `ssl_start`; the exported towers against the
recipe's model."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tasks import siglip2_common
from vit_jax import launch
from vit_jax import losses
from vit_jax.checkpoints import record
from vit_jax.data import locca
from vit_jax.data import tokenizers
from vit_jax.models import dino as models_dino
from vit_jax.models import lit
from vit_jax.models import posemb
from vit_jax.run import loop
from vit_jax.run import optim
from vit_jax.tasks import dino
from vit_jax.tasks import siglip2


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _softmax(x):
  return np.exp(_log_softmax(x))


@pytest.fixture(scope='module')
def tokenizer(tmp_path_factory):
  texts = ['a bag to the left of a shirt', 'the bag', 'the shirt on the left',
           'a coat', 'the coat at the top'] * 20
  path = str(tmp_path_factory.mktemp('spm') / 'vocab.model')
  tokenizers.train_sentencepiece(texts, path, 40)
  return tokenizers.get_tokenizer('sentencepiece', path, 16)


def test_decoder_sequences_hold_box_tokens(tokenizer):
  bins, v, eos = 11, tokenizer.vocab_size, tokenizer.eos_token
  box = np.array([0.1, 0.25, 0.5, 1.0])
  out = locca.sequences(tokenizer, ['a bag to the left of a shirt', 'a coat'],
                        ['the bag', ''], np.stack([box, np.zeros(4)]),
                        np.array([True, False]), bins=bins, max_len=20)
  assert out['inputs'].shape == (2, 3, 20)
  pieces = lambda t: locca.text_ids(tokenizer, [t])[0]
  caption, phrase = pieces('a bag to the left of a shirt'), pieces('the bag')
  quantized = np.rint(box * (bins - 1)).astype(int)  # 1, 2, 5, 10
  np.testing.assert_array_equal(quantized, [1, 2, 5, 10])
  boxes = list(v + 3 + quantized)
  want = {0: [v] + caption + [eos], 1: [v + 1] + phrase + boxes + [eos],
          2: [v + 2] + boxes + phrase + [eos]}
  scored_from = {0: 1, 1: 1 + len(phrase), 2: 1 + 4}
  for t, seq in want.items():
    n = len(seq) - 1
    np.testing.assert_array_equal(out['inputs'][0, t, :n], seq[:-1])
    np.testing.assert_array_equal(out['targets'][0, t, :n], seq[1:])
    weights = np.zeros(20)
    weights[scored_from[t] - 1:n] = 1
    np.testing.assert_array_equal(out['weights'][0, t], weights)
  # No object: only the caption is scored.
  assert out['weights'][1, 0].sum() == len(pieces('a coat')) + 1
  assert not out['weights'][1, 1:].any()
  np.testing.assert_allclose(locca.dequantize(quantized, bins),
                             quantized / 10)


def test_decoder_loss_is_the_mean_of_each_tasks_cross_entropy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3 * 4, 6, 9)).astype(np.float32)
  targets = rng.integers(0, 9, (12, 6))
  weights = (rng.uniform(size=(12, 6)) < 0.6).astype(np.float32)
  weights[8:] = 0  # the third task has nothing scored: left out
  got = siglip2.decoder_loss(jnp.asarray(logits), jnp.asarray(targets),
                             jnp.asarray(weights))
  nll = -np.take_along_axis(_log_softmax(logits), targets[..., None],
                            -1)[..., 0]
  per_task = [np.sum(nll[r] * weights[r]) / np.sum(weights[r])
              for r in (slice(0, 4), slice(4, 8))]
  np.testing.assert_allclose(got, np.mean(per_task), rtol=1e-5)


def _numpy_silc(student, teacher, center, t_temp, s_temp):
  """SILC: each local view's cross-entropy to the global view's target."""
  q = _softmax((teacher - center) / t_temp)
  terms = [np.mean(-np.sum(q * _log_softmax(s / s_temp), -1))
           for s in student]
  return np.mean(terms)


def _numpy_tips(student, teacher, center, mask, t_temp, s_temp):
  """TIPS (iBOT's term): per image the mean over its masked patches of the
  cross-entropy to the teacher's target there; the batch's mean."""
  per_image = []
  for s, t, m in zip(student, teacher, mask):
    q = _softmax((t[m] - center) / t_temp)
    per_image.append(np.mean(-np.sum(q * _log_softmax(s[m] / s_temp), -1)))
  return np.mean(per_image)


def test_silc_loss():
  rng = np.random.default_rng(1)
  student, teacher = rng.normal(size=(4, 5, 7)), rng.normal(size=(5, 7))
  center = rng.normal(size=(1, 7)) * 0.2
  got = losses.silc_loss(
      jnp.asarray(student, jnp.float32),
      losses.centered_softmax(jnp.asarray(teacher), center, 0.04), 0.1)
  np.testing.assert_allclose(
      got, _numpy_silc(student, teacher, center, 0.04, 0.1), rtol=1e-5)


# The task, one step at a time.


@pytest.fixture(scope='module')
def dirs(tmp_path_factory, fmnist_dirs):
  return siglip2_common.prepare(tmp_path_factory, fmnist_dirs)


def _start(config, workdir):
  task = launch.make_task(config, str(workdir))
  params = jax.jit(task.init_params)(jax.random.key(0))
  state = loop.TrainState.create(
      apply_fn=task.model.apply, params=params,
      tx=optim.make_optimizer(config, task.param_labels))
  batch = next(task.batches(batch_size=8, rows=None, start_step=0))
  step = jax.jit(lambda s, b: task.train_step(s, b, rng=jax.random.key(1)))
  return task, state, batch, step


def _outputs(model, p, teacher, batch, mask, inputs, parallel):
  """The model's outputs that the terms are made of (one jitted call)."""
  apply = lambda params, *a, **kw: model.apply({'params': params}, *a, **kw)
  pooled, tokens = apply(p, batch['image'], method='image_features')
  t_pooled, t_tokens = apply(teacher, batch['global'][:, 0],
                             method='image_features')
  local = dino.crop_major(batch['local'])
  _, s_tokens = apply(p, batch['global'][:, 0], mask=mask,
                      method='image_features')
  return {
      'x': apply(p, pooled, method='embed_image'),
      'y': apply(p, batch['tokens'], method='embed_text'),
      'decoder': apply(p, jnp.concatenate([tokens] * 3), inputs,
                       parallel=parallel, method='logits'),
      't_cls': apply(teacher, t_pooled, method='silc_scores'),
      's_cls': apply(p, apply(p, local, method='image_features')[0],
                     method='silc_scores'),
      't_patch': apply(teacher, t_tokens, method='tips_scores'),
      's_patch': apply(p, s_tokens, method='tips_scores')}


def _check_terms(config, task, state, batch, metrics):
  """Each term of the step from `state` (self-distillation on) against
  numpy of the model's outputs, and the loss their weighted sum."""
  s, model, p = config.siglip2, task.model, state.params['student']
  rng = jax.random.fold_in(jax.random.key(1), state.step)
  rng_parallel, rng_mask, _ = jax.random.split(rng, 3)
  # The step's draws: captions in parallel, TIPS' masks.
  parallel = np.asarray(jax.random.uniform(rng_parallel, (8,)) < 0.5)
  inputs, targets, weights = (np.swapaxes(batch[k], 0, 1).reshape(24, -1)
                              for k in ('inputs', 'targets', 'weights'))
  inputs[:8][parallel, 1:] = model.decoder['vocab_size']  # [MASK]
  grid = posemb.token_grid(model.image, (56, 56))
  mask = models_dino.random_masks(
      rng_mask, 8, grid[0] * grid[1], probability=1.,
      ratio=(s.mask_ratio, s.mask_ratio))[0]
  assert np.asarray(mask).sum() == 0.5 * 64 * 8  # half of each image's
  # The teacher is the student at the switch.
  chex.assert_trees_all_equal(state.params['teacher'],
                              {k: p[k] for k in siglip2.TEACHER_KEYS})
  out = jax.tree.map(np.asarray, jax.jit(
      lambda *a: _outputs(model, *a))(
          p, {**p, **state.params['teacher']}, batch, mask,
          jnp.asarray(inputs),
          jnp.concatenate([parallel, np.zeros(16, bool)])))

  # Sigmoid: -sum_ij log sigmoid(z_ij (t x_i . y_j + b)) / n.
  x, y = out['x'].astype(np.float64), out['y'].astype(np.float64)
  logits = np.exp(p['t'][0]) * x @ y.T + p['b'][0]
  labels = 2 * np.eye(8) - 1
  sigmoid = np.sum(np.log1p(np.exp(-labels * logits))) / 8
  np.testing.assert_allclose(metrics['sigmoid_loss'], sigmoid, rtol=1e-4)

  # The decoder: each task's weighted token cross-entropy, their mean.
  nll = -np.take_along_axis(_log_softmax(out['decoder']), targets[..., None],
                            -1)[..., 0]
  per_task = [np.sum(nll[r] * weights[r]) / np.sum(weights[r])
              for r in (slice(0, 8), slice(8, 16), slice(16, 24))
              if weights[r].sum()]
  np.testing.assert_allclose(metrics['decoder_loss'], np.mean(per_task),
                             rtol=1e-4)
  vocab = task.tokenizer.vocab_size
  assert ((targets[8:16] >= vocab + 3) & (weights[8:16] > 0)).sum(1).max() \
      == 4  # a ref row scores its box's 4 tokens

  # SILC: 2 local views against the global one; TIPS at the masked patches.
  silc = _numpy_silc(out['s_cls'].reshape(2, 8, -1), out['t_cls'], 0.,
                     s.teacher_temp, s.student_temp)
  np.testing.assert_allclose(metrics['silc_loss'], silc, rtol=1e-4)
  tips = _numpy_tips(out['s_patch'], out['t_patch'], 0., np.asarray(mask),
                     s.teacher_temp, s.student_temp)
  np.testing.assert_allclose(metrics['tips_loss'], tips, rtol=1e-4)
  np.testing.assert_allclose(
      metrics['loss'], sigmoid + np.mean(per_task) + s.ssl_factor * (
          s.silc_weight * silc + s.tips_weight * tips), rtol=1e-4)


def test_self_distillation_switches_on_at_its_step(dirs, tmp_path):
  """Before `ssl_start` the teacher is the student and the heads wait;
  from it, the teacher is the EMA and the centre moves; that step's terms
  are the equations (`_check_terms`)."""
  config = siglip2_common.small_config('siglip2', dirs, ssl_start=0.5)
  config.total_steps, config.warmup_steps = 2, 0
  task, state, batch, step = _start(config, tmp_path)
  heads0 = {k: state.params['student'][k] for k in ('silc', 'tips')}
  token0 = state.params['student']['img']['mask_token']
  one, metrics = step(state, batch)
  assert float(metrics['ssl_active']) == 0 and metrics['silc_loss'] == 0
  student = one.params['student']
  chex.assert_trees_all_equal(
      one.params['teacher'], {k: student[k] for k in siglip2.TEACHER_KEYS})
  chex.assert_trees_all_equal({k: student[k] for k in heads0}, heads0)
  np.testing.assert_array_equal(student['img']['mask_token'], token0)
  np.testing.assert_array_equal(one.params['center'], 0)
  assert not np.allclose(student['img']['embedding']['kernel'],
                         state.params['student']['img']['embedding']['kernel'])

  two, metrics = step(one, batch)
  assert float(metrics['ssl_active']) == 1 and metrics['silc_loss'] > 0
  _check_terms(config, task, one, batch, metrics)
  m = config.siglip2.momentum_teacher  # the cosine's start, at the switch
  assert float(metrics['teacher_momentum']) == pytest.approx(m)
  new = two.params['student']
  chex.assert_trees_all_close(
      two.params['teacher'],
      jax.tree.map(lambda t, s: m * t + (1 - m) * s, one.params['teacher'],
                   {k: new[k] for k in siglip2.TEACHER_KEYS}),
      rtol=1e-5, atol=1e-7)
  assert not np.allclose(new['silc']['Dense_0']['kernel'],
                         heads0['silc']['Dense_0']['kernel'])
  assert not np.allclose(two.params['center'], 0)


@pytest.mark.parametrize('arm', ['siglip', 'siglip2_naflex'])
def test_the_export_is_the_recipes_towers(dirs, tmp_path, arm):
  """The exported tree in the record's `LitModel` embeds images and texts
  as the recipe's model does (NaFlex: a ViT with `posemb_grid` for the
  NaViT on padded sequences; SILC's mask token and heads left out)."""
  config = siglip2_common.small_config(arm, dirs)
  task = launch.make_task(config, str(tmp_path))
  params = jax.jit(task.init_params)(jax.random.key(0))['student']
  params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(
      jax.random.key(1), x.shape), params)  # no zero-initialized heads
  towers = task.exported_files(params)['']
  name, settings = record.settings(task.exported_records()[''])
  model = lit.LitModel(**{k: v for k, v in settings.items()
                          if k != 'model_name'})
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (2, 56, 56, 3)).astype(np.float32)
  tokens = rng.integers(1, 64, (2, config.model.text_max_len))
  got = model.apply({'params': towers}, images=images, tokens=tokens)
  want = task.model.apply({'params': params}, images=images, tokens=tokens)
  assert name == config.model_name
  for a, b in zip(got[:2], want[:2]):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got[2]['b'], want[2]['b'])
