"""What the SigLIP 2 recipe's test files share: tiny scenes prepared once
per file, configs/siglip2_scenes.py's arms made tiny, and a recorder of a
run's steps."""

import jax
import pytest

from tests import conftest
from vit_jax import launch
from vit_jax.configs import siglip2_scenes
from vit_jax.data import locca
from vit_jax.data import local_datasets
from vit_jax.data import pipeline
from vit_jax.run import loop


def small_config(arm, dirs, **siglip2):
  """An arm of configs/siglip2_scenes.py: testing widths, a few steps."""
  config = siglip2_scenes.get_config(arm).unlock()
  config.tfds_manual_dir, config.tfds_data_dir = dirs
  config.total_steps, config.warmup_steps = 4, 1
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 100
  config.progress_every, config.checkpoint_every = 1, 0
  config.model.image.hidden_size = 16
  config.model.image.transformer.update(num_layers=1, mlp_dim=32,
                                        num_heads=2)
  config.model.text.update(width=16, num_layers=1, mlp_dim=32, num_heads=2,
                           vocab_size=64)
  config.model.out_dim = 16
  s = config.siglip2
  s.decoder.update(width=16, num_layers=1, num_heads=2, mlp_dim=32)
  s.head.update(num_prototypes=32, hidden_dim=32, bottleneck_dim=8)
  s.crops.num_local = 2
  s.update(siglip2)
  return config


def prepare(tmp_path_factory, fmnist_dirs):
  """(manual dir, a tfds dir with 24 train and 10 test scenes)."""
  dirs = (fmnist_dirs[0], str(tmp_path_factory.mktemp('siglip2_tfds')))
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(local_datasets.FashionMnistScenes, 'NUM_TRAIN', 24)
    patch.setattr(local_datasets.FashionMnistScenes, 'NUM_TEST', 10)
    pipeline.get_builder(small_config('siglip', dirs))
  return dirs


class StepRecorder:
  """Wraps `loop.jit_train_step` (monkeypatched): keeps, for each step of
  a run, (state before, batch, state after, metrics) on the host; the
  step's state argument is donated, so it is copied first."""

  def __init__(self, original):
    self.original, self.steps, self.task = original, [], None

  def __call__(self, task, config, mesh, shardings, *args, **kw):
    self.task, step = task, self.original(task, config, mesh, shardings,
                                          *args, **kw)

    def recorded(state, batch):
      before = jax.device_get((state, batch))
      out = step(state, batch)
      self.steps.append((*before, *jax.device_get(out)))
      return out

    return recorded


def runs(dirs, root):
  """The 'siglip2' arm, 4 steps, self-distillation from step 2 (no evals,
  checkpoints every 2): on 8 devices; crashed at step 3 and resumed; on 1
  device, each of its steps recorded (`StepRecorder`)."""
  assert jax.device_count() == 8
  config = small_config('siglip2', dirs, ssl_start=0.5)
  config.evals = config.evals.__class__()  # none
  config.checkpoint_every = 2
  out = {'config': config, 'eight': root / 'eight'}
  out['p8'] = launch.train_and_evaluate(config, str(root / 'eight'))

  def crash(batch):
    del batch
    raise RuntimeError('simulated crash')

  with pytest.MonkeyPatch.context() as patch:
    # Batch 3 is step 3's, after the checkpoint of step 2.
    conftest.interrupt_at(patch, 3, crash, locca)
    with pytest.raises(RuntimeError, match='simulated crash'):
      launch.train_and_evaluate(config, str(root / 'resumed'))
  out['resumed'] = launch.train_and_evaluate(config, str(root / 'resumed'))

  recorder = StepRecorder(loop.jit_train_step)
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
    patch.setattr(loop, 'jit_train_step', recorder)
    out['p1'] = launch.train_and_evaluate(config, str(root / 'one'))
  out['task'], out['steps'] = recorder.task, recorder.steps
  return out
