"""A preset's name and a checkpoint's record settle a run's model and input
normalization (`run_config`), for every command on any config."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import tensorflow as tf

from tests import helpers
from vit_jax.checkpoints import loading
from vit_jax import convert
from vit_jax import models
from vit_jax import predict
from vit_jax import launch
from vit_jax.configs import default
from vit_jax.convert import transform
from vit_jax.data import pipeline
from vit_jax.evaluators import fewshot
from vit_jax.run import checks
from vit_jax import run_config
from vit_jax import launch

DATA = helpers.DATA
ROOT = helpers.ROOT
# What each family's weights expect: Google's [-1, 1] (None: the pipeline's
# own scale), timm's ImageNet statistics (timm.data.IMAGENET_DEFAULT_*).
GOOGLE = (None, None)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
CLIP = ((0.48145466, 0.4578275, 0.40821073),  # timm.data.OPENAI_CLIP_*
        (0.26862954, 0.26130258, 0.27577711))
FAMILIES = {'ViT-B_16': GOOGLE, 'R50+ViT-B_16': GOOGLE, 'Mixer-B_16': GOOGLE,
            'BiT-R50x1': GOOGLE, 'LiT-B16B': GOOGLE, 'DeiT-S_16': IMAGENET,
            'DeiT3-S_16': IMAGENET, 'DINOv2-S_14': IMAGENET,
            'MAE-B_16': IMAGENET, 'Swin-T': IMAGENET, 'CLIP-B_16': CLIP,
            'SigLIP-So400m_14': GOOGLE, 'EVA02-B_14': CLIP,
            'DINOv3-S_16': IMAGENET}


def command(flags):
  """configs/default.py as `python -m vit_jax.main` makes it of `flags`
  ({KEY: VALUE} for `--config.KEY=VALUE`): those absl parses applied, then
  settled by `run_config` with the model flags it holds back."""
  argv, held = run_config.held_model_flags(
      [f'--config.{k}={v}' for k, v in flags.items()])
  parsed = {k: v for k, v in flags.items() if f'--config.{k}={v}' in argv}
  config = default.get_config()
  config.update_from_flattened_dict(parsed)
  return run_config.resolve(config, parsed, held)


def _model(config):
  out = config.model.to_dict()
  out.pop('model_name')
  return out


def _preset(name, **changes):
  out = models.MODEL_CONFIGS[name].to_dict()
  out.pop('model_name')
  return dict(out, **changes)


@pytest.mark.parametrize('name', sorted(FAMILIES))
def test_preset_name_brings_its_model_and_normalization(name, capsys):
  config = default.get_config()
  config.pp.mean, config.pp.std = (0.1,) * 3, (0.2,) * 3  # the config's own
  config.model_name = name
  config = run_config.resolve(config, {'model_name': name})
  assert _model(config) == _preset(name)
  assert (config.pp.mean, config.pp.std) == FAMILIES[name]
  assert config.model.model_name == name and config.is_locked
  note = capsys.readouterr().err
  assert note.count('\n') == 1
  assert f'config.model_name={name}: the preset won over' in note


def test_given_flags_win_over_the_preset(capsys):
  config = command({'model_name': 'DINOv2-S_14', 'pp.std': (0.5, 0.5, 0.5),
                    'model.transformer.num_layers': 3})
  assert _model(config) == _preset('DINOv2-S_14', transformer=dict(
      _preset('DINOv2-S_14')['transformer'], num_layers=3))
  assert (config.pp.mean, config.pp.std) == (IMAGENET[0], (0.5,) * 3)
  note = capsys.readouterr().err
  assert ('--config.model.transformer.num_layers, --config.pp.std given, '
          'over it') in note
  assert 'differing in' in note and 'num_layers' not in note.split(';')[1]
  with pytest.raises(ValueError, match='Swin-T has no such field'):
    command({'model_name': 'Swin-T', 'model.patches.size': (4, 4)})


def test_config_without_preset_flag_is_unchanged(capsys):
  config = command({'pp.crop': 56})
  assert config.model.to_dict() == default.get_config().model.to_dict()
  custom = command({'model_name': 'ViT-fmnst'})  # a rename, maybe a typo
  assert _model(custom) == _model(default.get_config())
  assert ("config.model_name='ViT-fmnst' is no preset, so the config's own "
          'model is used under that name (did you mean ' in (
              capsys.readouterr().err))


def test_checkpoint_record_applies_under_given_flags(tmp_path, capsys):
  """convert's record: the model settings timm's config.json differs in,
  and its mean and std (here CLIP's), over the preset's."""
  npz = str(tmp_path / 'w.npz')
  clip = ([0.48145466, 0.4578275, 0.40821073],
          [0.26862954, 0.26130258, 0.27577711])
  transform.save_transform(npz, {'mean': clip[0], 'std': clip[1], 'model': {
      'transformer': {'swiglu': True}}})
  config = command({'model_name': 'DINOv2-S_14', 'pretrained_path': npz})
  assert config.model.transformer.swiglu
  assert (config.pp.mean, config.pp.std) == tuple(map(tuple, clip))
  assert ('w.transform.json (beside the checkpoint) applies: model '
          'transformer.swiglu; inputs normalized with mean (0.48145466'
          in capsys.readouterr().err)
  given = command({'model_name': 'DINOv2-S_14', 'pretrained_path': npz,
                   'pp.mean': (0.5,) * 3, 'model.transformer.swiglu': False})
  assert given.pp.mean == (0.5,) * 3 and given.pp.std == tuple(clip[1])
  assert not given.model.transformer.swiglu


@pytest.mark.parametrize('name,crop,message', [
    ('DeiT3-S_16', 28, 'multiples of its patch size, 16; e.g. '
     '--config.pp.crop=16 or 32'),
    ('Swin-T', 112, 'multiples of patch x window x 2\\*\\*\\(stages - 1\\), '
     '224')])
def test_crop_that_makes_no_whole_patches(name, crop, message):
  config = command({'model_name': name, 'pp.crop': crop})
  with pytest.raises(ValueError, match=f'pp.crop={crop} does not fit {name}:'
                     f' sides must be {message}'):
    launch.check(config)


# Converted timm checkpoints through evaluate, few-shot and fine-tuning.

# (golden weights, preset, pp.crop, normalization): DINOv2, MAE, CLIP,
# SigLIP, EVA-02 at half the side of their tables (resized; EVA-02's RoPE
# rescaled), DeiT III's, CLIP's and EVA-02's 5-class heads on 10 classes,
# Swin's 10; DINOv3 has no table.
CONVERTED = [('timm_ssl/dinov2', 'DINOv2-testing', 28, IMAGENET),
             ('timm_ssl/deit3', 'DeiT3-testing', 32, IMAGENET),
             ('timm_ssl/mae', 'MAE-testing', 32, IMAGENET),
             ('timm_swin.safetensors', 'Swin-testing', 64, IMAGENET),
             ('timm_families/clip', 'CLIP-testing', 32, CLIP),
             ('timm_families/siglip', 'SigLIP-testing', 32, GOOGLE),
             ('timm_families/eva02', 'EVA02-testing', 28, CLIP),
             ('timm_families/dinov3', 'DINOv3-testing', 32, IMAGENET)]


def _plumbing(fmnist_dirs):
  """The test's tiny data and run; nothing about the model."""
  return {'tfds_manual_dir': fmnist_dirs[0], 'tfds_data_dir': fmnist_dirs[1],
          'batch': 8, 'batch_eval': 8, 'total_steps': 2, 'warmup_steps': 1,
          'progress_every': 1, 'evals.fewshot.shots': (1, 2),
          'evals.fewshot.seeds': 1}


def _normalized_test_images(config, count, normalization):
  """The first test images as the pipeline resizes them, normalized here
  with `normalization` from the [-1, 1] scale (GOOGLE: as they are)."""
  builder = pipeline.get_builder(config)
  pp = config.pp.copy_and_resolve_references()
  with pp.unlocked():
    pp.mean = pp.std = None
  images = [pipeline.preprocess_eval(
      tf.image.grayscale_to_rgb(example['image']), pp).numpy()
            for example in builder.as_dataset(split='test').take(count)]
  if normalization == GOOGLE:
    return np.stack(images)
  mean, std = (np.float32(x) for x in normalization)
  return ((np.stack(images) + 1) / 2 - mean) / std


def _recorded_model(name, npz):
  """The preset with what the converted file's record adds (SigLIP: timm's
  exact GELU)."""
  out = _preset(name)
  for key, value in (transform.load_transform(npz).get('model') or
                     {}).items():
    out[key] = dict(out[key], **value) if isinstance(value, dict) else value
  return out


@pytest.mark.parametrize('weights,name,crop,normalization', CONVERTED)
def test_converted_checkpoint_by_its_preset_name(weights, name, crop,
                                                 normalization, fmnist_dirs,
                                                 tmp_path):
  npz = str(tmp_path / 'w.npz')
  assert convert.convert(os.path.join(DATA, weights), npz) == name
  flags = dict(_plumbing(fmnist_dirs), pretrained_path=npz, model_name=name,
               **{'pp.crop': crop})
  config = command(flags)
  assert _model(config) == _recorded_model(name, npz)
  assert (config.pp.mean, config.pp.std) == normalization

  # A checkpoint without a head: 'evaluate' runs the few-shot evaluator
  # alone, the run 'fewshot' would repeat (that trainer on such a file:
  # test_command_line and the transformers folder's test below).
  headed = name == 'Swin-testing'
  results = {}
  for trainer in ('evaluate', 'fewshot', 'train'):
    if trainer == 'fewshot' and not headed:
      continue
    run = command(dict(flags, trainer=trainer))
    launch.train_and_evaluate(run, str(tmp_path / trainer))
    results[trainer] = json.loads(
        next((tmp_path / trainer).glob('*results.json')).read_text())
  assert 'fewshot_2shot' in results['fewshot' if headed else 'evaluate']
  assert ('accuracy' in results['evaluate']) == headed
  assert results['train']['step'] == 2 and 'accuracy' in results['train']
  # predict: the fine-tuned export, with the record's model settings.
  exported = str(tmp_path / 'train' / f'{name}.npz')
  model, params, _ = predict.load_classifier(
      name, exported, crop, transform.load_transform(npz))
  probs = predict.predict(model, params, _normalized_test_images(
      config, 2, normalization))
  assert probs.shape == (2, 10) and np.allclose(probs.sum(-1), 1, atol=1e-5)

  # The evaluators' features: the converted model's at this size.
  task = launch.make_task(config, str(tmp_path / 'f'), training=False)
  model, params = task.checkpoint(npz)
  evaluator = fewshot.Evaluator('fewshot', config.evals.fewshot,
                                config=config, model=model, mesh=task.mesh)
  feats, _ = evaluator.features(params, 'test')
  ref_model, ref_params, size = loading.load_model(
      dict(_recorded_model(name, npz), model_name=name), npz, size=crop)
  ref_params.pop('head', None)
  images = _normalized_test_images(config, 8, normalization)
  # Jitted: Swin's windows take seconds op by op.
  ref = jax.jit(lambda p, x: ref_model.clone(num_classes=0).apply(
      {'params': p}, x, train=False))(ref_params, images)
  assert size == crop and feats.shape[1] == ref.shape[1]
  np.testing.assert_allclose(feats[:8], ref, rtol=1e-4, atol=1e-4)


def test_shots_checked_before_any_feature(fmnist_dirs, tmp_path, monkeypatch):
  """25 shots of classes of 9-10 examples: refused from the labels alone."""
  npz = str(tmp_path / 'w.npz')
  convert.convert(os.path.join(DATA, 'timm_ssl/dinov2'), npz)

  def computed(*_):
    raise AssertionError('features were computed')

  monkeypatch.setattr(fewshot.Evaluator, 'features', computed)
  flags = dict(_plumbing(fmnist_dirs), trainer='fewshot', pretrained_path=npz,
               model_name='DINOv2-testing',
               **{'evals.fewshot.shots': (1, 25)})
  with pytest.raises(ValueError, match=r'fashion_mnist_local:train \(config.'
                     r'evals.fewshot.train\): class 0 has 10 examples, fewer '
                     'than 25 shots'):
    launch.train_and_evaluate(command(flags), str(tmp_path / 'wd'))


def test_command_line(fmnist_dirs, tmp_path):
  """`python -m vit_jax.main` with the preset's name and the file only."""
  npz = str(tmp_path / 'w.npz')
  convert.convert(os.path.join(DATA, 'timm_ssl/dinov2'), npz)
  flags = dict(_plumbing(fmnist_dirs), trainer='fewshot', pretrained_path=npz,
               model_name='DINOv2-testing', **{'pp.crop': 28})
  argv = [f'--config.{k}={v}' for k, v in flags.items()]
  done = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/default.py',
       f'--workdir={tmp_path / "wd"}', *argv], cwd=ROOT, capture_output=True,
      text=True, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'Note: config.model_name=DINOv2-testing: the preset won' in done.stderr
  assert ('resized pos_embedding from (1, 17, 32) to (1, 5, 32) '
          '(bicubic_antialias, grid 4x4 -> 2x2)') in done.stderr
  assert json.loads((tmp_path / 'wd' / 'results.json').read_text())[
      'fewshot_1shot'] >= 0


def test_transformers_folder_as_pretrained_path(tmp_path, monkeypatch, capsys):
  """A transformers folder is converted once; its record names the preset
  and its settings, which the run takes without --config.model_name."""
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path))
  folder = os.path.join(DATA, 'transformers', 'deit')
  config = command({'pretrained_path': folder})
  assert config.pretrained_path.endswith('.npz')
  assert config.pretrained_path.startswith(str(tmp_path))
  assert config.model_name == 'DeiT-testing-distilled'
  assert config.model.classifier == 'distilled'
  assert config.model.transformer.layer_norm_eps == 1e-12
  assert (config.pp.mean, config.pp.std) == IMAGENET
  assert 'is DeiT-testing-distilled, as its record says' in (
      capsys.readouterr().err)
  # Named on the command line, the preset wins over the record's.
  config = command({'pretrained_path': folder, 'model_name': 'DeiT-testing'})
  assert config.model_name == 'DeiT-testing'


def test_fewshot_and_fine_tuning_from_a_transformers_folder(
    fmnist_dirs, tmp_path, monkeypatch, capsys):
  """`pretrained_path` a transformers folder (DINOv2, its table resized to
  28 px as transformers resizes it), with no preset named: few-shot, then
  two steps of fine-tuning, each a run of its own."""
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))
  folder = os.path.join(DATA, 'transformers', 'dinov2')
  flags = dict(_plumbing(fmnist_dirs), pretrained_path=folder,
               **{'pp.crop': 28})
  results = {}
  for trainer in ('fewshot', 'train'):
    run = command(dict(flags, trainer=trainer))
    assert run.model_name == 'DINOv2-testing'
    launch.train_and_evaluate(run, str(tmp_path / trainer))
    results[trainer] = json.loads(
        next((tmp_path / trainer).glob('*results.json')).read_text())
  assert 'fewshot_2shot' in results['fewshot']
  assert results['train']['step'] == 2 and 'accuracy' in results['train']
  # The record's resize, torch's plain bicubic, for both runs.
  assert capsys.readouterr().err.count('(bicubic_torch, grid 5x5 -> 2x2') == 2
