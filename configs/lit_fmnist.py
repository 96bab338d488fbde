r"""LiT on Fashion-MNIST, offline: the default job's ViT locked, a tiny text
tower trained on captions made from class names and descriptions, then
zero-shot classification of the test set from the class names alone.

  python -m vit_jax.main --config=configs/default.py --workdir=/tmp/vit_default
  python -m vit_jax.main --config=configs/lit_fmnist.py:softmax \
      --config.lit.image_init=/tmp/vit_default/ViT-fmnist.npz \
      --workdir=/tmp/lit_fmnist
  python -m vit_jax.main --config=configs/lit_fmnist.py:softmax \
      --config.trainer=zeroshot --workdir=/tmp/lit_fmnist

The argument picks the loss: 'softmax' (LiT's InfoNCE) or 'sigmoid'
(SigLIP's, with its learned bias). docs/lit.md records the numbers of
both.
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

# Fashion-MNIST's classes in its label order: names, then descriptions.
_CLASSES = (
    (('t-shirt', 'top', 'tee'),
     ('a short sleeved shirt without a collar', 'a casual top')),
    (('trouser', 'pair of trousers', 'pants'),
     ('long pants with two legs', 'jeans')),
    (('pullover', 'sweater', 'jumper'),
     ('a warm knitted top with long sleeves',)),
    (('dress', 'gown'), ('a one piece garment for women',)),
    (('coat', 'jacket'), ('a warm outer garment with buttons',)),
    (('sandal', 'pair of sandals'), ('an open summer shoe with straps',)),
    (('shirt', 'blouse'), ('a buttoned top with a collar',)),
    (('sneaker', 'trainer', 'pair of sneakers'),
     ('a sports shoe with a rubber sole',)),
    (('bag', 'handbag', 'purse'), ('a container with handles',)),
    (('ankle boot', 'boot'), ('a shoe that covers the ankle',)),
)
_NAME_TEMPLATES = ('{}', 'a {}', 'a photo of a {}', 'an image of a {}',
                   'this is a {}', 'a picture of the {}')
_DESCRIPTION_TEMPLATES = ('{}', 'a photo of {}')


def class_captions():
  """Training captions of each class: every template on every name and
  description."""
  return tuple(
      tuple(t.format(n) for n in names for t in _NAME_TEMPLATES) +
      tuple(t.format(d) for d in descriptions for t in _DESCRIPTION_TEMPLATES)
      for names, descriptions in _CLASSES)


def get_config(loss='softmax') -> ml_collections.ConfigDict:
  if loss not in ('softmax', 'sigmoid'):
    raise ValueError(f"Unknown loss {loss!r}: 'softmax' or 'sigmoid'.")
  image_config = default.get_config()
  config = common.get_config()
  config.trainer = 'lit'
  config.dataset = image_config.dataset
  config.pp = image_config.pp.to_dict()

  config.model_name = f'LiT-fmnist-{loss}'
  config.model = ml_collections.ConfigDict({
      'image': image_config.model.to_dict(),
      'text_model': 'text_transformer',
      'text': dict(width=64, num_layers=2, mlp_dim=128, num_heads=2,
                   vocab_size=256),
      # The locked ViT's 128-d class token is the image embedding.
      'out_dim': (None, 128),
      'pp': dict(tokenizer_name='sentencepiece', max_len=16, size=28),
      'temperature_init': 10.0,
      'bias_init': -10.0 if loss == 'sigmoid' else None,
      'model_name': config.get_ref('model_name'),
  })
  config.lit = ml_collections.ConfigDict({
      'loss': loss,
      # The locked image tower: an image model's (or a LiT model's) .npz.
      'image_init': ml_collections.config_dict.placeholder(str),
      # '' fits a SentencePiece vocabulary to the captions (workdir).
      'vocab_path': '',
      'text_key': '',  # a tfds string feature, instead of class captions
      'class_captions': class_captions(),
      # False: both towers train (configs/siglip_fmnist.py).
      'locked': True,
  })
  # The sigmoid loss chunked over the devices; False: all-gathered.
  config.siglip_chunked = True
  # Zero-shot classification of the test set from the class names alone.
  config.evals = ml_collections.ConfigDict()
  config.evals.zeroshot = ml_collections.ConfigDict({
      'type': 'zeroshot',
      'every': 250,
      # The test data: '' for the training dataset and its pp.test split.
      'dataset': '',
      'split': '',
      'class_names': ('t-shirt or top', 'trouser', 'pullover', 'dress',
                      'coat', 'sandal', 'shirt', 'sneaker', 'bag',
                      'ankle boot'),
      'templates': ('a photo of a {}.', 'a {}.', 'a picture of a {}.'),
  })

  config.optimizer = 'adamw'
  config.weight_decay = 1e-4
  config.base_lr = 1e-3
  config.warmup_steps = 50
  config.total_steps = 500
  config.batch = 128
  config.batch_eval = 1000
  config.shuffle_buffer = 60_000
  config.progress_every = 50
  config.checkpoint_every = 250
  return config.lock()
