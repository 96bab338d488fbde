"""`trainer='videomae'` (`tasks/videomae.py`): tube masking against its
definition, the targets and loss against numpy, configs/videomae_fmnist.py
pretrained 40 steps (knn_accuracy, the export a ViViT checkpoint) and
fine-tuned 40 steps from it (accuracy), 1 device against 8, a crash
resumed. (A kill -9 of the loop, which this task does not change:
tests/end_to_end/test_main.py.)"""

import contextlib
import functools
import io
import json
import math
import re

import chex
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import conftest
from vit_jax import checkpoint  # the original's module name
from vit_jax import launch
from vit_jax.checkpoints import record
from vit_jax.configs import videomae_fmnist
from vit_jax.data import local_datasets
from vit_jax.data import video as video_data
from vit_jax.models import posemb
from vit_jax.models import videomae
from vit_jax.models import vivit
from vit_jax.run import loop
from vit_jax.tasks import videomae as videomae_task

pytestmark = pytest.mark.xdist_group('video')

STEPS = 40


def _small(arm, fmnist_dirs):
  """configs/videomae_fmnist.py's `arm`, narrow, on 4 frames of 28 px."""
  config = videomae_fmnist.get_config(arm).unlock()
  config.dataset = 'moving_fashion_mnist/frames8_size32'
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.pp.crop = 28
  config.video.update(frames=4, stride=1, test_views=2)
  config.total_steps, config.warmup_steps = STEPS, 4
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 16
  config.progress_every, config.checkpoint_every = 10, 20
  config.model.hidden_size = 16
  config.model.transformer.update(num_layers=1, mlp_dim=32, num_heads=2)
  if 'mae' in config:
    config.mae.decoder.update(hidden_size=16, num_layers=1, num_heads=2,
                              mlp_dim=32)
    config.evals.knn.update(k=4)
  return config


@pytest.fixture(scope='module')
def runs(fmnist_dirs, tmp_path_factory):
  """The pretrain arm 40 steps on 8 devices (its export fine-tuned 40
  steps), crashed at step 21 and resumed from step 20's checkpoint, and on
  1 device."""
  assert jax.device_count() == 8
  root = tmp_path_factory.mktemp('videomae')
  out = {'root': root}
  with pytest.MonkeyPatch.context() as patch:
    # test_video.py's clips: the tfds folder is shared.
    patch.setattr(local_datasets.MovingFashionMnist, 'NUM_TRAIN', 16)
    patch.setattr(local_datasets.MovingFashionMnist, 'NUM_TEST', 6)
    config = _small('pretrain', fmnist_dirs)
    out['config'] = config
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
      out['p8'] = jax.device_get(
          launch.train_and_evaluate(config, str(root / 'eight')))
    out['losses'] = [float(x) for x in re.findall(r'\] loss (\S+)',
                                                  log.getvalue())]
    finetune = _small('finetune', fmnist_dirs)
    finetune.pretrained_path = str(root / 'eight' / 'ViViT-fmnist.npz')
    out['ft'] = jax.device_get(
        launch.train_and_evaluate(finetune, str(root / 'finetune')))
    quiet = config.copy_and_resolve_references().unlock()
    quiet.evals.knn.every = None  # the parameters only

    def crash(batch):
      del batch
      raise RuntimeError('simulated crash')

    with pytest.MonkeyPatch.context() as inner:
      inner.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
      out['p1'] = jax.device_get(
          launch.train_and_evaluate(quiet, str(root / 'one')))
    with pytest.MonkeyPatch.context() as inner:
      conftest.interrupt_at(inner, 20, crash, stream=video_data)
      with pytest.raises(RuntimeError, match='simulated crash'):
        launch.train_and_evaluate(quiet, str(root / 'resumed'))
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
      out['resumed'] = jax.device_get(
          launch.train_and_evaluate(quiet, str(root / 'resumed')))
    out['resume_log'] = log.getvalue()
  return out


@pytest.mark.parametrize('grid,ratio', [((2, 4, 4), 0.9), ((8, 14, 14), 0.9),
                                        ((3, 2, 5), 0.5), ((1, 3, 3), 0.)])
def test_tube_masks_mask_the_same_places_in_every_slot(grid, ratio):
  """VideoMAE's TubeMaskingGenerator: int(ratio * h*w) of a frame's
  patches masked, the same ones in each of the T' slots; `keep` lists the
  others."""
  slots, h, w = grid
  keep, mask = videomae.tube_keep(jax.random.key(0), 6, grid, ratio)
  mask = np.asarray(mask).reshape(6, slots, h * w)
  masked = int(ratio * h * w)
  assert (mask.sum(-1) == masked).all()
  assert (mask == mask[:, :1]).all()
  visible = [np.flatnonzero(m.ravel() == 0) for m in mask]
  np.testing.assert_array_equal(keep, np.stack(visible))
  if masked:
    assert len({m[0].tobytes() for m in mask}) > 1  # one draw per clip


def test_the_masked_count_is_videomaes():
  assert videomae.num_masked(16, 0.9) == 14  # int(14.4)
  assert videomae.num_masked(196, 0.9) == 176  # 224 px, 16 px patches
  assert videomae.num_masked(1, 0.9) == 0
  with pytest.raises(ValueError, match=r'must be in \[0, 1\)'):
    videomae.num_masked(16, 1.0)


def test_sinusoid_table_is_the_formula():
  table = posemb.sinusoid_table(7, 6)
  for p in range(7):
    for j in range(6):
      angle = p / 10000**(2 * (j // 2) / 6)
      want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
      assert table[p, j] == pytest.approx(want, abs=1e-6)


def test_the_encoder_is_a_vivit_with_sincos_positions():
  """All tubelets kept, the encoder's tokens pooled are the ViViT's
  features with the same parameters; a factorised 'sincos' is refused."""
  config = videomae.encoder_config(dict(
      patches={'size': (4, 4)}, hidden_size=8, tubelet=2,
      transformer=dict(num_layers=1, mlp_dim=8, num_heads=2)))
  clips = jax.random.normal(jax.random.key(0), (2, 4, 8, 8, 3))
  model = vivit.ViViT(num_classes=None, **config)
  params = model.init(jax.random.key(1), clips, train=False)['params']
  params = jax.tree.map(lambda x: x + 0.1, params)  # off init's zeros
  keep = jnp.tile(jnp.arange(8)[None], (2, 1))
  tokens = videomae.VisibleEncoder(config).apply({'params': params}, clips,
                                                 keep, train=False)
  np.testing.assert_allclose(tokens.mean(1), model.apply(
      {'params': params}, clips, train=False), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="'sincos' is for encoder="):
    vivit.ViViT(num_classes=None, **dict(
        config, encoder='factorised', temporal_transformer=dict(
            num_layers=1, mlp_dim=8, num_heads=2))).init(
                jax.random.key(1), clips, train=False)


def _numpy_targets(clips, t, p, norm_pix):
  """VideoMAE's 'b (t p0) (h p1) (w p2) c -> b (t h w) (p0 p1 p2) c', a
  tubelet at a time, normalized per channel over its pixels."""
  n, frames, height, width, c = clips.shape
  out = []
  for s in range(frames // t):
    for i in range(height // p):
      for j in range(width // p):
        x = clips[:, s * t:(s + 1) * t, i * p:(i + 1) * p,
                  j * p:(j + 1) * p].reshape(n, -1, c)
        if norm_pix:
          x = (x - x.mean(1, keepdims=True)) / (
              x.std(1, ddof=1, keepdims=True) + 1e-6)
        out.append(x.reshape(n, -1))
  return np.stack(out, 1)


def test_targets_are_videomaes_tubelets():
  clips = np.random.default_rng(0).uniform(size=(2, 4, 8, 12, 3))
  for norm_pix in (True, False):
    np.testing.assert_allclose(
        videomae.tubelet_targets(jnp.asarray(clips), 2, (4, 4), norm_pix),
        _numpy_targets(clips, 2, 4, norm_pix), rtol=1e-5, atol=1e-6)


def test_the_step_loss_is_videomaes_on_the_masked_tubelets():
  """The step's loss: the mean squared error between the predictions of
  the tube-masked tubelets and their normalized pixels in [0, 1]."""
  model = videomae.VideoMaskedAutoencoder(
      encoder=videomae.encoder_config(dict(
          patches={'size': (4, 4)}, hidden_size=16, tubelet=2,
          transformer=dict(num_layers=1, mlp_dim=16, num_heads=2,
                           dropout_rate=0., attention_dropout_rate=0.))),
      decoder=dict(hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8))
  clips = jax.random.uniform(jax.random.key(1), (2, 4, 8, 8, 3), minval=-1)
  rng = jax.random.key(2)
  keep, mask = videomae.tube_keep(jax.random.split(rng)[0], 2, (2, 2, 2),
                                  0.75)
  params = model.init(jax.random.key(3), clips, keep,
                      train=False)['params']
  pred = np.asarray(model.apply({'params': params}, clips, keep,
                                train=False))
  target = _numpy_targets((np.asarray(clips) + 1) / 2, 2, 4, True)
  m = np.asarray(mask, bool)
  assert m.sum() == 2 * 2 * 3  # 3 of 4 patches in each of 2 slots
  want = np.mean((pred[m] - target[m])**2)
  state = loop.TrainState.create(apply_fn=model.apply, params=params,
                                 tx=optax.sgd(0.))
  _, metrics = jax.jit(functools.partial(
      videomae_task.train_step, model=model, ratio=0.75, norm_pix=True,
      to_unit=videomae_task.unit_pixels({})))(state, clips, rng)
  np.testing.assert_allclose(metrics['loss'], want, rtol=1e-5)


def test_pretraining_writes_knn_accuracy_and_a_vivit(runs):
  """40 steps: the loss falls, the encoder's clip features give a k-NN
  accuracy, and the export is the encoder, a ViViT that reads as one."""
  root = runs['root'] / 'eight'
  results = json.loads((root / 'results.json').read_text())
  assert 0 <= results['knn_accuracy'] <= 1 and results['knn_count'] == 6
  exported = checkpoint.load(str(root / 'ViViT-fmnist.npz'))
  jax.tree.map(np.testing.assert_array_equal, exported,
               runs['p8']['encoder'])
  assert 'pos_embedding' not in str(jax.tree.structure(exported))
  written = record.read(str(root / 'ViViT-fmnist.npz'))
  assert written['model_class'] == 'ViViT'
  assert written['model']['temporal_posemb'] == 'sincos'
  model = vivit.ViViT(num_classes=None, **videomae.encoder_config(
      runs['config'].model.to_dict()))
  init = model.init(jax.random.key(0), jnp.zeros((1, 4, 28, 28, 3)),
                    train=False)['params']
  chex.assert_trees_all_equal_shapes(init, exported)
  losses = runs['losses']  # at steps 1, 10, 20, 30, 40
  assert len(losses) == 5 and losses[-1] < 0.8 * losses[0]


def test_fine_tuning_from_the_export_writes_accuracy(runs):
  results = json.loads(
      (runs['root'] / 'finetune' / 'results.json').read_text())
  assert 0 <= results['accuracy'] <= 1 and results['count'] == 6
  assert runs['ft']['head']['kernel'].shape == (16, 10)
  moved = jax.tree.map(lambda a, b: not np.allclose(a, b),
                       runs['ft']['embedding'],
                       runs['p8']['encoder']['embedding'])
  assert all(jax.tree.leaves(moved))  # trained from the export


def test_one_device_equals_eight(runs):
  # A key bias's gradient is 0 in exact arithmetic (the softmax ignores
  # it): Adam turns its rounding noise into steps that differ with the
  # summation order. It changes no output; compared apart, loosely.
  flat1, flat8 = (traverse_util.flatten_dict(runs[k], sep='/')
                  for k in ('p1', 'p8'))
  keys = [k for k in flat8 if k.endswith('key/bias')]
  assert len(keys) == 2  # the encoder's block and the decoder's
  for k in keys:
    assert np.abs(flat1.pop(k) - flat8.pop(k)).max() < 0.1
  chex.assert_trees_all_close(flat1, flat8, rtol=1e-4, atol=1e-5)


def test_a_crash_resumes_to_the_same_state(runs):
  """Crashed at step 21, resumed from step 20's checkpoint: the mask and
  data streams and the optimizer end where the uninterrupted run did."""
  assert 'Resuming from step 20 ' in runs['resume_log']
  chex.assert_trees_all_close(runs['resumed'], runs['p8'], rtol=1e-5,
                              atol=1e-6)
