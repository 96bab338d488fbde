"""The calls that the original release's notebooks make, in their order and
with their arguments, offline and at tiny sizes: `vit_jax.ipynb` (configs,
datasets, `load_pretrained`, the pmapped `make_update_fn` loop, prediction),
`vit_jax_augreg.ipynb`'s fine-tuning and `lit.ipynb`'s LiT calls.

Only what reaches the network is replaced: a prepared tfds `cifar10` made of
fake CIFAR binary files (conftest's `cifar10_dir`), and checkpoints in the
published layout.
"""

import os

from absl import flags
import flax
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags
import optax
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tests import helpers
from vit_jax import checkpoint
from vit_jax import input_pipeline
from vit_jax import models
from vit_jax import train
from vit_jax import utils
from vit_jax.configs import augreg as augreg_config
from vit_jax.configs import common as common_config
from vit_jax.configs import models as models_config
from vit_jax.data import pipeline
from vit_jax.data import tokenizers
from vit_jax.models import lit as models_lit
from vit_jax.models import registry

ROOT = helpers.ROOT


@pytest.fixture
def default_data_dir(cifar10_dir, monkeypatch):
  """The notebooks name no data_dir: tfds' default is the fake one."""
  monkeypatch.setattr(tfds.core.constants, 'DATA_DIR', cifar10_dir)
  return cifar10_dir


def _published(path, model, side, seed=0):
  """Random parameters of `model` saved as a published .npz."""
  params = helpers.random_params(model, np.zeros((1, side, side, 3)),
                                 train=False, seed=seed, scale=0.1)
  checkpoint.save(params, path)
  return params


def test_vit_jax_notebook(default_data_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  model_name = 'testing'
  _published(f'{model_name}.npz', models.get_model(model_name,
                                                   num_classes=21843), 32)
  # Cells 12-16: the configs and the datasets.
  dataset = 'cifar10'
  batch_size = 16
  config = common_config.with_dataset(common_config.get_config(), dataset)
  config.batch = batch_size
  config.pp.crop = 32
  config.batch_eval = 16  # the notebook's 512 is more than the fake split
  ds_train = pipeline.get_data_from_tfds(config=config, mode='train')
  ds_test = pipeline.get_data_from_tfds(config=config, mode='test')
  num_classes = pipeline.get_dataset_info(dataset, 'train')[
      'num_classes']
  del config
  batch = next(iter(ds_test.as_numpy_iterator()))
  devices = jax.local_device_count()
  assert batch['image'].shape == (devices, 16 // devices, 32, 32, 3)
  assert batch['label'].shape == (devices, 16 // devices, 10)
  assert -1 <= batch['image'].min() < batch['image'].max() <= 1
  np.testing.assert_array_equal(batch['label'].sum(-1), 1)
  # Class c's images have a bright row 3c: pixels / 127.5 - 1.
  label = batch['label'][0, 0].argmax()
  np.testing.assert_allclose(batch['image'][0, 0, 3 * label], 250 / 127.5 - 1,
                             atol=1e-6)
  assert ds_test.cardinality().numpy() == 520 // 16  # remainder dropped
  train_batch = next(iter(ds_train.as_numpy_iterator()))
  assert train_batch['image'].shape == batch['image'].shape

  # Cells 17-23: the model, load_pretrained, pmapped evaluation.
  model_config = models_config.MODEL_CONFIGS[model_name]
  model = models.VisionTransformer(num_classes=num_classes, **model_config)
  variables = jax.jit(lambda: model.init(
      jax.random.PRNGKey(0), batch['image'][0, :1], train=False,
  ), backend='cpu')()
  params = checkpoint.load_pretrained(
      pretrained_path=f'{model_name}.npz',
      init_params=variables['params'], model_config=model_config)
  params_repl = flax.jax_utils.replicate(params)
  vit_apply_repl = jax.pmap(lambda params, inputs: model.apply(
      dict(params=params), inputs, train=False))

  def get_accuracy(params_repl):
    good = total = 0
    steps = pipeline.get_dataset_info(dataset, 'test')[
        'num_examples'] // batch_size
    for _, batch in zip(range(steps), ds_test.as_numpy_iterator()):
      predicted = vit_apply_repl(params_repl, batch['image'])
      is_same = predicted.argmax(axis=-1) == batch['label'].argmax(axis=-1)
      good += is_same.sum()
      total += len(is_same.flatten())
    return good / total

  assert 0 <= get_accuracy(params_repl) <= 1

  # Cells 24-28: fine-tuning with the pmapped update.
  total_steps, warmup_steps, accum_steps, base_lr = 3, 1, 2, 0.03
  lr_fn = utils.create_learning_rate_schedule(total_steps, base_lr, 'cosine',
                                              warmup_steps)
  tx = optax.chain(optax.clip_by_global_norm(1),
                   optax.sgd(learning_rate=lr_fn, momentum=0.9,
                             accumulator_dtype='bfloat16'))
  update_fn_repl = train.make_update_fn(
      apply_fn=model.apply, accum_steps=accum_steps, tx=tx)
  opt_state_repl = flax.jax_utils.replicate(tx.init(params))
  update_rng_repl = flax.jax_utils.replicate(jax.random.PRNGKey(0))
  losses = []
  for _, batch in zip(range(1, total_steps + 1),
                      pipeline.prefetch(ds_train, 2)):
    params_repl, opt_state_repl, loss_repl, update_rng_repl = update_fn_repl(
        params_repl, opt_state_repl, batch, update_rng_repl)
    losses.append(loss_repl[0])
  assert len(losses) == 3 and np.all(np.isfinite(losses))
  assert 0 <= get_accuracy(params_repl) <= 1

  # Cells 29-34: an ImageNet classifier, loaded as is, on one image.
  model = models.VisionTransformer(num_classes=1000, **model_config)
  _published(f'{model_name}_imagenet2012.npz', model, 384, seed=1)
  params = checkpoint.load(f'{model_name}_imagenet2012.npz')
  params['pre_logits'] = {}  # Need to restore empty leaf for Flax.
  img = np.random.default_rng(0).integers(0, 256, (384, 384, 3), np.uint8)
  logits, = model.apply(dict(params=params), (np.array(img) / 128 - 1)[None],
                        train=False)
  assert logits.shape == (1000,)


def test_make_update_fn_is_the_full_batch_update():
  """Pmapped, in 2 micro-batches per device: the same step as one gradient
  of the mean loss over the whole batch (no dropout), by optax."""
  model = models.get_model('testing', num_classes=3,
                           transformer=dict(models_config.MODEL_CONFIGS[
                               'testing'].transformer, dropout_rate=0.0))
  devices = jax.local_device_count()
  rng = np.random.default_rng(0)
  images = rng.normal(size=(devices * 4, 16, 16, 3)).astype(np.float32)
  labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, devices * 4)]
  params = helpers.random_params(model, images[:1], train=False)
  tx = optax.sgd(0.1, momentum=0.9)

  def loss(p):
    logits = model.apply({'params': p}, images, train=False)
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, -1))

  want_loss, grads = jax.value_and_grad(loss)(params)
  updates, _ = tx.update(grads, tx.init(params), params)
  want = optax.apply_updates(params, updates)

  update = train.make_update_fn(apply_fn=model.apply, accum_steps=2, tx=tx)
  batch = {'image': images.reshape(devices, 4, 16, 16, 3),
           'label': labels.reshape(devices, 4, 3)}
  got, _, got_loss, _ = update(
      flax.jax_utils.replicate(params),
      flax.jax_utils.replicate(tx.init(params)), batch,
      flax.jax_utils.replicate(jax.random.PRNGKey(0)))
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a[0], b, atol=1e-6),
               got, want)


def test_learning_rate_schedule_is_the_originals():
  """The original's formula, in numpy: warmup times the decay of progress
  (step - warmup) / (total - warmup), linear to `linear_end`."""
  for decay in ('cosine', 'linear'):
    for warmup in (0, 5):
      lr_fn = utils.create_learning_rate_schedule(100, 0.03, decay, warmup)
      steps = np.arange(101)
      progress = np.clip((steps - warmup) / (100 - warmup), 0, 1)
      want = (0.03 * 0.5 * (1 + np.cos(np.pi * progress)) if decay == 'cosine'
              else 1e-5 + (0.03 - 1e-5) * (1 - progress))
      if warmup:
        want = want * np.minimum(1, steps / warmup)
      np.testing.assert_allclose([lr_fn(s) for s in steps], want, atol=1e-8)
  # Warmup longer than the run, as the notebook's 5 of 3 steps here.
  lr_fn = utils.create_learning_rate_schedule(3, 0.03, 'cosine', 5)
  np.testing.assert_allclose([lr_fn(s) for s in range(4)], 0, atol=1e-9)
  with pytest.raises(ValueError, match="Unknown decay_type 'step'"):
    utils.create_learning_rate_schedule(100, 0.03, 'step', 5)


def test_original_config_keys_and_presets(monkeypatch):
  """`--config.eval_every` and `optim_dtype` set the fields they name now;
  MODEL_CONFIGS has every preset, `testing` included."""
  argv = ['main', f'--config={ROOT}/configs/default.py',
          '--config.eval_every=7', '--config.optim_dtype=bfloat16']
  monkeypatch.setattr('sys.argv', argv)  # config_flags reads it
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', flag_values=values)
  values(argv)
  assert values.config.evals.test.every == 7
  assert values.config.momentum_dtype == 'bfloat16'
  assert models_config.MODEL_CONFIGS is registry.MODEL_CONFIGS
  assert 'testing' in models_config.MODEL_CONFIGS
  assert models_config.AUGREG_CONFIGS['R26_S_32'].model_name == 'R26+ViT-S_32'
  with pytest.raises(ValueError, match='AugReg model or filename'):
    augreg_config.get_config('R_Ti_17')


def _augreg_index(directory):
  """index.csv with two i21k pre-trainings of R_Ti_16 and an i1k one."""
  names = ['R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0',
           'R_Ti_16-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0',
           'R_Ti_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0']
  rows = ['name,ds,filename,final_val,adapt_filename'] + [
      f'R+Ti/16,{name.split("-")[1]},{name},{val},{name}--cifar10'
      for name, val in zip(names, (0.30, 0.35, 0.70))]
  (directory / 'index.csv').write_text('\n'.join(rows) + '\n')
  return names[1]  # the best i21k one


def _images_folder(root):
  """{train,test}/<class>/<n>.jpg: 10 classes (the same head as cifar10's,
  so the compiled step is reused), 2 training and 1 test image each. Each
  image is one gray level, 20 * class + (0 or 1 in train/, 10 in test/)."""
  for split, levels in (('train', (0, 1)), ('test', (10,))):
    for c in range(10):
      folder = root / split / f'c{c}'
      folder.mkdir(parents=True, exist_ok=True)
      for i, level in enumerate(levels):
        pixels = np.full((40, 40, 3), 20 * c + level, np.uint8)
        (folder / f'{i}.jpg').write_bytes(tf.io.encode_jpeg(pixels).numpy())
  return str(root)


def _levels(batch):
  """The gray level (mod 20: which split) of each image of a batch."""
  images = np.asarray(batch['image']).reshape(-1, *batch['image'].shape[-3:])
  return np.round((images.mean(axis=(1, 2, 3)) + 1) * 127.5) % 20


def test_vit_jax_augreg_notebook(default_data_dir, tmp_path, capsys):
  checkpoints = tmp_path / 'augreg'
  checkpoints.mkdir()
  best = _augreg_index(checkpoints)
  df = checkpoint.get_augreg_df(directory=str(checkpoints))
  assert len(df) == 3 and set(df.ds) == {'i21k', 'i1k'}
  config = augreg_config.get_config('R_Ti_16')
  config.model.transformer.num_layers = 1  # tiny: R+Ti/16 with one block
  model = models.get_model('R+ViT-Ti_16', num_classes=21843,
                           transformer=config.model.transformer.to_dict())
  _published(checkpoints / f'{best}.npz', model, 32)
  config.pretrained_dir = str(checkpoints)  # stands in for gs://vit_models
  config.dataset = 'cifar10'
  config.pp.train = 'train[:90%]'
  config.pp.test = 'train[90%:]'
  config.batch_eval = 8
  config.base_lr = 0.01
  config.shuffle_buffer = 1000
  config.total_steps = 2
  config.warmup_steps = 1
  config.accum_steps = 0  # Not needed with R+Ti/16 model.
  config.pp['crop'] = 32
  config.batch = 16
  config.eval_every = 1  # the original's key: evaluate every step
  state = train.train_and_evaluate(config, str(tmp_path / 'tfds_run'))
  assert 'Transformer' in state
  out = capsys.readouterr().out
  assert f'Fine-tuning from {checkpoints / best}.npz' in out
  assert out.count('test accuracy') >= 3  # steps 1, 2, and the final line

  # The notebook keeps the tfds split specs ('train[:90%]', 'train[90%:]')
  # when it switches to a folder: the folder's train/ and test/ are read.
  config.dataset = _images_folder(tmp_path / 'flower_photos')
  ds_train, ds_test = input_pipeline.get_datasets(config)
  tests = [next(iter(ds_test.as_numpy_iterator()))]
  assert sum(len(b['label'].reshape(-1, 10)) for b in tests) == 8  # of 10
  assert np.all(_levels(tests[0]) == 10)  # test/ only
  trains = ds_train.take(2).as_numpy_iterator()  # 32: all 20 of train/, and more
  levels = np.concatenate([_levels(b) for b in trains])
  assert set(levels) == {0, 1}
  opt = train.train_and_evaluate(config, str(tmp_path / 'folder_run'))
  assert opt['head']['kernel'].shape[-1] == 10
  # The original's reader of one folder; its info.
  ds = pipeline.get_data_from_directory(
      config=config, directory=f'{config.dataset}/test', mode='test')
  batch = next(iter(ds.as_numpy_iterator()))
  devices = jax.local_device_count()
  assert batch['image'].shape == (devices, 8 // devices, 32, 32, 3)
  info = pipeline.get_dataset_info(config.dataset, 'test')
  assert (info['num_examples'], info['num_classes']) == (10, 10)
  assert info['int2str'](0) == 'c0' and info['examples_glob']


def test_lit_notebook(tmp_path, monkeypatch):
  """lit.ipynb's calls with a tiny LiT whose files are 'published' here."""
  published = tmp_path / 'published'
  published.mkdir()
  monkeypatch.setattr(models_lit, 'BASE_PATH', str(published))
  texts = ['itap of a cd player', 'a photo of a truck', 'gas station',
           'chainsaw', 'a bad photo of colorful houses']
  tokenizers.train_sentencepiece(texts * 20, str(published / 'LiT-tiny.model'),
                                 vocab_size=40)
  lit_model = models.LitModel(
      image=dict(models_config.MODEL_CONFIGS['testing']),
      text_model='text_transformer', out_dim=(8, 8),
      text=dict(width=16, num_layers=1, mlp_dim=16, num_heads=2,
                vocab_size=40),
      pp=dict(tokenizer_name='sentencepiece', max_len=8, size=32),
      model_name='LiT-tiny')
  variables = lit_model.init(jax.random.PRNGKey(0),
                             images=np.zeros((1, 32, 32, 3), np.float32),
                             tokens=np.zeros((1, 8), np.int32))
  checkpoint.save(variables['params'], published / 'LiT-tiny.npz')
  monkeypatch.chdir(tmp_path)

  assert [n for n in models.model_configs.MODEL_CONFIGS
          if n.startswith('LiT')]
  lit_variables = lit_model.load_variables()
  assert os.path.exists('LiT-tiny.npz')  # cached here, as the original
  tokenizer = lit_model.get_tokenizer()
  image_preprocessing = lit_model.get_image_preprocessing()
  pp = lit_model.get_pp()
  rng = np.random.default_rng(0)
  images_list = [rng.integers(0, 256, shape, np.uint8)
                 for shape in ((40, 60, 3), (32, 32, 3), (50, 20, 3))]
  images = image_preprocessing(images_list)
  assert images.shape == (3, 32, 32, 3)
  assert -1 <= images.min() and images.max() <= 1
  tokens = tokenizer(texts)
  assert tokens.shape == (5, 8)
  zimg, ztxt, out = lit_model.apply(lit_variables, images=images,
                                    tokens=tokens)
  probs = np.array(jax.nn.softmax(out['t'] * ztxt @ zimg.T, axis=1))
  np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)
  _, ztxt_alone, _ = lit_model.apply(lit_variables, tokens=tokens)
  np.testing.assert_allclose(ztxt_alone, ztxt, rtol=1e-5)
  # The tf.data form gives the same images and tokens.
  ds = tf.data.Dataset.from_tensor_slices(
      {'image': images_list[1][None], 'text': texts[:1]})
  example = next(iter(ds.map(pp)))
  np.testing.assert_array_equal(example['image'], images[1])
  np.testing.assert_array_equal(example['tokens'], tokens[0])
  # A central crop (the short side to 32 first) of the 40x60 image.
  cropped = lit_model.get_image_preprocessing(crop=True)(images_list[:1])
  resized = tf.image.resize(images_list[0], (32, 48), method='bilinear')
  want = tf.cast(tf.cast(resized[:, 8:40], tf.uint8), tf.float32) / 255 * 2 - 1
  np.testing.assert_array_equal(cropped[0], want)


def test_the_original_module_names_are_the_modules_of_now():
  """`original.MODULES`: each of the original's names imports the module
  that holds its code, the same object."""
  import importlib  # pylint: disable=g-import-not-at-top
  from vit_jax import original  # pylint: disable=g-import-not-at-top
  for alias, target in original.MODULES.items():
    assert importlib.import_module(alias) is importlib.import_module(target)
  from vit_jax.models import lit  # pylint: disable=g-import-not-at-top
  for name in ('load_variables', 'get_tokenizer', 'get_image_preprocessing',
               'get_pp', 'vocab_path'):
    assert hasattr(lit.LitModel, name), name
  assert models.model_configs.MODEL_CONFIGS is models.MODEL_CONFIGS
