"""trainer='captioning': the loss and the scoring classifier against numpy
and explicit sums; CapPa and the LLaVA connector end to end on tiny
Fashion-MNIST (export, `vit_jax.caption`, evaluate), 1 vs 8 devices, and a
crash then resume."""

import json
import os
import subprocess
import sys

import chex
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from tests.models import test_captioning as model_tests
from vit_jax import caption
from vit_jax import launch
from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.configs import captioning_fmnist
from vit_jax.configs import common
from vit_jax.data import captions as caption_data
from vit_jax.data import local_datasets
from vit_jax.data import scenes
from vit_jax.evaluators import captioning as captioning_eval
from vit_jax.run import loop
from vit_jax.tasks import captioning as captioning_task

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
pytestmark = pytest.mark.xdist_group('captioning')


def _config(arm, fmnist_dirs, encoder=None, evals=True):
  config = captioning_fmnist.get_config(arm).unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.tfds_download = False
  common.with_model(config, 'testing')
  config.model_name = f'ViT-fmnist-{arm}'  # the export's name
  config.pp.crop = 32
  config.pp.test = 'test[:16]'
  config.pretrained_path = encoder
  config.captioning.decoder = dict(width=16, num_layers=1, num_heads=2,
                                   mlp_dim=32, remat=False, dtype='float32')
  config.captioning.block = -1  # the testing ViT has one block
  config.captioning.vocab_size = 64
  config.update(total_steps=6, warmup_steps=1, batch=8, batch_eval=16,
                base_lr=0.01, progress_every=1, checkpoint_every=2,
                shuffle_buffer=64)
  if not evals:
    config.evals = {}
  return config


def test_token_loss_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  targets = np.array([[1, 2, 0], [4, 4, 3]])
  weights = np.array([[1., 1., 0.], [1., 1., 1.]])
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(
      losses.token_cross_entropy(logits, targets, weights),
      -(picked * weights).sum() / 5, rtol=1e-5)


def test_scoring_is_the_mean_log_likelihood_of_each_class():
  """Each class's score: the mean over its prompts of the sum of log p of
  the prompt's tokens to its </s>, one prompt and image at a time."""
  bos, eos = 1, 2
  model = model_tests._captioner('cross_attention', vocab=6, max_len=4)
  params, images = model_tests._init(model, seed=7)
  prompts = np.array([[3, eos, eos, eos], [3, 4, eos, eos],   # class 0
                      [5, 5, 4, eos], [4, eos, eos, eos]])    # class 1
  got = captioning_eval.class_scores(model, params, images,
                                     jnp.asarray(prompts), bos=bos, eos=eos,
                                     templates=2)
  want = np.zeros((3, 2))
  one = jax.jit(lambda image, inputs: model.apply(
      {'params': params}, image[None], inputs[None])[0])
  for i in range(3):
    for p, prompt in enumerate(prompts):
      logits = np.asarray(one(images[i], jnp.asarray([bos, *prompt[:-1]])))
      logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
      end = list(prompt).index(eos)
      want[i, p // 2] += sum(logp[t, prompt[t]] for t in range(end + 1)) / 2
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope='module')
def cappa_run(fmnist_dirs, tmp_path_factory):
  """A CapPa run (trains encoder and decoder) on the 8 devices: its workdir
and its final parameters."""
  workdir = str(tmp_path_factory.mktemp('cappa'))
  params = launch.train_and_evaluate(_config('cappa', fmnist_dirs), workdir)
  return workdir, jax.device_get(params)


def test_cappa_runs_exports_and_captions(cappa_run, fmnist_dirs, tmp_path):
  cappa_run, _ = cappa_run
  results = json.load(open(os.path.join(cappa_run, 'results.json')))
  assert 0 <= results['scoring_accuracy'] <= 1
  assert {'exact_match', 'token_f1', 'cider_d'} <= results.keys()
  assert len(results['samples']) == 8 and results['count'] == 16
  npz = os.path.join(cappa_run, 'ViT-fmnist-cappa.npz')
  encoder = files.load(npz)
  assert 'Transformer' in encoder and 'text' not in encoder  # published
  decoder = files.load(npz[:-4] + '.decoder.npz')
  assert set(decoder) == {'text'}
  # The command line, on a workdir and on the .npz.
  image = tmp_path / 'item.png'
  Image.fromarray(np.full((28, 28), 200, np.uint8)).save(image)
  broken = tmp_path / 'broken.png'
  broken.write_text('not an image')
  out = subprocess.run(
      [sys.executable, '-m', 'vit_jax.caption', f'--checkpoint={cappa_run}',
       '--beam=3', str(image), str(broken)], cwd=ROOT, capture_output=True,
      text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS='cpu'))
  # The good image is captioned; the broken one named on stderr, exit 1.
  assert out.returncode == 1, out.stderr[-2000:]
  assert out.stdout.startswith(f'{image}: ') and str(broken) not in out.stdout
  assert f"Error: cannot identify image file '{broken}'" in out.stderr
  with pytest.raises(FileNotFoundError, match='not found'):
    caption.export(str(tmp_path / 'absent'))
  with pytest.raises(files.CheckpointError, match='not a captioner export'):
    captioning_task.load_captioner(str(image))
  # trainer='evaluate' on the export: the run's metrics.
  config = _config('cappa', fmnist_dirs)
  config.trainer, config.pretrained_path = 'evaluate', npz
  result = launch.evaluate(config, str(tmp_path / 'eval'))
  assert result['scoring_accuracy'] == pytest.approx(
      results['scoring_accuracy'], abs=1e-6)
  assert result['cider_d'] == pytest.approx(results['cider_d'], abs=1e-6)


def test_llava_trains_the_connector_on_a_frozen_encoder(cappa_run,
                                                        fmnist_dirs,
                                                        tmp_path):
  """A published-layout encoder (CapPa's export) frozen; the projector and
  the LM train; the optimizer keeps no state for the encoder."""
  encoder_npz = os.path.join(cappa_run[0], 'ViT-fmnist-cappa.npz')
  config = _config('llava', fmnist_dirs, encoder=encoder_npz)
  workdir = str(tmp_path / 'llava')
  params = launch.train_and_evaluate(config, workdir)
  assert set(params) == {'text', 'projector'}
  exported = files.load(os.path.join(workdir, 'ViT-fmnist-llava.npz'))
  jax.tree.map(np.testing.assert_array_equal, exported,
               files.load(encoder_npz))
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert 0 <= results['scoring_accuracy'] <= 1
  task = launch.make_task(config, workdir)
  _, abstract, _ = loop.abstract_state(task, config, task.mesh)
  size = lambda tree: sum(np.size(x) for x in jax.tree.leaves(tree))
  assert size(abstract.opt_state) <= 3 * size(params)
  # Stage 1: the projector alone, the LM from the stage-2 decoder.
  config.captioning.trained = 'projector'
  config.captioning.decoder_init = os.path.join(
      workdir, 'ViT-fmnist-llava.decoder.npz')
  config.evals = {}
  stage1 = launch.train_and_evaluate(config, str(tmp_path / 'stage1'))
  jax.tree.map(np.testing.assert_array_equal, stage1['text'], params['text'])
  assert not np.allclose(stage1['projector']['Dense_0']['kernel'],
                         params['projector']['Dense_0']['kernel'])


def test_one_device_equals_eight(cappa_run, fmnist_dirs, tmp_path,
                                 monkeypatch):
  """`cappa_run` (8 devices) again on 1 device, without its evaluations
  (which train nothing)."""
  assert jax.device_count() == 8
  _, p8 = cappa_run
  monkeypatch.setattr(jax, 'devices', lambda: jax.local_devices()[:1])
  config = _config('cappa', fmnist_dirs, evals=False)
  config.checkpoint_every = 0  # saves change no parameter
  p1 = launch.train_and_evaluate(config, str(tmp_path))
  # A key bias adds one logit to all keys of a query, which the softmax
  # cancels: its gradient is round-off, which Adam turns into steps.
  drop = lambda tree: {k: v for k, v in traverse_util.flatten_dict(
      tree, sep='/').items() if not k.endswith('key/bias')}
  # Adam's steps are ~lr (1e-2) whatever the gradient's size: a sum in
  # another order may move a weight by round-off, a wrong step by ~1e-2.
  chex.assert_trees_all_close(drop(p1), drop(p8), rtol=1e-4, atol=1e-4)


def test_crash_then_resume_equals_uninterrupted(fmnist_dirs, tmp_path,
                                                monkeypatch):
  config = _config('cappa_ar', fmnist_dirs, evals=False)
  config.total_steps = 8
  reference = launch.train_and_evaluate(config, str(tmp_path / 'ref'))
  original = caption_data.train_iterator

  def crashing(*args, **kw):
    for i, batch in enumerate(original(*args, **kw)):
      if i == 5:  # after the checkpoints of steps 2 and 4
        raise KeyboardInterrupt('crash')
      yield batch

  monkeypatch.setattr(caption_data, 'train_iterator', crashing)
  with pytest.raises(KeyboardInterrupt):
    launch.train_and_evaluate(config, str(tmp_path / 'run'))
  monkeypatch.setattr(caption_data, 'train_iterator', original)
  resumed = launch.train_and_evaluate(config, str(tmp_path / 'run'))
  chex.assert_trees_all_close(resumed, reference, rtol=1e-5, atol=1e-7)


def test_bad_settings_are_named(fmnist_dirs, tmp_path):
  with pytest.raises(ValueError, match="Unknown argument 'cap'"):
    captioning_fmnist.get_config('cap')
  for change, message in (
      (dict(connector='film'), "connector='film'"),
      (dict(connector='prefix', masked_pred_prob=0.5), 'CapPa'),
      (dict(trained='projector'), 'decoder_init'),
      (dict(tokenizer='bert'), 'needs one of'),
      (dict(max_len=8), 'max_len=8 cuts captions of 19 tokens')):
    config = _config('cappa', fmnist_dirs)
    config.captioning.update(change)
    with pytest.raises(ValueError, match=message):
      launch.train_and_evaluate(config, str(tmp_path / 'bad'))
  assert not os.path.exists(tmp_path / 'bad')



def test_scene_captions_are_the_references(fmnist_dirs, tmp_path,
                                           monkeypatch):
  """',scenes': captions of the dataset's `caption` feature, as the
  evaluator decodes them back from the test examples' tokens."""
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TRAIN', 24)
  monkeypatch.setattr(local_datasets.FashionMnistScenes, 'NUM_TEST', 10)
  config = _config('cappa,scenes', fmnist_dirs)
  config.tfds_data_dir = str(tmp_path / 'tfds')
  config.pp.crop = 32
  config.pp.test = 'test'
  config.update(total_steps=2, checkpoint_every=0)
  workdir = str(tmp_path / 'run')
  launch.train_and_evaluate(config, workdir)
  results = json.load(open(os.path.join(workdir, 'results.json')))
  assert results['count'] == 10 and 'scoring_accuracy' not in results
  builder = local_datasets.FashionMnistScenes(data_dir=config.tfds_data_dir)
  want = [scenes.caption(x['segmentation_mask']) for x in
          tfds.as_numpy(builder.as_dataset(split='test'))][:8]
  assert [s['reference'] for s in results['samples']] == want
