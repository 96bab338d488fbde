"""LiT training and zero-shot evaluation on tiny offline data (8 devices)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.configs import lit_fmnist
from tests import helpers
from vit_jax.checkpoints import files
from vit_jax import models
from vit_jax import launch
from vit_jax.data import captions as caption_data
from vit_jax.data import pipeline
from vit_jax.data import tokenizers
from vit_jax.evaluators import zeroshot
from vit_jax.run import loop
from vit_jax.platform import sharding
from vit_jax.tasks import lit


@pytest.fixture
def image_npz(tmp_path):
  """A 'testing' ViT classifier (10 classes) at 32 px, as a trained one."""
  vit = models.get_model('testing', num_classes=10)
  params = helpers.random_params(vit, jnp.zeros((1, 32, 32, 3)), train=False)
  path = str(tmp_path / 'vit.npz')
  files.save(params, path)
  return path


def _config(fmnist_dirs, image_npz, loss='softmax'):
  config = helpers.tiny_image_text(lit_fmnist.get_config(loss), fmnist_dirs)
  config.lit.image_init = image_npz
  config.total_steps = 4
  config.warmup_steps = 1
  config.batch = 16
  config.batch_eval = 8
  config.shuffle_buffer = 100
  config.progress_every = 2
  config.evals.zeroshot.every = 0
  config.checkpoint_every = 0
  return config


def _state_and_batch(config, workdir):
  task = lit.Task(config, workdir, sharding.make_mesh(config.mesh))
  manager = loop.make_manager(config, os.path.join(workdir, 'ckpt'))
  state, _, _ = loop.create_state(task, config, task.mesh, manager)
  batch = next(caption_data.train_iterator(config, task.tokenizer,
                                           batch_size=config.batch))
  return task, state, batch


@pytest.mark.parametrize('loss', ['softmax', 'sigmoid'])
def test_steps_lower_the_loss_and_leave_the_image_tower(
    fmnist_dirs, image_npz, tmp_path, loss):
  config = _config(fmnist_dirs, image_npz, loss)
  config.base_lr = 3e-3
  config.total_steps = 100  # the schedule's length; 20 steps are taken
  task, state, batch = _state_and_batch(config, str(tmp_path))
  loaded = files.load(image_npz)
  del loaded['head']  # no image projection: the class token is the embedding
  jax.tree.map(np.testing.assert_array_equal, state.params['img'], loaded)
  # No optimizer state for the locked tower.
  opt_leaves = sum(x.size for x in jax.tree.leaves(state.opt_state))
  text_size = sum(x.size for k, v in state.params.items() if k != 'img'
                  for x in jax.tree.leaves(v))
  assert opt_leaves < 3 * text_size
  img_before = jax.device_get(state.params['img'])

  step = jax.jit(lambda s, b: task.train_step(s, b, rng=jax.random.key(0)))
  losses = []
  for _ in range(20):
    state, metrics = step(state, batch)
    losses.append(float(metrics['loss']))
  assert losses[-1] < losses[0] - 0.1, losses
  jax.tree.map(np.testing.assert_array_equal, state.params['img'], img_before)


def _captions_folder(root, n, size, names):
  """`n` images, a bright band by class as in the tiny Fashion-MNIST, and
  captions.tsv naming each image's class."""
  root.mkdir()
  rng = np.random.default_rng(0)
  lines = []
  for i in range(n):
    label = i % len(names)
    image = rng.integers(0, 60, (size, size, 3))
    image[2 * label + 4:2 * label + 7] = 250
    tf.io.write_file(str(root / f'{i}.png'),
                     tf.io.encode_png(image.astype(np.uint8)))
    lines.append(f'{i}.png\ta photo of a {names[label]}')
  (root / 'captions.tsv').write_text('\n'.join(lines) + '\n')
  return str(root)


def test_train_on_a_captions_folder_then_zeroshot(fmnist_dirs, image_npz,
                                                  tmp_path, capsys):
  config = _config(fmnist_dirs, image_npz, 'sigmoid')
  config.dataset = _captions_folder(tmp_path / 'pairs', 32, 32,
                                    config.evals.zeroshot.class_names)
  config.evals.zeroshot.dataset = 'fashion_mnist_local'
  workdir = str(tmp_path / 'lit')
  launch.train_and_evaluate(config, workdir)
  out = capsys.readouterr().out
  assert 'Done: 4 steps, zero-shot accuracy' in out
  exported = os.path.join(workdir, f'{config.model_name}.npz')
  assert os.path.exists(exported) and os.path.exists(
      os.path.join(workdir, 'vocab.model'))
  trained = json.load(open(os.path.join(workdir, 'results.json')))
  assert trained['count'] == 37  # every test example, none padded in

  config.trainer = 'zeroshot'
  result = launch.evaluate(config, workdir)
  assert result == {k: trained[k] for k in ('zeroshot_accuracy', 'count')}


class TinyCaptions(tfds.core.GeneratorBasedBuilder):
  """Images with a text feature and no labels, as coco_captions."""
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(8, 8, 3)),
        'caption': tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples()}

  def _generate_examples(self):
    for i in range(8):
      yield i, {'image': np.full((8, 8, 3), 30 * i, np.uint8),
                'caption': f'a photo of image {"abcdefgh"[i]}'}


def test_tfds_text_feature_pairs_images_and_captions(tmp_path):
  TinyCaptions(data_dir=str(tmp_path)).download_and_prepare()
  config = lit_fmnist.get_config()
  config.dataset, config.tfds_data_dir = 'tiny_captions', str(tmp_path)
  config.pp.crop, config.pp.flip, config.shuffle_buffer = 8, False, 8
  config.lit.text_key = 'caption'
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', 'a', 'photo', 'of',
                              'image', *'abcdefgh']) + '\n')
  tok = tokenizers.get_tokenizer('bert', str(vocab), 7)
  batch = next(caption_data.train_iterator(config, tok, batch_size=8))
  for image, tokens in zip(batch['image'], batch['tokens']):
    i = int(round((image.mean() + 1) * 127.5 / 30))
    np.testing.assert_array_equal(
        tokens, tok([f'a photo of image {"abcdefgh"[i]}'])[0])
  assert len(caption_data.all_captions(config)) == 8
  config.lit.text_key = 'text'
  with pytest.raises(ValueError, match="no feature 'text'"):
    caption_data.train_iterator(config, tok, batch_size=8)


def test_zeroshot_accuracy_matches_numpy(fmnist_dirs, image_npz, tmp_path):
  config = _config(fmnist_dirs, image_npz)
  workdir = str(tmp_path)
  mesh = sharding.make_mesh(config.mesh)
  task = lit.Task(config, workdir, mesh)
  tokenizer, model = task.tokenizer, task.model
  params = model.init(jax.random.key(3), images=jnp.zeros((1, 32, 32, 3)),
                      tokens=jnp.zeros((1, 8), jnp.int32))['params']
  names = list(config.evals.zeroshot.class_names)
  templates = ('a photo of a {}.', 'a {}.')
  classes = zeroshot.class_embeddings(model, params, tokenizer, names,
                                      templates)
  # Reference: each prompt alone, averaged and normalized in numpy.
  embed = jax.jit(lambda tokens: model.apply({'params': params},
                                             tokens=tokens)[1])
  ref = []
  for name in names:
    z = [embed(tokenizer([t.format(name)])) for t in templates]
    mean = np.mean(np.concatenate(z), axis=0)
    ref.append(mean / np.linalg.norm(mean))
  np.testing.assert_allclose(classes, np.stack(ref), atol=1e-5)

  info = pipeline.dataset_info(pipeline.get_builder(config),
                                         config)
  settings = config.evals.zeroshot.copy_and_resolve_references()
  settings.templates = templates
  evaluator = zeroshot.Evaluator('zeroshot', settings, config=config,
                                 model=model, mesh=mesh,
                                 tokenizer=task.tokenizer)
  result = evaluator(params)
  images, labels = [], []
  for batch in pipeline.eval_batches(info, config,
                                                    batch_size=37):
    images.append(batch['image'][batch['mask'] > 0])
    labels.append(batch['label'][batch['mask'] > 0].argmax(-1))
  zimg = model.apply({'params': params}, images=np.concatenate(images))[0]
  want = np.mean(np.argmax(np.asarray(zimg) @ np.stack(ref).T, 1) ==
                 np.concatenate(labels))
  assert result['count'] == 37
  assert result['zeroshot_accuracy'] == pytest.approx(want)


def test_captions_file_pairs_images_and_captions(tmp_path):
  folder = tmp_path / 'pairs'
  folder.mkdir()
  captions = {}
  lines = []
  for i in range(8):
    image = np.full((8, 8, 3), 30 * i, np.uint8)
    name = f'img{i}.png'
    tf.io.write_file(str(folder / name), tf.io.encode_png(image))
    captions[i] = f'a photo of image {"abcdefgh"[i]}'
    lines.append(f'{name}\t{captions[i]}')
  (folder / 'captions.tsv').write_text('\n'.join(lines) + '\n')
  config = lit_fmnist.get_config()
  config.dataset = str(folder)
  config.pp.crop = 8
  config.pp.flip = False
  config.shuffle_buffer = 8
  vocab = tmp_path / 'vocab.txt'
  vocab.write_text('\n'.join(['[PAD]', '[UNK]', '[CLS]', 'a', 'photo', 'of',
                              'image', *'abcdefgh']) + '\n')
  tok = tokenizers.get_tokenizer('bert', str(vocab), 7)
  batch = next(caption_data.train_iterator(config, tok, batch_size=8))
  seen = set()
  for image, tokens in zip(batch['image'], batch['tokens']):
    i = int(round((image.mean() + 1) * 127.5 / 30))
    np.testing.assert_array_equal(tokens, tok([captions[i]])[0])
    seen.add(i)
  assert seen == set(range(8))


def test_bad_settings_fail_before_compiling(fmnist_dirs, image_npz, tmp_path):
  config = _config(fmnist_dirs, image_npz, 'softmax')
  config.lit.loss = 'sigmoid'  # but no bias
  with pytest.raises(ValueError, match='needs a learned bias'):
    launch.train_and_evaluate(config, str(tmp_path / 'a'))
  config = _config(fmnist_dirs, None)
  with pytest.raises(ValueError, match='image_init'):
    launch.train_and_evaluate(config, str(tmp_path / 'b'))
  config = _config(fmnist_dirs, image_npz)
  config.lit.class_captions = (('a cat',), ('a dog',))
  with pytest.raises(ValueError, match='2 lists for the 10 classes'):
    launch.train_and_evaluate(config, str(tmp_path / 'c'))
  config = _config(fmnist_dirs, image_npz)
  config.model.out_dim = (None, 12)
  with pytest.raises(ValueError, match='embeds in 10 dimensions, the text '
                     'tower in 12'):
    launch.train_and_evaluate(config, str(tmp_path / 'e'))
  config = _config(fmnist_dirs, image_npz)
  config.evals.zeroshot.templates = ('a photo',)
  with pytest.raises(ValueError, match='no {} for the class name'):
    launch.train_and_evaluate(config, str(tmp_path / 'd'))


@pytest.mark.parametrize('loss', ['softmax', 'sigmoid'])
def test_fmnist_config_builds_and_validates(loss):
  config = lit_fmnist.get_config(loss)
  lit.validate_lit_config(config)
  params = lit.abstract_params(config, models.LitModel(**config.model))
  assert ('b' in params) == (loss == 'sigmoid')
  assert config.model.model_name == config.model_name == f'LiT-fmnist-{loss}'
  assert len(config.lit.class_captions) == 10
  with pytest.raises(ValueError, match='Unknown loss'):
    lit_fmnist.get_config('hinge')


# folder: (preset, tokenizer file, tokenizer).
FOLDER_TOWERS = {
    'clip': ('CLIP-testing-quickgelu-towers', 'tokenizer.json', 'clip'),
    'siglip': ('SigLIP-testing-towers', 'spiece.model', 'siglip'),
    'siglip2': ('SigLIP2-testing-naflex-towers', 'tokenizer.model', 'gemma'),
}


@pytest.mark.parametrize('name', FOLDER_TOWERS)
def test_zeroshot_from_a_transformers_folder(name, fmnist_dirs, tmp_path,
                                             monkeypatch, capsys):
  """`trainer=evaluate` with the zero-shot evaluator, from the folder alone:
  its model, normalization and tokenizer come from the conversion's
  record (tests/data/transformers, transformers 5.23's tiny models; SigLIP
  2's NaFlex tower on the 32 x 32 images)."""
  from vit_jax import run_config  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))
  config = lit_fmnist.get_config('softmax')
  with config.unlocked():
    config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
    config.pp.crop = 32
    config.batch_eval = 8
    config.trainer = 'evaluate'
    config.pretrained_path = os.path.join(helpers.DATA, 'transformers', name)
  config = run_config.resolve(config, {'pretrained_path': '',
                                       'trainer': 'evaluate'})
  preset, vocabulary, tokenizer = FOLDER_TOWERS[name]
  assert config.model_name == preset
  assert config.lit.vocab_path.endswith(vocabulary)
  assert config.model.pp.tokenizer_name == tokenizer
  result = launch.evaluate(config, str(tmp_path / 'eval'))
  assert result['count'] == 37 and 0 <= result['zeroshot_accuracy'] <= 1
  assert 'zero-shot accuracy' in capsys.readouterr().out
