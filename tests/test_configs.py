"""Experiment configs: they load, are locked, and hold the paper's settings."""

import pytest

from configs import ablation_posemb
from configs import default
from configs import finetune_mnist5k
from configs import vit
from vit_jax import models
from vit_jax import loop
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
  loop.validate_config(config, 8)


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
  loop.validate_config(config, 1)
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
  loop.validate_config(config, 8)
  model = classification.make_model(config, 10)
  assert isinstance(model, models.MlpMixer if name.startswith('Mixer')
                    else models.VisionTransformer)
  shape = (1, config.pp.crop, config.pp.crop, 3)
  assert models.count_params(model, shape) > 1_000_000
