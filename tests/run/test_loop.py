"""Training loop: steps, sharding, resume, preemption, errors."""

import glob
import os
import signal

import chex
import jax
import numpy as np
import optax
import pytest

from tests.conftest import interrupt_at
from tests.conftest import make_tiny_config
from vit_jax import inference_time
from vit_jax import launch
from vit_jax.data import pipeline
from vit_jax.run import loop
from vit_jax.platform import sharding
from vit_jax.tasks import classification


@pytest.fixture(scope='module')
def reference(tmp_path_factory, fmnist_dirs):
  """An uninterrupted 6-step run (checkpoints every 2 steps)."""
  config = make_tiny_config(fmnist_dirs)
  workdir = str(tmp_path_factory.mktemp('reference'))
  return config, workdir, jax.device_get(launch.train_and_evaluate(config,
                                                                  workdir))


def test_trains_and_reports(reference, capsys):
  config, workdir, params = reference
  steps = sorted(int(os.path.basename(p)) for p in
                 glob.glob(f'{workdir}/checkpoints/*') if
                 os.path.basename(p).isdigit())
  assert steps[-1] == 6 and len(steps) <= config.max_to_keep
  assert glob.glob(f'{workdir}/events.out.tfevents.*')
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  # A finished workdir returns its final params without training.
  again = launch.train_and_evaluate(config, workdir)
  chex.assert_trees_all_equal(jax.device_get(again), params)
  assert 'nothing to train' in capsys.readouterr().out


def test_progress_eval_and_metrics(tiny_config, tmp_path, capsys):
  tiny_config.evals.test.every = 3
  launch.train_and_evaluate(tiny_config, str(tmp_path))
  out = capsys.readouterr().out
  assert '[2/6] loss' in out and 'img/s' in out and 'ETA' in out
  assert '[3/6] test accuracy' in out and '(37 examples)' in out
  assert 'Done: 6 steps, test accuracy' in out
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  tags = set(events.Tags()['tensors']) | set(events.Tags()['scalars'])
  assert {'train_loss', 'learning_rate', 'img_per_sec', 'eval_accuracy',
          'eval_loss'} <= tags


def test_progress_bar(tiny_config, tmp_path, capsys):
  tiny_config.progress_bar = True
  launch.train_and_evaluate(tiny_config, str(tmp_path))
  out, err = capsys.readouterr()
  assert '6/6' in err and 'loss=' in err  # tqdm writes to stderr
  assert '[2/6] loss' not in out and 'Done: 6 steps' in out


def test_learns(tiny_config, tmp_path):
  """The class is visible in the fake images; a short run must find it."""
  tiny_config.model.hidden_size = 32
  tiny_config.model.transformer.mlp_dim = 32
  tiny_config.total_steps = 60
  tiny_config.batch = 16
  tiny_config.optimizer = 'adamw'
  tiny_config.base_lr = 3e-3
  tiny_config.pp.area_min = 1.0
  tiny_config.pp.flip = False
  tiny_config.checkpoint_every = 0
  tiny_config.progress_every = 20
  info = pipeline.dataset_info(
      pipeline.get_builder(tiny_config), tiny_config)
  params = launch.train_and_evaluate(tiny_config, str(tmp_path))
  model = classification.make_model(tiny_config, 10)
  correct = 0
  for batch in pipeline.eval_batches(info, tiny_config, batch_size=37):
    logits = model.apply({'params': params}, batch['image'], train=False)
    correct += np.sum(logits.argmax(-1) == batch['label'].argmax(-1))
  assert correct / 37 > 0.5  # chance is 0.1


def test_one_device_equals_eight(reference, tmp_path, monkeypatch):
  """The reference run (8 devices) again on 1 device."""
  assert jax.device_count() == 8
  config, _, p8 = reference
  config = config.copy_and_resolve_references()
  config.checkpoint_every = 0  # saves change no parameter
  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  p1 = launch.train_and_evaluate(config, str(tmp_path))
  chex.assert_trees_all_close(p1, p8, rtol=1e-4, atol=1e-6)


def test_sharding_rules_shard_kernels(tiny_config, tmp_path):
  tiny_config.mesh = [('data', 4), ('model', 2)]
  tiny_config.sharding_rules = [('MlpBlock_0/Dense_0/kernel$', (None, 'model'))]
  tiny_config.total_steps = 2
  params = launch.train_and_evaluate(tiny_config, str(tmp_path))
  kernel = params['Transformer']['encoderblock_0']['MlpBlock_0']['Dense_0'][
      'kernel']
  assert kernel.sharding.spec == jax.sharding.PartitionSpec(None, 'model')
  assert params['head']['kernel'].sharding.is_fully_replicated


def test_accumulation_equals_one_big_batch(tiny_config, tmp_path):
  """Two micro-batches of 8 give the update of one batch of 16."""
  tiny_config.total_steps = 3
  tiny_config.batch = 16
  tiny_config.model.transformer.dropout_rate = 0.0
  whole = launch.train_and_evaluate(tiny_config, str(tmp_path / 'whole'))
  tiny_config.accum_steps = 2
  accumulated = launch.train_and_evaluate(tiny_config, str(tmp_path / 'acc'))
  chex.assert_trees_all_close(accumulated, whole, rtol=1e-4, atol=1e-6)
  tiny_config.accum_steps = 1
  tiny_config.batch = 8  # a different stream of data: must differ
  other = launch.train_and_evaluate(tiny_config, str(tmp_path / 'other'))
  assert not np.allclose(other['head']['kernel'], whole['head']['kernel'])


def test_resume_after_crash_equals_uninterrupted(reference, tmp_path,
                                                 monkeypatch):
  """A crash after step 5 (no save since step 4) resumes from step 4."""
  config, _, expected = reference

  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, 5, crash)
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(config, str(tmp_path))
  monkeypatch.undo()
  resumed = launch.train_and_evaluate(config, str(tmp_path))
  chex.assert_trees_all_close(resumed, expected, rtol=1e-6, atol=1e-7)


def test_a_crash_finishes_the_save_in_flight(reference, tmp_path,
                                             monkeypatch, capsys):
  """A crash while the first checkpoint (step 2) is still being written
  waits for it: it is kept, not raced by the new workdir's cleanup."""
  config, _, expected = reference

  def crash(batch):  # step 3's batch, fetched just after step 2's save
    del batch
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, 2, crash)
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(config, str(tmp_path))
  assert os.path.isdir(tmp_path / 'checkpoints' / '2')
  monkeypatch.undo()
  capsys.readouterr()
  resumed = launch.train_and_evaluate(config, str(tmp_path))
  assert 'Resuming from step 2' in capsys.readouterr().out
  chex.assert_trees_all_close(resumed, expected, rtol=1e-6, atol=1e-7)


def test_sigterm_saves_then_resume_equals_uninterrupted(reference, tmp_path,
                                                        monkeypatch, capsys):
  config, _, expected = reference
  interrupt_at(monkeypatch, 2,
                lambda batch: os.kill(os.getpid(), signal.SIGTERM))
  launch.train_and_evaluate(config, str(tmp_path))
  assert 'Preempted: saved step 3' in capsys.readouterr().out
  assert os.path.isdir(tmp_path / 'checkpoints' / '3')
  monkeypatch.undo()
  resumed = launch.train_and_evaluate(config, str(tmp_path))
  chex.assert_trees_all_close(resumed, expected, rtol=1e-6, atol=1e-7)


def test_nan_stops_and_keeps_last_good_checkpoint(tiny_config, tmp_path,
                                                  monkeypatch):
  def poison(batch):
    batch['image'][:] = np.nan

  interrupt_at(monkeypatch, 4, poison)
  with pytest.raises(FloatingPointError, match='last good checkpoint is '
                     'step 4'):
    launch.train_and_evaluate(tiny_config, str(tmp_path))
  saved = sorted(os.listdir(tmp_path / 'checkpoints'))
  assert saved == ['2', '4']


def test_mismatched_checkpoint(reference, tmp_path):
  config, workdir, _ = reference
  config = config.copy_and_resolve_references()
  config.model.hidden_size = 12
  with pytest.raises(ValueError, match=r"(?s)other settings.*"
                     r"model.hidden_size: 10 -> 12.*--allow_config_change"):
    launch.train_and_evaluate(config, workdir)
  # Allowed, the checkpoint still cannot fit: its shapes are listed.
  with pytest.raises(ValueError, match=r'(?s)does not fit.*\(checkpoint vs '
                     r'model\).*encoder_norm/bias: \(10,\) vs \(12,\)'):
    launch.train_and_evaluate(config, workdir, allow_config_change=True)


@pytest.mark.parametrize('key,value,match', [
    ('pp.crop', 30, 'pp.crop=30 does not fit testing: sides must be '
     'multiples of its patch size, 16; e.g. --config.pp.crop=16 or 32'),
    ('batch', 12, 'divisible by the 8 devices'),
    ('optimizer', 'lamb', "config.optimizer='lamb'"),
    ('mesh', [('data', 3)], 'do not fit 8 devices'),
    ('warmup_steps', -1, 'warmup_steps'),
    ('weight_decay', 0.1, "weight_decay=0.1 needs optimizer='adamw'"),
])
def test_bad_config(tiny_config, tmp_path, key, value, match):
  if '.' in key:
    tiny_config.pp[key.split('.')[1]] = value
  else:
    tiny_config[key] = value
  with pytest.raises(ValueError, match=match):
    launch.train_and_evaluate(tiny_config, str(tmp_path))


def test_exports_npz_in_the_original_format(reference):
  _, workdir, params = reference
  on_disk = np.load(f'{workdir}/testing.npz', allow_pickle=False)
  assert 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/' \
         'kernel' in on_disk.files
  np.testing.assert_array_equal(on_disk['embedding/kernel'],
                                params['embedding']['kernel'])


def test_fine_tune_at_higher_resolution(reference, tmp_path, capsys):
  """With lr 0 the fine-tuned params are exactly what was loaded."""
  config, workdir, pretrained = reference
  config = config.copy_and_resolve_references()
  config.pretrained_dir = workdir
  config.pp.crop = 48  # the 2x2 patch grid becomes 3x3
  config.base_lr = 0.0
  config.total_steps = 2
  params = launch.train_and_evaluate(config, str(tmp_path))
  assert 'Fine-tuning from' in capsys.readouterr().out
  np.testing.assert_array_equal(params['embedding']['kernel'],
                                pretrained['embedding']['kernel'])
  np.testing.assert_array_equal(params['cls'], pretrained['cls'])
  pe = np.asarray(params['Transformer']['posembed_input']['pos_embedding'])
  old = np.asarray(pretrained['Transformer']['posembed_input']['pos_embedding'])
  assert pe.shape == (1, 1 + 9, 10)
  np.testing.assert_array_equal(pe[:, 0], old[:, 0])  # class token kept
  # Bicubic resize of a 2x2 grid to 3x3: the centre is the mean of the four.
  np.testing.assert_allclose(pe[0, 1 + 4], old[0, 1:].mean(0), atol=1e-5)
  assert not np.any(params['head']['kernel'])


def test_missing_pretrained_file(tiny_config, tmp_path):
  tiny_config.pretrained_path = str(tmp_path / 'nope.npz')
  with pytest.raises(FileNotFoundError, match='nope.npz'):
    launch.train_and_evaluate(tiny_config, str(tmp_path / 'w'))


def test_inference_time(tiny_config, tmp_path, capsys):
  tiny_config.trainer = 'inference_time'
  img_s = inference_time.inference_time(tiny_config, str(tmp_path), steps=2)
  assert img_s > 0
  assert 'testing at 32x32, batch 8' in capsys.readouterr().out


def test_trains_a_mixer(tiny_config, tmp_path):
  """The model family follows the name prefix, as the original's get_model."""
  from vit_jax.models import registry  # pylint: disable=g-import-not-at-top
  tiny_config.model_name = 'Mixer-testing'
  tiny_config.model = registry.MODEL_CONFIGS[
      'Mixer-testing'].copy_and_resolve_references()
  tiny_config.total_steps = 2
  params = launch.train_and_evaluate(tiny_config, str(tmp_path))
  assert 'MixerBlock_0' in params and 'stem' in params
  assert np.load(tmp_path / 'Mixer-testing.npz')['head/kernel'].shape == (16, 10)


def _state_in(config, workdir):
  """(TrainState, step) as a run in `workdir` starts: restored, else fresh."""
  task = launch.make_task(config, workdir)
  manager = loop.make_manager(config, workdir)
  state, _, step = loop.create_state(task, config, task.mesh, manager)
  manager.close()
  return state, step


def test_fsdp_equals_replicated(tiny_config, tmp_path):
  """FSDP splits kernels and their optimizer state 8 ways, same updates."""
  tiny_config.model.hidden_size = 64  # kernels of 4096+ elements
  tiny_config.model.transformer.mlp_dim = 128
  tiny_config.total_steps = 3
  tiny_config.checkpoint_every = 0
  replicated = launch.train_and_evaluate(tiny_config, str(tmp_path / 'rep'))
  tiny_config.sharding_strategy = 'fsdp'
  fsdp = launch.train_and_evaluate(tiny_config, str(tmp_path / 'fsdp'))
  chex.assert_trees_all_close(fsdp, replicated, rtol=1e-5, atol=1e-6)
  kernel = fsdp['Transformer']['encoderblock_0']['MlpBlock_0']['Dense_0'][
      'kernel']
  assert kernel.addressable_shards[0].data.shape == (64, 128 // 8)
  assert fsdp['head']['kernel'].sharding.is_fully_replicated  # 640 elements
  assert replicated['Transformer']['encoderblock_0']['MlpBlock_0']['Dense_0'][
      'kernel'].sharding.is_fully_replicated

  state, step = _state_in(tiny_config, str(tmp_path / 'fsdp'))
  assert step == 3
  big = [x for x in jax.tree.leaves(state)
         if x.size >= sharding.FSDP_MIN_SIZE]
  # Each large parameter and its momentum.
  assert len(big) == 2 * len([x for x in jax.tree.leaves(state.params)
                              if x.size >= sharding.FSDP_MIN_SIZE]) > 0
  for x in big:
    assert x.addressable_shards[0].data.size * 8 == x.size
  assert state.step.sharding.is_fully_replicated


def test_bf16_momentum_trains_like_float32(reference, tmp_path):
  """The reference run with bfloat16 SGD momentum: the same updates, but for
  bfloat16 rounding (2**-8)."""
  config, _, expected = reference
  config = config.copy_and_resolve_references()
  config.momentum_dtype = 'bfloat16'
  params = jax.device_get(launch.train_and_evaluate(config, str(tmp_path)))
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  state, step = _state_in(config, str(tmp_path))
  assert step == 6
  trace = optax.tree_utils.tree_get(state.opt_state, 'trace')
  assert {str(x.dtype) for x in jax.tree.leaves(trace)} == {'bfloat16'}
  init = jax.device_get(_state_in(config, str(tmp_path / 'init'))[0].params)
  ours = jax.tree.map(np.subtract, params, init)
  theirs = jax.tree.map(np.subtract, expected, init)
  norm = lambda tree: np.sqrt(sum(np.sum(x**2) for x in jax.tree.leaves(tree)))
  error = norm(jax.tree.map(np.subtract, ours, theirs))
  assert 0 < error < 0.02 * norm(theirs)


@pytest.mark.parametrize('key,value,match', [
    ('sharding_strategy', 'zero3', r"config.sharding_strategy='zero3'; "
     r"expected one of \('replicate', 'fsdp'\)"),
    ('momentum_dtype', 'float16', r"config.momentum_dtype='float16'; "
     r"expected one of \('float32', 'bfloat16'\)")])
def test_bad_strategy_or_momentum_dtype(tiny_config, tmp_path, key, value,
                                        match):
  tiny_config[key] = value
  with pytest.raises(ValueError, match=match):
    launch.train_and_evaluate(tiny_config, str(tmp_path))


def test_all_scale_options_together(tiny_config, tmp_path):
  """bf16, remat, scan, FSDP and bf16 momentum in one run; the export has
  the published per-block names."""
  tiny_config.model.hidden_size = 64
  tiny_config.model.transformer.mlp_dim = 128
  tiny_config.model.transformer.num_layers = 2
  tiny_config.model.dtype = 'bfloat16'
  tiny_config.model.transformer.remat_policy = 'full'
  tiny_config.model.transformer.scan = True
  tiny_config.sharding_strategy = 'fsdp'
  tiny_config.momentum_dtype = 'bfloat16'
  tiny_config.total_steps = 3
  params = launch.train_and_evaluate(tiny_config, str(tmp_path))
  kernel = params['Transformer']['encoderblock']['MlpBlock_0']['Dense_0'][
      'kernel']
  assert kernel.shape == (2, 64, 128) and kernel.dtype == np.float32
  assert kernel.addressable_shards[0].data.size * 8 == kernel.size
  exported = np.load(tmp_path / 'testing.npz')
  np.testing.assert_array_equal(
      exported['Transformer/encoderblock_1/MlpBlock_3/Dense_0/kernel'],
      np.asarray(kernel)[1])
  assert not any('encoderblock/' in key for key in exported.files)


def test_evaluate_only(reference, tmp_path, capsys):
  """trainer='evaluate' reproduces a finished run's final evaluation, from
  its exported .npz and from its workdir, and writes results.json."""
  import json  # pylint: disable=g-import-not-at-top
  config, workdir, _ = reference
  with open(f'{workdir}/results.json') as f:
    trained = json.load(f)
  config = config.copy_and_resolve_references()
  config.trainer = 'evaluate'
  config.pretrained_dir = workdir  # {workdir}/testing.npz, head included
  from_npz = launch.evaluate(config, str(tmp_path / 'npz'))
  with open(tmp_path / 'npz' / 'results.json') as f:
    written = json.load(f)
  assert written['accuracy'] == from_npz['accuracy'] and written['count'] == 37
  config.pretrained_dir = None
  from_workdir = launch.evaluate(config, workdir)
  for result in (from_npz, from_workdir):
    assert result['count'] == trained['count'] == 37
    np.testing.assert_allclose(result['accuracy'], trained['accuracy'])
    np.testing.assert_allclose(result['loss'], trained['loss'], rtol=1e-5)
  assert 'testing.npz: test accuracy' in capsys.readouterr().out
  with pytest.raises(FileNotFoundError, match='Nothing to evaluate'):
    launch.evaluate(config, str(tmp_path / 'empty'))
  # At another size the position table is resized, as for fine-tuning.
  config.pretrained_dir, config.pp.crop = workdir, 48
  assert launch.evaluate(config, str(tmp_path / 'other_size'))['count'] == 37
  assert ('resized pos_embedding from (1, 5, 10) to (1, 10, 10) (bicubic, '
          'grid 2x2 -> 3x3)') in capsys.readouterr().err
