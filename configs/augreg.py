r"""Pre-train a ViT with AugReg (Steiner et al. 2021, "How to train your ViT?").

The settings of big_vision's configs/vit_i21k.py and configs/vit_i1k.py:
Adam (first moment in bfloat16), learning rate 1e-3, 10k warmup steps,
cosine decay, batch 4096, clipping at 1, 300 epochs, 224 px inception crops
and flips, sigmoid cross-entropy, the head's bias initialized to -10 (i21k)
or -6.9 (i1k). big_vision's decoupled weight decay 1e-4 is optax.adamw's 0.1
(optax multiplies it by the learning rate).

LEVEL is one of the paper's seven augmentation settings (Sec. 3.3, Fig. 4),
RandAugment (layers, magnitude) in the input pipeline and Mixup on the
device: none, light1, light2, medium1, medium2, strong1, strong2; or
'default', big_vision's choice for the model size and dataset. The study's
regularization axis is the optional `reg`: dropout 0.1 and stochastic depth
0.1 together (the checkpoints' `do_0.1-sd_0.1`); without it, neither, as
big_vision's configs. The study's other weight decay is
--config.weight_decay=0.03.

  python -m vit_jax.main --config=configs/augreg.py:b16,medium2,i1k \
      --workdir=/tmp/augreg_b16_i1k
  python -m vit_jax.main --config=configs/augreg.py:l16,default,i21k,reg \
      --workdir=/tmp/augreg_l16_i21k

i21k reads big_vision's `imagenet21k` tfds dataset (not in public TFDS) and
its splits; a folder of images instead: --config.dataset=PATH (its train/
and test/ subfolders).
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import models
from vit_jax.models import registry

VARIANTS = {'ti16': 'ViT-Ti_16', 's32': 'ViT-S_32', 's16': 'ViT-S_16',
            'b32': 'ViT-B_32', 'b16': 'ViT-B_16', 'l16': 'ViT-L_16',
            'h14': 'ViT-H_14'}  # H/14: not in the study, no default level

# level: (RandAugment (layers, magnitude) or None, Mixup p)
LEVELS = {
    'none': (None, 0.0),
    'light1': ((2, 0), 0.0),  # magnitude 0 still changes images (equalize...)
    'light2': ((2, 10), 0.2),
    'medium1': ((2, 15), 0.2),
    'medium2': ((2, 15), 0.5),
    'strong1': ((2, 20), 0.5),
    'strong2': ((2, 20), 0.8),
}

# big_vision's level per model size, a good average of 30 and 300 epochs.
DEFAULT_LEVEL = {
    'i21k': {'ti16': 'none', 's32': 'none', 's16': 'light1', 'b32': 'light2',
             'b16': 'light2', 'l16': 'medium2'},
    'i1k': {'ti16': 'light1', 's32': 'medium1', 's16': 'medium2',
            'b32': 'medium2', 'b16': 'medium2', 'l16': 'medium2'},
}

EPOCHS, BATCH = 300, 4096
# tfds name, splits, training examples (the train split's size), the head's
# initial bias, the pooling: gap for i21k, the class token and a pre-logits
# layer for i1k (big_vision's `rep_size=True`).
DATASETS = {
    # ImageNet-21k (fall 2011, 14,197,122 images) less the 51,200 held out.
    'i21k': dict(dataset='imagenet21k', train='full[51200:]',
                 test='full[:25600]', examples=14_197_122 - 51_200,
                 head_bias_init=-10.0, classifier='gap', pre_logits=False),
    # 99% of ILSVRC-2012's 1,281,167 training images.
    'i1k': dict(dataset='imagenet2012', train='train[:99%]',
                test='validation', examples=1_268_355, head_bias_init=-6.9,
                classifier='token', pre_logits=True),
}


def _parse(arg: str):
  """'VARIANT,LEVEL[,DATASET[,reg]]' -> (variant, level, dataset, reg)."""
  parts = arg.split(',')
  if not 2 <= len(parts) <= 4 or (len(parts) == 4 and parts[3] != 'reg'):
    raise ValueError(f'Expected VARIANT,LEVEL[,DATASET[,reg]] or an AugReg '
                     f'model or filename (R_Ti_16, ...), got {arg!r}.')
  variant, level, dataset = (parts + ['i1k'])[:3]
  for name, value, known in (('variant', variant, VARIANTS),
                             ('level', level, [*LEVELS, 'default']),
                             ('dataset', dataset, DATASETS)):
    if value not in known:
      raise ValueError(f'Unknown {name} {value!r}; known: {sorted(known)}.')
  if level == 'default':
    if variant not in DEFAULT_LEVEL[dataset]:
      raise ValueError(f'AugReg has no default level for {variant}; name one '
                       f'of {sorted(LEVELS)}.')
    level = DEFAULT_LEVEL[dataset][variant]
  return variant, level, dataset, len(parts) == 4


def _model(config, variant, dataset, reg):
  """The preset of `variant`, pooled and regularized as AugReg trains it."""
  preset = VARIANTS[variant]
  data = DATASETS[dataset]
  model = registry.MODEL_CONFIGS[preset].to_dict()
  model['transformer'].update(dropout_rate=0.1 if reg else 0.0,
                              attention_dropout_rate=0.0,
                              stochastic_depth=0.1 if reg else 0.0)
  model.update(classifier=data['classifier'],
               representation_size=(model['hidden_size']
                                    if data['pre_logits'] else None),
               head_bias_init=data['head_bias_init'])
  return common.with_model(config, f'{preset}-augreg-{dataset}', model)


def get_config(arg: str = 'b16,default,i1k') -> ml_collections.ConfigDict:
  """Pre-training 'VARIANT,LEVEL[,DATASET[,reg]]'; or, as the original's
  `augreg.get_config`, fine-tuning an AugReg checkpoint: a model ('R_Ti_16')
  or a checkpoint's filename ('R_Ti_16-i21k-300ep-lr_0.001-...')."""
  if ',' not in arg and arg.split('-')[0] in models.AUGREG_CONFIGS:
    return finetune_config(arg)
  variant, level, dataset, reg = _parse(arg)
  data = DATASETS[dataset]
  config = _model(common.get_config(), variant, dataset, reg)
  config.dataset = data['dataset']
  config.pp.train, config.pp.test = data['train'], data['test']
  config.pp.crop = 224
  config.pp.crop_pct = 224 / 256  # eval: short side 256, central 224
  config.pp.randaug, config.mixup.p = LEVELS[level]
  config.loss = 'sigmoid_xent'
  config.optimizer = 'adamw'
  config.momentum_dtype = 'bfloat16'
  config.base_lr = 1e-3
  config.weight_decay = 0.1
  config.grad_norm_clip = 1.0
  config.warmup_steps = 10_000
  config.decay_type = 'cosine'
  config.batch = BATCH
  config.total_steps = EPOCHS * data['examples'] // BATCH
  config.shuffle_buffer = 250_000
  config.evals.test.every = 2_500
  return config.lock()


def finetune_config(model_or_filename: str) -> ml_collections.ConfigDict:
  """The original's AugReg fine-tuning: the checkpoint from
  gs://vit_models/augreg (`model_or_filename`), no dropout, SGD, 500
  steps at 384 px; evaluation resizes whole images, as the original's
  pipeline did (its config's `pp.resize=448` was never read). Set
  `dataset`."""
  model = models.AUGREG_CONFIGS[model_or_filename.split('-')[0]]
  config = common.with_model(common.get_config(), model.model_name)
  config.model.transformer.dropout_rate = 0.0  # no AugReg when fine-tuning
  config.pretrained_dir = 'gs://vit_models/augreg'
  config.model_or_filename = model_or_filename
  config.base_lr = 0.03
  config.total_steps = 500
  config.warmup_steps = 100
  config.pp.train, config.pp.test = 'train', 'test'
  config.pp.crop = 384
  config.momentum_dtype = 'bfloat16'  # the original's optim_dtype
  return config
