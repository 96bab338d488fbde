"""SigLIP 2's terms written from the papers' equations in numpy (SILC's and
TIPS' cross-entropies), and `check_terms`: one step's metrics against them,
from the model's outputs."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import dino as models_dino
from vit_jax.models import posemb
from vit_jax.tasks import dino
from vit_jax.tasks import siglip2


def log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def softmax(x):
  return np.exp(log_softmax(x))


def numpy_silc(student, teacher, center, t_temp, s_temp):
  """SILC: each local view's cross-entropy to the global view's target."""
  q = softmax((teacher - center) / t_temp)
  terms = [np.mean(-np.sum(q * log_softmax(s / s_temp), -1))
           for s in student]
  return np.mean(terms)


def numpy_tips(student, teacher, center, mask, t_temp, s_temp):
  """TIPS (iBOT's term): per image the mean over its masked patches of the
  cross-entropy to the teacher's target there; the batch's mean."""
  per_image = []
  for s, t, m in zip(student, teacher, mask):
    q = softmax((t[m] - center) / t_temp)
    per_image.append(np.mean(-np.sum(q * log_softmax(s[m] / s_temp), -1)))
  return np.mean(per_image)


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


def check_terms(config, task, state, batch, metrics, rng):
  """Each term of the step from `state` (self-distillation on) against
  numpy of the model's outputs, and the loss their weighted sum."""
  s, model, p = config.siglip2, task.model, state.params['student']
  rng = jax.random.fold_in(rng, state.step)
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
  nll = -np.take_along_axis(log_softmax(out['decoder']), targets[..., None],
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
  silc = numpy_silc(out['s_cls'].reshape(2, 8, -1), out['t_cls'], 0.,
                    s.teacher_temp, s.student_temp)
  np.testing.assert_allclose(metrics['silc_loss'], silc, rtol=1e-4)
  tips = numpy_tips(out['s_patch'], out['t_patch'], 0., np.asarray(mask),
                    s.teacher_temp, s.student_temp)
  np.testing.assert_allclose(metrics['tips_loss'], tips, rtol=1e-4)
  np.testing.assert_allclose(
      metrics['loss'], sigmoid + np.mean(per_task) + s.ssl_factor * (
          s.silc_weight * silc + s.tips_weight * tips), rtol=1e-4)
