"""AugReg (Steiner et al. 2021) configs, as big_vision's vit_i21k.py and
vit_i1k.py: the paper's augmentation and regularization levels, data,
optimizer and model."""

import jax
import jax.numpy as jnp
import pytest

from vit_jax import models
from vit_jax.configs import augreg
from vit_jax.data import mixing
from vit_jax.run import checks
from vit_jax.tasks import classification


# level: (RandAugment layers, magnitude; Mixup p), from the paper's Sec. 3.3.
AUGREG_LEVELS = {
    'none': (None, 0.0), 'light1': ((2, 0), 0.0), 'light2': ((2, 10), 0.2),
    'medium1': ((2, 15), 0.2), 'medium2': ((2, 15), 0.5),
    'strong1': ((2, 20), 0.5), 'strong2': ((2, 20), 0.8)}
# big_vision's default level per model size.
AUGREG_DEFAULTS = {
    'i21k': dict(ti16='none', s32='none', s16='light1', b32='light2',
                 b16='light2', l16='medium2'),
    'i1k': dict(ti16='light1', s32='medium1', s16='medium2', b32='medium2',
                b16='medium2', l16='medium2')}


@pytest.mark.parametrize('level', sorted(AUGREG_LEVELS))
@pytest.mark.parametrize('dataset', ['i21k', 'i1k'])
def test_augreg_levels(level, dataset):
  config = augreg.get_config(f's16,{level},{dataset}')
  randaug, p = AUGREG_LEVELS[level]
  assert (config.pp.randaug, config.mixup.p) == (randaug, p)
  assert (config.mixup.cutmix_alpha, config.label_smoothing) == (0.0, 0.0)
  transformer = config.model.transformer
  assert (transformer.dropout_rate, transformer.stochastic_depth) == (0, 0)
  config_reg = augreg.get_config(f's16,{level},{dataset},reg')
  transformer = config_reg.model.transformer
  assert (transformer.dropout_rate, transformer.stochastic_depth) == (.1, .1)
  checks.validate(config, 8)
  mixing.check_config(config)


@pytest.mark.parametrize('dataset', ['i21k', 'i1k'])
@pytest.mark.parametrize('variant', ['ti16', 's32', 's16', 'b32', 'b16',
                                     'l16'])
def test_augreg_default_level(variant, dataset):
  default = augreg.get_config(f'{variant},default,{dataset}')
  level = AUGREG_DEFAULTS[dataset][variant]
  assert default == augreg.get_config(f'{variant},{level},{dataset}')


@pytest.mark.parametrize('dataset,name,split,classes,bias,pooled', [
    ('i21k', 'imagenet21k', 'full[51200:]', 21843, -10.0, 'gap'),
    ('i1k', 'imagenet2012', 'train[:99%]', 1000, -6.9, 'token')])
@pytest.mark.parametrize('variant', ['ti16', 's32', 's16', 'b32', 'b16',
                                     'l16'])
def test_augreg_optimizer_data_and_model(variant, dataset, name, split,
                                         classes, bias, pooled):
  config = augreg.get_config(f'{variant},medium1,{dataset}')
  assert (config.dataset, config.pp.train, config.pp.crop) == (name, split,
                                                               224)
  assert config.pp.crop_pct == 0.875  # resize_small(256), central_crop(224)
  assert (config.optimizer, config.momentum_dtype, config.base_lr,
          config.weight_decay * config.base_lr) == ('adamw', 'bfloat16',
                                                    1e-3, pytest.approx(1e-4))
  assert (config.batch, config.warmup_steps, config.decay_type,
          config.grad_norm_clip, config.loss) == (4096, 10_000, 'cosine',
                                                  1.0, 'sigmoid_xent')
  assert (config.model.classifier, config.model.head_bias_init) == (pooled,
                                                                    bias)
  model = classification.make_model(config, classes)
  params = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.zeros((1, 224, 224, 3)), train=False))['params']
  width = config.model.hidden_size
  assert params['head']['kernel'].shape == (width, classes)
  assert ('cls' in params) == (dataset == 'i1k')
  assert ('pre_logits' in params) == (dataset == 'i1k')
  with pytest.raises(AttributeError):
    config.mixup.alpha = 0.2  # locked


def test_augreg_b16_size_and_steps():
  config = augreg.get_config('b16,medium2,i1k')
  # timm's vit_base_patch16_224 (86,567,656) with big_vision's pre-logits.
  assert models.count_params(classification.make_model(config, 1000)) == (
      86_567_656 + 768 * 768 + 768)
  assert config.total_steps == 300 * round(1_281_167 * 0.99) // 4096
  assert config.model_name == config.model.model_name == 'ViT-B_16-augreg-i1k'


@pytest.mark.parametrize('arg,match', [
    ('b99,medium1', 'Unknown variant'), ('b16,heavy', 'Unknown level'),
    ('b16,medium1,jft', 'Unknown dataset'), ('b16', 'VARIANT,LEVEL'),
    ('b16,medium1,i1k,dropout', 'VARIANT,LEVEL')])
def test_augreg_unknown_names(arg, match):
  with pytest.raises(ValueError, match=match):
    augreg.get_config(arg)
