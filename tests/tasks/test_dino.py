"""DINO self-distillation: its losses against numpy written from the papers'
equations (DINO, iBOT, DINOv2), the teacher's schedules, multi-crop, and
the task end to end (1 vs 8 devices, kill -9 then resume, export)."""

import json

import chex
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
import scipy.special
import tensorflow as tf

from tests.conftest import crashed_and_resumed
from vit_jax.checkpoints import files
from vit_jax import losses
from vit_jax import launch
from vit_jax.configs import dino_fmnist
from vit_jax.configs import mae_fmnist
from vit_jax.data import multicrop
from vit_jax.data import pipeline
from vit_jax.models import dino as models_dino
from vit_jax.models import vit as models_vit
from vit_jax.run import loop
from vit_jax.run import optim
from vit_jax.tasks import dino

pytestmark = pytest.mark.xdist_group('dino')  # one `uninterrupted` run


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _softmax(x):
  return np.exp(_log_softmax(x))


def _numpy_dino_loss(student, teacher, center, t_temp, s_temp):
  """DINO's DINOLoss.forward, loop for loop (main_dino.py)."""
  q = [_softmax((t - center) / t_temp) for t in teacher]
  total, terms = 0., 0
  for iq, target in enumerate(q):
    for v, s in enumerate(student):
      if v == iq:
        continue
      total += np.mean(np.sum(-target * _log_softmax(s / s_temp), -1))
      terms += 1
  return total / terms


def test_dino_loss_with_centring_and_sharpening():
  rng = np.random.default_rng(0)
  student = rng.normal(size=(5, 6, 11))  # 2 global + 3 local views
  teacher = rng.normal(size=(2, 6, 11))
  center = rng.normal(size=(1, 11)) * 0.3
  targets = losses.centered_softmax(teacher, center, 0.04)
  np.testing.assert_allclose(targets, _softmax((teacher - center) / 0.04),
                             rtol=1e-5, atol=1e-7)
  got = losses.dino_loss(jnp.asarray(student, jnp.float32), targets, 0.1)
  want = _numpy_dino_loss(student, teacher, center, 0.04, 0.1)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_the_centre_is_an_ema_of_the_batch_mean():
  rng = np.random.default_rng(1)
  scores, center = rng.normal(size=(8, 5)), rng.normal(size=(1, 5))
  np.testing.assert_allclose(
      dino.new_center(center, scores, 0.9),
      0.9 * center + 0.1 * scores.sum(0, keepdims=True) / 8, rtol=1e-6)
  weight = np.array([0.5, 0.5, 0, 0, 1., 0, 0.25, 0])  # 4 real rows
  np.testing.assert_allclose(
      dino.new_center(center, scores, 0.9, weight),
      0.9 * center + 0.1 * scores[weight > 0].mean(0, keepdims=True),
      rtol=1e-5)


def _numpy_sinkhorn(teacher, temp, iterations):
  """DINOv2's sinkhorn_knopp_teacher, one process (K x B layout)."""
  q = np.exp(teacher / temp).T
  b, k = q.shape[1], q.shape[0]
  q /= q.sum()
  for _ in range(iterations):
    q /= q.sum(axis=1, keepdims=True)
    q /= k
    q /= q.sum(axis=0, keepdims=True)
    q /= b
  q *= b
  return q.T


def test_sinkhorn_knopp_is_dinov2s():
  rng = np.random.default_rng(2)
  teacher = rng.uniform(-1, 1, size=(12, 7))
  got = losses.sinkhorn_knopp(jnp.asarray(teacher, jnp.float32), 0.2, 3)
  np.testing.assert_allclose(got, _numpy_sinkhorn(teacher, 0.2, 3),
                             rtol=1e-4, atol=1e-7)
  np.testing.assert_allclose(np.sum(got, 1), 1, rtol=1e-5)
  # Many iterations: every prototype gets an equal share of the batch.
  balanced = losses.sinkhorn_knopp(jnp.asarray(teacher, jnp.float32), 0.2, 50)
  np.testing.assert_allclose(np.sum(balanced, 0), 12 / 7, rtol=1e-3)
  # Padding rows are left out: the real rows' targets are theirs alone.
  padded = np.concatenate([teacher, rng.normal(size=(4, 7))])
  valid = np.arange(16) < 12
  got = losses.sinkhorn_knopp(jnp.asarray(padded, jnp.float32), 0.2, 3,
                              jnp.asarray(valid))
  np.testing.assert_allclose(got[:12], _numpy_sinkhorn(teacher, 0.2, 3),
                             rtol=1e-4, atol=1e-7)
  np.testing.assert_array_equal(got[12:], 0)


@pytest.mark.parametrize('probability', [0.0, 0.5, 1.0])
def test_random_masks(probability):
  mask, masked, weight = models_dino.random_masks(
      jax.random.key(3), 64, 16, probability=probability, ratio=(0.1, 0.5))
  mask, masked, weight = map(np.asarray, (mask, masked, weight))
  assert mask.shape == (64, 16) and masked.shape == weight.shape == (64, 8)
  counts = mask.sum(1)
  on = counts > 0
  if probability == 0:
    assert not on.any() and not weight.any()
    return
  if probability == 1:
    assert on.all()
  assert counts[on].min() >= round(0.1 * 16) and counts.max() <= 8
  for i in range(64):  # `masked` lists exactly the masked patches first
    real = weight[i] > 0
    assert set(masked[i][real]) == set(np.flatnonzero(mask[i]))
    np.testing.assert_allclose(weight[i][real], 1 / max(counts[i], 1))


def test_ibot_loss_is_the_mean_over_masked_patches_per_image():
  rng = np.random.default_rng(4)
  b, n, k = 6, 16, 9
  mask, masked, weight = models_dino.random_masks(
      jax.random.key(5), b, n, probability=0.7, ratio=(0.1, 0.5))
  mask = np.asarray(mask)
  student = rng.normal(size=(b, n, k)).astype(np.float32)
  teacher = _softmax(rng.normal(size=(b, n, k)) / 0.05).astype(np.float32)
  want = 0.
  for i in range(b):  # DINOv2: each image's masked patches average, / B
    if mask[i].any():
      ce = -np.sum(teacher[i] * _log_softmax(student[i] / 0.1), -1)
      want += ce[mask[i]].mean()
  want /= b
  take = lambda x: np.take_along_axis(x, np.asarray(masked)[..., None], 1)
  got = losses.ibot_loss(take(student), take(teacher), weight, 0.1)
  np.testing.assert_allclose(got, want, rtol=1e-5)


def test_koleo_is_minus_the_log_nearest_neighbour_distance():
  rng = np.random.default_rng(6)
  x = rng.normal(size=(10, 5))
  unit = x / np.linalg.norm(x, axis=1, keepdims=True)
  d = np.linalg.norm(unit[:, None] - unit[None], axis=-1)
  np.fill_diagonal(d, np.inf)
  want = -np.mean(np.log(d.min(1)))
  np.testing.assert_allclose(losses.koleo_loss(jnp.asarray(x, jnp.float32)),
                             want, rtol=1e-5)


def test_teacher_schedules_and_ema():
  total, base = 100, 0.996
  for step in (0, 10, 50, 99, 100):
    want = 1 - (1 - base) * (np.cos(np.pi * step / total) + 1) / 2
    np.testing.assert_allclose(dino.teacher_momentum(step, total, base), want,
                               rtol=1e-6)
  assert dino.teacher_momentum(0, total, base) == pytest.approx(base)
  assert dino.teacher_momentum(total, total, base) == pytest.approx(1.)
  settings = dino_fmnist.dino_settings()
  for step, want in ((0, 0.04), (5, 0.055), (10, 0.07), (30, 0.07)):
    np.testing.assert_allclose(
        dino.teacher_temperature(step, settings, 10), want, rtol=1e-5)
  rng = np.random.default_rng(7)
  t, s = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
  np.testing.assert_allclose(dino.ema({'w': t}, {'w': s}, 0.9)['w'],
                             0.9 * t + 0.1 * s, rtol=1e-6)


def test_the_last_layer_is_kept_while_frozen():
  new = {'dino_head': {'Dense_0': {'kernel': jnp.ones(3)},
                       'last_layer': {'kernel': jnp.ones(3)}}}
  old = jax.tree.map(jnp.zeros_like, new)
  frozen = dino.keep_last_layer(new, old, jnp.asarray(True))
  np.testing.assert_array_equal(frozen['dino_head']['last_layer']['kernel'], 0)
  np.testing.assert_array_equal(frozen['dino_head']['Dense_0']['kernel'], 1)
  free = dino.keep_last_layer(new, old, jnp.asarray(False))
  np.testing.assert_array_equal(free['dino_head']['last_layer']['kernel'], 1)


def test_the_head_is_an_mlp_then_normalized_prototypes():
  head = models_dino.DinoHead(num_prototypes=7, hidden_dim=12,
                              bottleneck_dim=5, num_layers=3)
  x = np.random.default_rng(8).normal(size=(4, 6)).astype(np.float32)
  params = head.init(jax.random.key(0), x)['params']
  h = x
  for i in range(3):
    p = params[f'Dense_{i}']
    h = h @ p['kernel'] + p['bias']
    if i < 2:
      h = 0.5 * h * (1 + scipy.special.erf(h / np.sqrt(2)))  # exact GELU
  h /= np.linalg.norm(h, axis=1, keepdims=True)
  v = params['last_layer']['kernel']
  want = h @ (v / np.linalg.norm(v, axis=0, keepdims=True))
  np.testing.assert_allclose(head.apply({'params': params}, x), want,
                             rtol=1e-4, atol=1e-6)


# Multi-crop.


def _crops(**kw):
  crops = dino_fmnist.dino_settings().crops
  crops.update(kw)
  return crops


def test_views_have_their_shapes_and_follow_the_seed():
  image = tf.constant(np.random.default_rng(9).integers(
      0, 256, (28, 28, 3)), tf.uint8)
  crops = _crops(num_local=3)
  seed = tf.constant([1, 2], tf.int64)
  a = multicrop.views(image, seed, crops, 28)
  assert a['global'].shape == (2, 28, 28, 3)
  assert a['local'].shape == (3, 14, 14, 3)
  for v in a.values():
    assert 0 <= float(tf.reduce_min(v)) and float(tf.reduce_max(v)) <= 1
  b = multicrop.views(image, seed, crops, 28)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  c = multicrop.views(image, tf.constant([1, 3], tf.int64), crops, 28)
  assert not np.allclose(a['global'], c['global'])
  assert not np.allclose(a['global'][0], a['global'][1])  # views differ
  assert not np.allclose(a['local'][0], a['local'][1])
  assert 'local' not in multicrop.views(image, seed, _crops(num_local=0), 28)


def test_gaussian_blur_is_scipys():
  image = np.random.default_rng(10).uniform(size=(20, 20, 3)).astype(
      np.float32)
  sigma, max_sigma = 0.8, 1.0  # a kernel of radius 3
  got = multicrop.gaussian_blur(tf.constant(image), tf.constant(sigma),
                                max_sigma)
  # TF's REFLECT is scipy's 'mirror'; truncate so that the radius is 3.
  want = scipy.ndimage.gaussian_filter(image, (sigma, sigma, 0),
                                       mode='mirror', truncate=3 / sigma)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_colour_jitter_keeps_gray_gray():
  gray = tf.constant(np.full((8, 8, 3), 0.3, np.float32))
  out = multicrop.color_jitter(gray, tf.constant([4, 5], tf.int64))
  np.testing.assert_allclose(out[..., 0], out[..., 1], atol=1e-6)
  np.testing.assert_allclose(out[..., 0], out[..., 2], atol=1e-6)


@pytest.mark.parametrize('key,value,match', [
    ('global_scale', (0.5, 1.2), 'global_scale'),
    ('local_scale', (0.4, 0.1), 'local_scale'),
    ('local_size', 15, 'local_size=15'),
    ('num_local', -1, 'num_local'),
])
def test_bad_crops_are_refused(key, value, match):
  with pytest.raises(ValueError, match=match):
    multicrop.check(_crops(**{key: value}), 28, (7, 7))


def test_the_mask_token_replaces_masked_patches():
  config = dino_fmnist.get_config().model.to_dict()
  config.update(hidden_size=16, transformer=dict(
      config['transformer'], num_layers=1, mlp_dim=32, num_heads=2))
  vit = models_vit.VisionTransformer(num_classes=None, **config)
  images = np.random.default_rng(11).normal(size=(2, 28, 28, 3))
  none, every = np.zeros((2, 16), bool), np.ones((2, 16), bool)
  params = vit.init(jax.random.key(0), images, train=False,
                    mask=none)['params']
  params['mask_token'] = np.full((1, 1, 16), 0.3, np.float32)
  plain = vit.apply({'params': params}, images, train=False)
  np.testing.assert_allclose(
      vit.apply({'params': params}, images, train=False, mask=none), plain)
  # Every patch masked: the images no longer matter.
  a = vit.apply({'params': params}, images, train=False, mask=every)
  b = vit.apply({'params': params}, images[::-1] * 2, train=False,
                mask=every)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert not np.allclose(a, plain)
  with pytest.raises(ValueError, match='mask must be'):
    vit.apply({'params': params}, images, train=False, mask=every[:, :3])


def test_the_views_stream_resumes_where_it_stopped(fmnist_dirs):
  config = _small(dino_fmnist.get_config(), fmnist_dirs)
  info = pipeline.dataset_info(pipeline.get_builder(config), config)
  stream = lambda start: pipeline.train_iterator(  # pylint: disable=g-long-lambda
      info, config, batch_size=8, start_step=start,
      example=multicrop.example_fn(config))
  whole = [b for _, b in zip(range(4), stream(0))]
  resumed = next(stream(3))
  assert set(resumed) == {'global', 'local'}  # no labels
  assert resumed['global'].shape == (8, 2, 28, 28, 3)
  assert resumed['local'].shape == (8, 2, 14, 14, 3)
  for k in resumed:
    np.testing.assert_array_equal(resumed[k], whole[3][k])
  assert not np.allclose(whole[2]['global'], whole[3]['global'])


# The task end to end.


def _small(config, fmnist_dirs, **kw):
  """configs/dino_fmnist.py as a short job on tiny data."""
  config = config.unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.total_steps, config.warmup_steps = 4, 1
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 100
  config.progress_every, config.checkpoint_every = 1, 0
  config.evals.fewshot.update(shots=(2,), seeds=1)
  config.model.hidden_size = 16
  config.model.transformer.update(num_layers=1, mlp_dim=32, num_heads=2)
  if 'dino' in config:
    config.dino.head.update(num_prototypes=32, hidden_dim=32,
                            bottleneck_dim=8)
    config.dino.crops.num_local = 2
    config.dino.update(kw)
  return config


def _resumable(fmnist_dirs):
  """6 steps, a checkpoint every 3, the last layer free from the start (so
  that it moves too): the run that the crash test interrupts and that the
  1-device run repeats."""
  config = _small(dino_fmnist.get_config(), fmnist_dirs,
                  freeze_last_layer_epochs=0.)
  config.total_steps, config.checkpoint_every = 6, 3
  config.evals.knn.every = config.evals.fewshot.every = None
  return config


@pytest.fixture(scope='module')
def uninterrupted(fmnist_dirs, tmp_path_factory):
  """`_resumable`'s run on the 8 devices that never stopped: the reference
  of both the 1-device run and the crashed one."""
  workdir = str(tmp_path_factory.mktemp('dino_whole'))
  return jax.device_get(launch.train_and_evaluate(_resumable(fmnist_dirs),
                                                  workdir))


def test_one_device_equals_eight(fmnist_dirs, uninterrupted, tmp_path,
                                 monkeypatch):
  assert jax.device_count() == 8
  p8 = uninterrupted
  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  config = _resumable(fmnist_dirs)
  config.checkpoint_every = 0  # saves change no parameter
  p1 = launch.train_and_evaluate(config, str(tmp_path))
  # The attention's key biases have a zero gradient in exact arithmetic (a
  # query's scores all shift alike): theirs is rounding, which AdamW scales
  # up to the learning rate, and which differs with the summation order.
  exact = lambda p: {k: v for k, v in traverse_util.flatten_dict(
      p, sep='/').items() if not k.endswith('/key/bias')}
  chex.assert_trees_all_close(exact(p1), exact(p8), rtol=1e-4, atol=1e-6)
  # The step moved the student, the teacher followed, the centre moved.
  assert not np.allclose(p8['center'], 0)
  s, t = p8['student']['encoder'], p8['teacher']['encoder']
  assert not np.allclose(s['cls'], t['cls'])


def test_one_step_is_the_equations(fmnist_dirs, tmp_path):
  """After a step: teacher = m teacher + (1 - m) student, with m the
  schedule's at step 0, and the centre the EMA of the teacher's mean."""
  config = _small(dino_fmnist.get_config(), fmnist_dirs)
  config.total_steps = 1
  config.evals.knn.every = config.evals.fewshot.every = None
  task = launch.make_task(config, str(tmp_path))
  params0 = jax.jit(task.init_params)(jax.random.key(0))
  state = loop.TrainState.create(
      apply_fn=task.model.apply, params=params0,
      tx=optim.make_optimizer(config, task.param_labels))
  batch = next(task.batches(batch_size=8, rows=None, start_step=0))
  new, metrics = jax.jit(lambda s, b: task.train_step(
      s, b, rng=jax.random.key(1)))(state, batch)
  m = 1 - (1 - 0.99) * (np.cos(0) + 1) / 2
  assert float(metrics['teacher_momentum']) == pytest.approx(m)
  chex.assert_trees_all_close(
      new.params['teacher'],
      jax.tree.map(lambda t, s: m * t + (1 - m) * s, params0['teacher'],
                   new.params['student']), rtol=1e-5, atol=1e-7)
  # The frozen last layer: unchanged in the first epoch; the rest moved.
  head0, head1 = params0['student']['dino_head'], new.params['student'][
      'dino_head']
  np.testing.assert_array_equal(head1['last_layer']['kernel'],
                                head0['last_layer']['kernel'])
  assert not np.allclose(head1['Dense_0']['kernel'], head0['Dense_0']['kernel'])
  images = dino.crop_major(batch['global'])
  scores = task.model.apply({'params': params0['teacher']}, images,
                            train=False)['dino']
  np.testing.assert_allclose(
      new.params['center'], 0.1 * np.mean(scores, 0, keepdims=True),
      rtol=1e-4, atol=1e-7)


def test_pretrains_exports_and_fine_tunes(fmnist_dirs, tmp_path, capsys):
  config = _small(dino_fmnist.get_config(), fmnist_dirs, centering='sinkhorn')
  params = jax.device_get(launch.train_and_evaluate(config,
                                                   str(tmp_path / 'dino')))
  results = json.loads((tmp_path / 'dino' / 'results.json').read_text())
  assert 0 <= results['fewshot_2shot'] <= 1
  assert 0 <= results['knn_accuracy'] <= 1 and results['knn_count'] == 37
  exported = files.load(str(tmp_path / 'dino' / 'ViT-fmnist.npz'))
  assert 'mask_token' not in exported
  teacher = dict(params['teacher']['encoder'])
  del teacher['mask_token']
  jax.tree.map(np.testing.assert_array_equal, exported, teacher)
  finetune = _small(mae_fmnist.get_config('finetune'), fmnist_dirs)
  finetune.pretrained_path = str(tmp_path / 'dino' / 'ViT-fmnist.npz')
  launch.train_and_evaluate(finetune, str(tmp_path / 'finetune'))
  out = capsys.readouterr().out
  assert f'Fine-tuning from {finetune.pretrained_path}' in out


def test_dino_alone_trains_without_ibot_and_koleo(fmnist_dirs, tmp_path):
  config = _small(dino_fmnist.get_config('dino_v1'), fmnist_dirs)
  config.total_steps = 2
  config.evals.knn.every = config.evals.fewshot.every = None
  params = launch.train_and_evaluate(config, str(tmp_path))
  np.testing.assert_array_equal(params['ibot_center'], 0)  # never used
  assert not np.allclose(params['center'], 0)


def test_bad_dino_settings_fail_before_compiling(fmnist_dirs, tmp_path):
  cases = [(dict(centering='kmeans'), 'centering'),
           (dict(momentum_teacher=1.0), 'momentum_teacher'),
           (dict(mask_ratio=(0.5, 0.1)), 'mask_ratio'),
           (dict(mask_probability=1.5), 'mask_probability'),
           (dict(teacher_temp=0.), 'temperatures must be positive')]
  for i, (kw, match) in enumerate(cases):
    config = _small(dino_fmnist.get_config(), fmnist_dirs, **kw)
    with pytest.raises(ValueError, match=match):
      launch.train_and_evaluate(config, str(tmp_path / str(i)))
  config = _small(dino_fmnist.get_config(), fmnist_dirs)
  del config.dino.head['hidden_dim']
  with pytest.raises(ValueError, match=r"head lacks \['hidden_dim'\]"):
    launch.train_and_evaluate(config, str(tmp_path / 'head'))
  del config['dino']
  with pytest.raises(ValueError, match='needs config.dino'):
    launch.train_and_evaluate(config, str(tmp_path / 'none'))
  config = _small(dino_fmnist.get_config(), fmnist_dirs)
  config.model.classifier = 'gap'
  with pytest.raises(ValueError, match="classifier='token'"):
    launch.train_and_evaluate(config, str(tmp_path / 'gap'))
  config = _small(dino_fmnist.get_config(), fmnist_dirs)
  config.batch, config.accum_steps = 16, 2
  with pytest.raises(ValueError, match='accum_steps=1'):
    launch.train_and_evaluate(config, str(tmp_path / 'accum'))


def test_a_crash_resumes_to_the_same_state(fmnist_dirs, uninterrupted,
                                           tmp_path, monkeypatch):
  """Student, teacher (EMA), centre and schedules all resume: a run that
  crashed after its step-3 checkpoint, rerun, ends where one that never
  stopped does. (A kill -9 of the loop: tests/end_to_end/test_main.py.)"""
  # Batch 4 is step 5's, after step 3's checkpoint.
  resumed = crashed_and_resumed(_resumable(fmnist_dirs), tmp_path,
                                monkeypatch, 4)
  chex.assert_trees_all_close(resumed, uninterrupted, rtol=1e-6, atol=1e-7)
  assert not np.allclose(uninterrupted['center'], 0)
