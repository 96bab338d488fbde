"""`trainer='beit_tokenizer'` and `trainer='beit'` (`tasks/beit.py`): one
step of each against its equations, export and fine-tuning, 1 device
against 8, a crash and resume, and the settings refused before compiling
(the command line's one error line: tests/end_to_end/test_cli.py)."""

import json

import chex
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special

from tests.conftest import crashed_and_resumed
from vit_jax import checkpoint  # the original's module name
from vit_jax import launch
from vit_jax.checkpoints import files
from vit_jax.configs import beit_fmnist
from vit_jax.data import pipeline
from vit_jax.evaluators import codebook as codebook_eval
from vit_jax.models import beit as models_beit
from vit_jax.models import vit as models_vit
from vit_jax.run import loop
from vit_jax.run import optim
from vit_jax.tasks import beit

pytestmark = pytest.mark.xdist_group('beit')


def _small(arm, fmnist_dirs, **kw):
  """configs/beit_fmnist.py's `arm` as a short job on tiny data."""
  config = beit_fmnist.get_config(arm).unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.total_steps, config.warmup_steps = 3, 1
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 100
  config.progress_every, config.checkpoint_every = 1, 0
  config.model.hidden_size = 16
  config.model.transformer.update(num_layers=2, mlp_dim=32, num_heads=2)
  if 'beit' in config:
    config.beit.tokenizer.update(codebook_size=16, code_dim=8)
    config.beit.tokenizer.decoder.update(hidden_size=16, num_layers=1,
                                         num_heads=2, mlp_dim=32)
    config.beit.update(kw)
  if 'fewshot' in config.evals:
    config.evals.fewshot.update(shots=(2,), seeds=1)
  return config


def _teacher(config, path):
  """A ViT of `config.model` at initialization, as a teacher's .npz."""
  model = models_vit.VisionTransformer(num_classes=None, **config.model)
  params = model.init(jax.random.key(5), jnp.zeros((1, 28, 28, 3)),
                      train=False)['params']
  files.save(params, str(path))
  return str(path)


@pytest.fixture(scope='module')
def dvae_dir(fmnist_dirs, tmp_path_factory):
  """A dVAE tokenizer's workdir, trained 3 steps."""
  workdir = str(tmp_path_factory.mktemp('dvae'))
  launch.train_and_evaluate(_small('dvae_tokenizer', fmnist_dirs), workdir)
  return workdir


def _state(task, config):
  params = jax.jit(task.init_params)(jax.random.key(0))
  return loop.TrainState.create(
      apply_fn=task.model.apply, params=params,
      tx=optim.make_optimizer(config, task.param_labels))


def test_vqkd_step_is_the_equations(fmnist_dirs, tmp_path):
  """One step: the loss is 1 - cosine to the teacher's features plus the
  commitment; the codebook then moves by the EMA of its assignments."""
  config = _small('vqkd_tokenizer', fmnist_dirs, restart_threshold=0.)
  config.beit.tokenizer.restart_threshold = 0.
  config.beit.tokenizer.teacher_path = _teacher(config, tmp_path / 't.npz')
  task = launch.make_task(config, str(tmp_path))
  state = _state(task, config)
  batch = next(task.batches(batch_size=8, rows=None, start_step=0))
  new, metrics = jax.jit(lambda s, b, f: task.train_step(
      s, b, rng=jax.random.key(1), frozen=f))(state, batch, task.frozen)
  images = batch['image']
  out = task.model.apply({'params': state.params['tokenizer']}, images,
                         train=True)
  teacher = task.teacher.apply(
      {'params': task.frozen['teacher']}, images, indices=1, norm=True,
      output_fmt='NLC', intermediates_only=True,
      method='forward_intermediates')[0]
  pred, target = np.asarray(out['pred']), np.asarray(teacher)
  cos = np.sum(pred * target, -1) / (np.linalg.norm(pred, axis=-1) *
                                     np.linalg.norm(target, axis=-1))
  np.testing.assert_allclose(metrics['reconstruction'], np.mean(1 - cos),
                             rtol=1e-4)
  z = np.asarray(out['z']).reshape(-1, 8)
  book = np.asarray(state.params['tokenizer']['codebook'])
  book = book / np.linalg.norm(book, axis=-1, keepdims=True)
  index = np.argmax(z @ book.T, -1)
  commit = np.mean(np.sum((z - book[index])**2, -1))
  np.testing.assert_allclose(metrics['loss'],
                             np.mean(1 - cos) + 0.25 * commit, rtol=1e-4)
  counts = np.bincount(index, minlength=16)
  np.testing.assert_allclose(new.params['usage'], 0.01 * counts, rtol=1e-5)
  d, unit = 0.99, lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  for k in np.flatnonzero(counts)[:3]:
    want = unit(d * book[k] + (1 - d) * unit(z[index == k].sum(0)))
    np.testing.assert_allclose(new.params['tokenizer']['codebook'][k], want,
                               rtol=1e-4, atol=1e-6)


def test_beit_step_predicts_the_masked_codes(fmnist_dirs, dvae_dir, tmp_path):
  """The step's loss is the cross-entropy of the tokenizer's codes on the
  block-masked patches only, the masks those of the step's key."""
  config = _small('dvae', fmnist_dirs, tokenizer_path=dvae_dir)
  task = launch.make_task(config, str(tmp_path))
  state = _state(task, config)
  batch = next(task.batches(batch_size=8, rows=None, start_step=0))
  rng = jax.random.key(1)
  _, metrics = jax.jit(lambda s, b, f: task.train_step(
      s, b, rng=rng, frozen=f))(state, batch, task.frozen)
  mask_rng, _ = jax.random.split(jax.random.fold_in(rng, 0))
  mask = np.asarray(models_beit.block_masks(mask_rng, 8, (4, 4), 6,
                                            min_patches=2))
  assert metrics['masked_fraction'] == pytest.approx(mask.mean())
  assert 0 < mask.sum(1).min() and mask.sum(1).max() <= 6
  codes = np.asarray(task.tokenizer.apply(
      {'params': task.frozen['tokenizer']}, batch['image'], method='tokens'))
  logits = np.asarray(task.model.apply({'params': state.params},
                                       batch['image'], train=False,
                                       mask=jnp.asarray(mask)), np.float64)
  log_p = logits - scipy.special.logsumexp(logits, -1, keepdims=True)
  nll = -np.take_along_axis(log_p, codes[..., None], -1)[..., 0]
  np.testing.assert_allclose(metrics['loss'], nll[mask].mean(), rtol=1e-4)


def test_tokenizer_then_beit_export_and_fine_tune(fmnist_dirs, tmp_path):
  """VQ-KD tokenizer -> BEiT -> an encoder in the published layout that
  `checkpoint.load` reads and fine-tuning (with layer decay) starts from."""
  config = _small('vqkd_tokenizer', fmnist_dirs)
  config.beit.tokenizer.teacher_path = _teacher(config, tmp_path / 't.npz')
  tokenizer_dir = tmp_path / 'tokenizer'
  launch.train_and_evaluate(config, str(tokenizer_dir))
  npz = tokenizer_dir / 'ViT-fmnist.tokenizer.npz'
  results = json.loads((tokenizer_dir / 'results.json').read_text())
  model, params, record = beit.load_tokenizer(str(npz))
  assert record['model']['kind'] == 'vqkd' and model.codebook_size == 16
  info = pipeline.dataset_info(pipeline.get_builder(config), config)
  counts = np.zeros(16, int)
  for batch in pipeline.eval_batches(info, config, batch_size=8):
    tokens = model.apply({'params': params}, batch['image'], method='tokens')
    counts += np.bincount(np.asarray(tokens)[batch['mask'] > 0].reshape(-1),
                          minlength=16)
  assert results['codebook_usage'] == pytest.approx(np.mean(counts > 0))
  assert results['codebook_perplexity'] == pytest.approx(
      codebook_eval.usage(counts)[1], rel=1e-6)

  config = _small('vqkd', fmnist_dirs, tokenizer_path=str(tokenizer_dir))
  final = jax.device_get(launch.train_and_evaluate(config,
                                                   str(tmp_path / 'beit')))
  results = json.loads((tmp_path / 'beit' / 'results.json').read_text())
  assert 0 <= results['knn_accuracy'] <= 1 and 0 <= results[
      'fewshot_2shot'] <= 1
  exported = checkpoint.load(str(tmp_path / 'beit' / 'ViT-fmnist.npz'))
  encoder = dict(final['encoder'])
  assert 'mask_token' in encoder and 'mask_token' not in exported
  del encoder['mask_token']
  jax.tree.map(np.testing.assert_array_equal, exported, encoder)
  finetune = _small('finetune', fmnist_dirs)
  assert finetune.layer_decay == 0.65
  finetune.pretrained_path = str(tmp_path / 'beit' / 'ViT-fmnist.npz')
  launch.train_and_evaluate(finetune, str(tmp_path / 'finetune'))


def _resumable(fmnist_dirs, dvae_dir):
  """6 steps of 16 images, a checkpoint every 3: the run that the crash
  test interrupts and that the 1-device run repeats."""
  config = _small('dvae', fmnist_dirs, tokenizer_path=dvae_dir)
  config.batch, config.total_steps, config.warmup_steps = 16, 6, 2
  config.checkpoint_every, config.progress_every = 3, 2
  config.evals.knn.every = config.evals.fewshot.every = None
  return config


@pytest.fixture(scope='module')
def uninterrupted(fmnist_dirs, dvae_dir, tmp_path_factory):
  """`_resumable`'s run on the 8 devices that never stopped: the reference
  of both the 1-device run and the crashed one."""
  workdir = str(tmp_path_factory.mktemp('beit_whole'))
  return jax.device_get(launch.train_and_evaluate(
      _resumable(fmnist_dirs, dvae_dir), workdir))


def test_one_device_equals_eight(fmnist_dirs, dvae_dir, uninterrupted,
                                 tmp_path, monkeypatch):
  assert jax.device_count() == 8
  p8 = uninterrupted
  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  config = _resumable(fmnist_dirs, dvae_dir)
  config.checkpoint_every = 0  # saves change no parameter
  p1 = launch.train_and_evaluate(config, str(tmp_path))
  # A key bias's gradient is 0 in exact arithmetic (the softmax ignores
  # it): AdamW turns its rounding noise into steps of the learning rate's
  # size, which differ with the summation order. Compared apart, loosely.
  flat1, flat8 = (traverse_util.flatten_dict(p, sep='/') for p in (p1, p8))
  keys = [k for k in flat8 if k.endswith('key/bias')]
  assert len(keys) == 2
  for k in keys:
    assert np.abs(flat1.pop(k)).max() < 1e-3 > np.abs(flat8.pop(k)).max()
  chex.assert_trees_all_close(flat1, flat8, rtol=1e-4, atol=1e-6)
  assert not np.allclose(p8['encoder']['mask_token'], 0)  # it learned


def test_bad_settings_fail_before_compiling(fmnist_dirs, dvae_dir, tmp_path):
  cases = [('dvae', dict(mask_ratio=0.), r'mask_ratio=0.0 must be in'),
           ('dvae', dict(mask_ratio=1.5), r'mask_ratio=1.5 must be in'),
           ('dvae', dict(min_patches=7), r'min_patches=7 must be in \[1, 6\]'),
           ('dvae', dict(tokenizer_path=str(tmp_path / 'none.npz')),
            'no such file'),
           ('dvae', dict(tokenizer_path=''),
            'needs config.beit.tokenizer_path')]
  for i, (arm, kw, match) in enumerate(cases):
    config = _small(arm, fmnist_dirs, tokenizer_path=dvae_dir)
    config.beit.update(kw)
    with pytest.raises((ValueError, FileNotFoundError), match=match):
      launch.train_and_evaluate(config, str(tmp_path / str(i)))
  not_tokenizer = _teacher(_small('dvae', fmnist_dirs), tmp_path / 'v.npz')
  config = _small('dvae', fmnist_dirs, tokenizer_path=not_tokenizer)
  with pytest.raises(files.CheckpointError, match='not a visual tokenizer'):
    launch.train_and_evaluate(config, str(tmp_path / 'vit'))
  config = _small('dvae', fmnist_dirs, tokenizer_path=dvae_dir)
  config.model.patches.size = (14, 14)
  with pytest.raises(ValueError, match='use the same patch size'):
    launch.train_and_evaluate(config, str(tmp_path / 'grid'))
  tokenizer_cases = [(dict(codebook_size=1), 'codebook_size=1 must be'),
                     (dict(kind='dalle'), "kind='dalle'"),
                     (dict(codebook_update='kmeans'), "'kmeans'"),
                     (dict(ema_decay=1.0), 'ema_decay=1.0'),
                     (dict(teacher_path=''), 'set config.beit.tokenizer'
                      '.teacher_path')]
  for i, (kw, match) in enumerate(tokenizer_cases):
    config = _small('vqkd_tokenizer', fmnist_dirs)
    config.beit.tokenizer.update(kw)
    with pytest.raises(ValueError, match=match):
      launch.train_and_evaluate(config, str(tmp_path / f't{i}'))
  config = _small('vqkd_tokenizer', fmnist_dirs)
  config.beit.tokenizer.teacher_path = str(tmp_path / 'missing.npz')
  with pytest.raises(FileNotFoundError, match='teacher_path'):
    launch.train_and_evaluate(config, str(tmp_path / 'teacher'))


def test_a_crash_resumes_to_the_same_state(fmnist_dirs, dvae_dir,
                                           uninterrupted, tmp_path,
                                           monkeypatch, capsys):
  """The masked-image stream, the frozen tokenizer and the optimizer all
  resume: a run that crashed after its step-3 checkpoint, rerun, ends where
  one that never stopped does. (A kill -9 of the loop, which this task does
  not change: tests/end_to_end/test_main.py.)"""
  # Batch 4 is step 5's, after step 3's checkpoint.
  resumed = crashed_and_resumed(_resumable(fmnist_dirs, dvae_dir), tmp_path,
                                monkeypatch, 4)
  assert 'Resuming from step 3 ' in capsys.readouterr().out
  chex.assert_trees_all_close(resumed, uninterrupted, rtol=1e-5, atol=1e-6)
