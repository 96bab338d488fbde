"""`trainer='video'` (`tasks/video.py`): configs/vivit_fmnist.py's arms,
a ViViT from an image ViT's checkpoint trained, exported and evaluated
with views, 1 device against 8, a crash resumed, and the settings refused
before anything compiles."""

import json
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from tests.conftest import interrupt_at
from vit_jax import checkpoint  # the original's module name
from vit_jax import launch
from vit_jax import models
from vit_jax import run_config
from vit_jax.checkpoints import files
from vit_jax.configs import vivit_fmnist
from vit_jax.data import local_datasets
from vit_jax.data import video as video_data
from vit_jax.models import mixer
from vit_jax.models import timesformer
from vit_jax.models import vit as models_vit
from vit_jax.models import vivit
from vit_jax.tasks import video

pytestmark = pytest.mark.xdist_group('video')


@pytest.fixture
def small_clips(monkeypatch):
  """Few clips of moving Fashion-MNIST, so preparing them takes a second."""
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TRAIN', 16)
  monkeypatch.setattr(local_datasets.MovingFashionMnist, 'NUM_TEST', 6)


def _small(arm, fmnist_dirs, **video_settings):
  """configs/vivit_fmnist.py's `arm`, narrow, on 8-frame 32 px clips."""
  config = vivit_fmnist.get_config(arm).unlock()
  config.dataset = 'moving_fashion_mnist/frames8_size32'
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.pp.crop = 28
  config.video.update(frames=4, stride=1, test_views=2, **video_settings)
  config.total_steps, config.warmup_steps = 4, 1
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 16
  config.progress_every, config.checkpoint_every = 1, 2
  config.evals.test.every = 0
  config.model.hidden_size = 16
  for name in ('transformer', 'temporal_transformer'):
    if name in config.model:
      config.model[name].update(num_layers=1, mlp_dim=32, num_heads=2)
  return config


def _image_vit(config, path):
  """An image ViT of `config.model`'s widths at initialization, as .npz."""
  fields = {k: v for k, v in config.model.items()
            if k in ('patches', 'hidden_size', 'classifier',
                     'representation_size')}
  model = models_vit.VisionTransformer(
      num_classes=10, transformer=config.model.transformer.to_dict(),
      **fields)
  params = model.init(jax.random.key(3), jnp.zeros((1, 28, 28, 3)),
                      train=False)['params']
  files.save(params, str(path))
  return str(path), params


@pytest.mark.parametrize('arm', vivit_fmnist.ARMS)
def test_arms_are_video_models_of_the_default_jobs_widths(arm):
  config = vivit_fmnist.get_config(arm)
  model = models.model_class(config.model_name, config.model)
  assert config.model.hidden_size == 128
  assert config.model.patches.size == (7, 7)
  if arm == 'timesformer':
    assert model is timesformer.TimeSformer
    assert config.model.attention_type == 'divided_space_time'
  else:
    assert model is vivit.ViViT
    assert config.model.encoder == ('factorised' if arm == 'factorised' else
                                    'unfactorised')
  assert bool(config.pretrained_path) == (arm != 'scratch')
  video.check_settings(config)


def test_from_image_trains_exports_and_evaluates(fmnist_dirs, small_clips,
                                                 tmp_path, capsys):
  """An image ViT inflated (its kernel 'average'd over the tubelet), trained,
  exported as a ViViT that `checkpoint.load` reads and that `trainer=
  'evaluate'` scores as the run did."""
  config = _small('from_image', fmnist_dirs, kernel_init='average')
  config.pretrained_path, image = _image_vit(config, tmp_path / 'image.npz')
  final = launch.train_and_evaluate(config, str(tmp_path / 'run'))
  assert 'inflated the embedding' in capsys.readouterr().err
  results = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert results['count'] == 6 and 0 <= results['accuracy'] <= 1
  exported = checkpoint.load(str(tmp_path / 'run' / 'ViViT-fmnist.npz'))
  jax.tree.map(np.testing.assert_array_equal, exported,
               jax.device_get(final))
  assert exported['embedding']['kernel'].shape == (2, 7, 7, 3, 16)
  assert image['embedding']['kernel'].shape == (7, 7, 3, 16)
  config.trainer = 'evaluate'
  config.pretrained_path = str(tmp_path / 'run' / 'ViViT-fmnist.npz')
  launch.evaluate(config, str(tmp_path / 'eval'))
  again = json.loads((tmp_path / 'eval' / 'results.json').read_text())
  assert again['accuracy'] == pytest.approx(results['accuracy'])
  assert again['loss'] == pytest.approx(results['loss'], rel=1e-5)


def test_timesformer_from_image_trains_and_writes_accuracy(
    fmnist_dirs, small_clips, tmp_path, capsys):
  """configs/vivit_fmnist.py:timesformer from an image ViT: its temporal
  parts added (`inflate`), trained, tested, exported (what
  test_from_image_... checks of the loop holds for any video model)."""
  config = _small('timesformer', fmnist_dirs)
  config.video.test_views = 1
  config.pretrained_path, image = _image_vit(config, tmp_path / 'image.npz')
  final = launch.train_and_evaluate(config, str(tmp_path / 'run'))
  assert 'temporal attention and norm: copies' in capsys.readouterr().err
  results = json.loads((tmp_path / 'run' / 'results.json').read_text())
  assert results['count'] == 6 and 0 <= results['accuracy'] <= 1
  block = final['Transformer']['encoderblock_0']
  assert block['temporal_dense']['kernel'].shape == (16, 16)
  assert np.any(block['temporal_dense']['kernel'])  # trained off zero
  np.testing.assert_array_equal(final['embedding']['kernel'].shape,
                                image['embedding']['kernel'].shape)
  assert (tmp_path / 'run' / 'TimeSformer-fmnist.npz').exists()


@pytest.mark.parametrize('arm', ['from_image', 'timesformer'])
def test_an_image_export_keeps_the_video_model(arm, tmp_path):
  """The default job's export records its custom ViT: the video arm keeps
  its own model (the task fits the weights to it), the record's
  normalization still applies."""
  path = tmp_path / 'ViT-fmnist.npz'
  path.write_bytes(b'')
  (tmp_path / 'ViT-fmnist.transform.json').write_text(json.dumps(dict(
      model_name='ViT-fmnist', model_class='VisionTransformer',
      model={'hidden_size': 128, 'patches': {'size': [7, 7]}},
      mean=[0.2] * 3, std=[0.3] * 3)))
  config = vivit_fmnist.get_config(arm).unlock()
  config.pretrained_path = str(path)
  out = run_config.resolve(config, {'pretrained_path': str(path)})
  assert out.model_name == config.model_name
  assert out.model.to_dict() == config.model.to_dict()
  assert tuple(out.pp.mean) == (0.2,) * 3


def test_one_device_equals_eight(fmnist_dirs, small_clips, tmp_path,
                                 monkeypatch):
  """The factorised encoder, scanned and rematerialized, on the mesh."""
  assert jax.device_count() == 8
  config = _small('factorised', fmnist_dirs)
  config.pretrained_path = _image_vit(config, tmp_path / 'image.npz')[0]
  config.model.transformer.update(scan=True, remat_policy='full')
  # SGD: Adam's normalization turns gradients that are 0 in exact
  # arithmetic (a key bias's, a zero tubelet frame's) into steps of the
  # learning rate's size whose signs follow the summation order.
  config.optimizer, config.weight_decay = 'sgd', 0.
  p8 = launch.train_and_evaluate(config, str(tmp_path / 'eight'))
  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  p1 = launch.train_and_evaluate(config, str(tmp_path / 'one'))
  chex.assert_trees_all_close(p1, p8, rtol=1e-4, atol=1e-6)


def test_bfloat16_steps_follow_float32s(fmnist_dirs, small_clips, tmp_path):
  """bf16 compute, float32 parameters: the 4 SGD steps' update is float32's
  within bf16's precision, and not float32's bit for bit."""
  config = _small('from_image', fmnist_dirs)
  config.pretrained_path = _image_vit(config, tmp_path / 'image.npz')[0]
  config.optimizer, config.weight_decay, config.base_lr = 'sgd', 0., 0.1
  runs = {}
  for name, dtype, lr in (('start', 'float32', 0.), ('f32', 'float32', 0.1),
                          ('bf16', 'bfloat16', 0.1)):
    config.model.dtype, config.base_lr = dtype, lr
    runs[name] = launch.train_and_evaluate(config, str(tmp_path / name))
  leaves = lambda t: np.concatenate(
      [np.ravel(x) for x in jax.tree_util.tree_leaves(t)])
  assert all(x.dtype == jnp.float32
             for x in jax.tree_util.tree_leaves(runs['bf16']))
  start, f32, bf16 = (leaves(runs[k]) for k in ('start', 'f32', 'bf16'))
  step32, step16 = f32 - start, bf16 - start
  assert np.linalg.norm(step32) > 0
  assert np.linalg.norm(step16 - step32) < 0.05 * np.linalg.norm(step32)
  assert not np.array_equal(step16, step32)


def test_a_crash_resumes_to_the_same_parameters(fmnist_dirs, small_clips,
                                                tmp_path, monkeypatch):
  config = _small('scratch', fmnist_dirs)
  config.total_steps = 6
  whole = launch.train_and_evaluate(config, str(tmp_path / 'whole'))

  def crash(batch):  # in step 6, after step 4's checkpoint
    del batch
    raise RuntimeError('simulated crash')

  interrupt_at(monkeypatch, 5, crash, stream=video_data)
  with pytest.raises(RuntimeError, match='simulated crash'):
    launch.train_and_evaluate(config, str(tmp_path / 'resumed'))
  monkeypatch.undo()
  resumed = launch.train_and_evaluate(config, str(tmp_path / 'resumed'))
  chex.assert_trees_all_close(resumed, whole, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize('change,match', [
    (lambda c: c.video.update(frames=3), 'frames=3 is not a multiple of the '
     "tubelet's 2"),
    (lambda c: c.video.update(stride=0), r'stride=0: expected a positive'),
    (lambda c: c.video.update(kernel_init='middle'), "kernel_init='middle'"),
    (lambda c: c.mixup.update(p=0.5), 'mixes no clips'),
    (lambda c: c.__delitem__('video'), 'needs config.video'),
])
def test_bad_settings_fail_before_loading(change, match):
  config = vivit_fmnist.get_config('scratch').unlock()
  change(config)
  with pytest.raises(ValueError, match=match):
    launch.check(config)


def test_an_image_model_is_refused():
  config = vivit_fmnist.get_config('scratch').unlock()
  del config.model['tubelet']
  with pytest.raises(ValueError, match='trains a video model'):
    launch.check(config)


def test_a_mixer_checkpoint_is_one_error_line(tmp_path):
  """A checkpoint that cannot make a ViViT: one line, before compiling."""
  model = mixer.MlpMixer(num_classes=10, patches={'size': (7, 7)},
                         hidden_dim=16, num_blocks=1, tokens_mlp_dim=8,
                         channels_mlp_dim=8)
  params = model.init(jax.random.key(0), jnp.zeros((1, 28, 28, 3)),
                      train=False)['params']
  files.save(params, str(tmp_path / 'mixer.npz'))
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main',
       '--config=configs/vivit_fmnist.py:from_image',
       f'--workdir={tmp_path / "run"}',
       f'--config.pretrained_path={tmp_path / "mixer.npz"}'],
      cwd=helpers.ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode != 0
  errors = [l for l in result.stderr.splitlines() if l.startswith('Error:')]
  assert len(errors) == 1 and 'Mixer' in errors[0], result.stderr[-2000:]
