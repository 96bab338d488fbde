"""SigLIP 2's recipe, term by term: the decoder's sequences (box tokens)
and loss, SILC's and TIPS' cross-entropies, and one whole step's terms
against numpy written from the papers' equations
(tests/tasks/siglip2_reference.py); the switch-on of self-distillation at
`ssl_start` (both on the steps of `siglip2_runs`' 1-device run); the
exported towers against the recipe's model."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tasks import siglip2_common
from tests.tasks import siglip2_reference
from vit_jax import launch
from vit_jax import losses
from vit_jax.checkpoints import record
from vit_jax.data import locca
from vit_jax.data import tokenizers
from vit_jax.models import lit
from vit_jax.tasks import siglip2

pytestmark = pytest.mark.xdist_group('siglip2')  # `siglip2_runs` once


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
  nll = -np.take_along_axis(siglip2_reference.log_softmax(logits), targets[..., None],
                            -1)[..., 0]
  per_task = [np.sum(nll[r] * weights[r]) / np.sum(weights[r])
              for r in (slice(0, 4), slice(4, 8))]
  np.testing.assert_allclose(got, np.mean(per_task), rtol=1e-5)


def test_silc_loss():
  rng = np.random.default_rng(1)
  student, teacher = rng.normal(size=(4, 5, 7)), rng.normal(size=(5, 7))
  center = rng.normal(size=(1, 7)) * 0.2
  got = losses.silc_loss(
      jnp.asarray(student, jnp.float32),
      losses.centered_softmax(jnp.asarray(teacher), center, 0.04), 0.1)
  np.testing.assert_allclose(
      got, siglip2_reference.numpy_silc(student, teacher, center, 0.04, 0.1),
      rtol=1e-5)


# The switch-on of self-distillation, on the steps of the 1-device run.


def test_self_distillation_switches_on_at_its_step(siglip2_runs):
  """Before `ssl_start` (steps 0 and 1) the teacher is the student and the
  heads wait; from it (step 2), the teacher is the EMA and the centre
  moves; that step's terms are the equations
  (`siglip2_reference.check_terms`)."""
  runs = siglip2_runs  # tests/tasks/conftest.py
  config, task, steps = runs['config'], runs['task'], runs['steps']
  assert len(steps) == 4 and siglip2.ssl_start_step(config) == 2
  start = steps[0][0].params['student']
  heads0 = {k: start[k] for k in ('silc', 'tips')}
  for _, _, after, metrics in steps[:2]:
    assert float(metrics['ssl_active']) == 0 and metrics['silc_loss'] == 0
    student = after.params['student']
    chex.assert_trees_all_equal(
        after.params['teacher'],
        {k: student[k] for k in siglip2.TEACHER_KEYS})
    chex.assert_trees_all_equal({k: student[k] for k in heads0}, heads0)
    np.testing.assert_array_equal(student['img']['mask_token'],
                                  start['img']['mask_token'])
    np.testing.assert_array_equal(after.params['center'], 0)
  assert not np.allclose(student['img']['embedding']['kernel'],
                         start['img']['embedding']['kernel'])

  one, batch, two, metrics = steps[2]
  assert float(metrics['ssl_active']) == 1 and metrics['silc_loss'] > 0
  rng = jax.random.split(jax.random.key(config.seed))[1]  # the loop's
  siglip2_reference.check_terms(config, task, one, batch, metrics, rng)
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


# The export.


@pytest.mark.parametrize('arm', ['siglip', 'siglip2_naflex'])
def test_the_export_is_the_recipes_towers(siglip2_dirs, tmp_path, arm):
  """The exported tree in the record's `LitModel` embeds images and texts
  as the recipe's model does (NaFlex: a ViT with `posemb_grid` for the
  NaViT on padded sequences; SILC's mask token and heads left out)."""
  config = siglip2_common.small_config(arm, siglip2_dirs)
  task = launch.make_task(config, str(tmp_path))
  # Random draws of the student's shapes (no zero-initialized heads), not
  # its initialization: compiling that costs as much as a step.
  leaves, tree = jax.tree.flatten(
      jax.eval_shape(task.init_params, jax.random.key(0))['student'])
  draws = np.random.default_rng(1)
  params = jax.tree.unflatten(tree, [
      draws.normal(0, 0.5, x.shape).astype(x.dtype) for x in leaves])
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
