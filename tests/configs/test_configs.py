"""Experiment configs: they load, are locked, and hold the paper's settings."""

import pytest

from vit_jax import models
from vit_jax.configs import ablation_posemb
from vit_jax.configs import common
from vit_jax.configs import default
from vit_jax.configs import finetune_mnist5k
from vit_jax.configs import vit
from vit_jax import launch
from vit_jax.run import checks
from vit_jax.tasks import registry
from vit_jax.tasks import classification


@pytest.mark.parametrize('dataset,steps,train_split', [
    ('cifar10', 10_000, 'train[:98%]'), ('cifar100', 10_000, 'train[:98%]'),
    ('imagenet2012', 20_000, 'train[:99%]'), ('oxford_iiit_pet', 500,
                                              'train[:90%]'),
    ('oxford_flowers102', 500, 'train')])
def test_vit_fine_tuning_presets(dataset, steps, train_split):
  config = vit.get_config(f'b16,{dataset}')
  assert (config.total_steps, config.pp.train, config.pp.crop) == (
      steps, train_split, 384)
  assert (config.optimizer, config.batch, config.grad_norm_clip,
          config.decay_type) == ('sgd', 512, 1.0, 'cosine')
  assert config.model.to_dict() == models.MODEL_CONFIGS['ViT-B_16'].to_dict()
  with pytest.raises(AttributeError):
    config.learning_rate = 0.1  # locked: unknown keys fail at once
  checks.validate(config, 8)


def test_unknown_names():
  with pytest.raises(ValueError, match='Unknown model'):
    vit.get_config('b99,cifar10')
  with pytest.raises(ValueError, match='Unknown dataset preset'):
    vit.get_config('b16,svhn')
  with pytest.raises(ValueError, match='Unknown variant'):
    ablation_posemb.get_config('rope')


@pytest.mark.parametrize('get_config', [
    default.get_config, finetune_mnist5k.get_config,
    *[lambda v=v: ablation_posemb.get_config(v)
      for v in ablation_posemb.VARIANTS]])
def test_offline_configs_build_their_model(get_config):
  config = get_config()
  checks.validate(config, 1)
  model = classification.make_model(config, 10)
  image = (1, config.pp.crop, config.pp.crop, 3)
  assert models.count_params(model, image) > 100_000


def test_model_name_has_one_source():
  config = default.get_config()
  assert config.model.model_name == config.model_name == 'ViT-fmnist'
  config.model_name = 'ViT-other'  # as --config.model_name=ViT-other
  assert config.model.model_name == 'ViT-other'
  assert vit.get_config('s16,cifar10').model.model_name == 'ViT-S_16'


@pytest.mark.parametrize('arg,name,crop', [
    ('r50_b16,cifar10', 'R50+ViT-B_16', 384),
    ('r26_s32,oxford_iiit_pet', 'R26+ViT-S_32', 384),
    ('mixer_b16,cifar100', 'Mixer-B_16', 224)])
def test_hybrid_and_mixer_fine_tuning_configs(arg, name, crop):
  config = vit.get_config(arg)
  assert (config.model_name, config.pp.crop) == (name, crop)
  assert config.model.to_dict() == models.MODEL_CONFIGS[name].to_dict()
  checks.validate(config, 8)
  model = classification.make_model(config, 10)
  assert isinstance(model, models.MlpMixer if name.startswith('Mixer')
                    else models.VisionTransformer)
  shape = (1, config.pp.crop, config.pp.crop, 3)
  assert models.count_params(model, shape) > 1_000_000


def test_a_presets_normalization_reaches_the_pipelines():
  """DeiT presets set pp.mean/pp.std to ImageNet's; Google's leave the
  original's [-1, 1] (None)."""
  deit = common.with_model(common.get_config(), 'DeiT-S_16')
  assert tuple(deit.pp.mean) == (0.485, 0.456, 0.406)
  assert tuple(deit.pp.std) == (0.229, 0.224, 0.225)
  vit = common.with_model(common.get_config(), 'ViT-S_16')
  assert vit.pp.mean is None and vit.pp.std is None


def test_model_options_keep_their_types_for_the_command_line():
  # config_flags parses --config.model.transformer.layerscale_init=1e-5 by
  # the field's type; an untyped None could not be set from the command line.
  config = common.with_model(common.get_config(), 'ViT-S_16')
  assert config.model.transformer.get_type('layerscale_init') is float
  config.model.transformer.layerscale_init = 1e-5
  preset = models.MODEL_CONFIGS['ViT-S_16']
  assert preset.transformer.layerscale_init is None  # untouched
  dinov2 = common.with_model(common.get_config(), 'DINOv2-S_14-reg4')
  assert dinov2.model.num_registers == 4
  assert tuple(dinov2.pp.mean) == (0.485, 0.456, 0.406)


def test_every_trainer_is_registered():
  """The trainers come from the tasks' own declarations (and the
  evaluations): every task module registered itself, once."""
  assert launch.trainers() == (
      'train', 'classification', 'distill', 'lit', 'mae', 'dino', 'navit',
      'inference_time', 'segmentation', 'captioning', 'beit_tokenizer', 'beit',
      'video', 'videomae', 'siglip2', 'evaluate', 'fewshot', 'zeroshot')
  assert registry.planned() == ('train', 'classification', 'mae',
                                'captioning', 'video', 'videomae')