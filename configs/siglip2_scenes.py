r"""SigLIP 2's recipe (Tschannen et al., 2025) on Fashion-MNIST scenes,
offline: two towers from scratch on the scenes' captions, and the terms
SigLIP 2 adds, each a field of `config.siglip2` with the paper's value
(docs/siglip2.md).

  python -m vit_jax.main --config=configs/siglip2_scenes.py:siglip \
      --workdir=/tmp/siglip2_scenes/siglip
  python -m vit_jax.main --config=configs/siglip2_scenes.py:siglip2 \
      --workdir=/tmp/siglip2_scenes/siglip2
  python -m vit_jax.main --config=configs/siglip2_scenes.py:siglip2_naflex \
      --workdir=/tmp/siglip2_scenes/siglip2_naflex

Arms: 'siglip' (the sigmoid loss alone), 'siglip2' (with LocCa's decoder
and, from 80% of training, SILC and TIPS), 'siglip2_naflex' (the sigmoid
loss and the decoder on a NaViT tower at patch budgets drawn per batch; no
SILC or TIPS). Each writes `zeroshot_accuracy` (Fashion-MNIST's test items
named by their classes) and the decoder's metrics (`evals.locca`, not for
'siglip', which has no decoder). The batch divides by 8 devices.
"""

import ml_collections

from vit_jax.configs import common

ARMS = ('siglip', 'siglip2', 'siglip2_naflex')
CLASS_NAMES = ('t-shirt', 'trouser', 'pullover', 'dress', 'coat', 'sandal',
               'shirt', 'sneaker', 'bag', 'ankle boot')


def get_config(arm='siglip2') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}: one of {ARMS}.')
  naflex = arm == 'siglip2_naflex'
  config = common.get_config()
  config.trainer = 'siglip2'
  config.dataset = 'fashion_mnist_scenes'
  config.pp.train = 'train'
  config.pp.test = 'test'
  config.pp.crop = 56  # the scenes' size: patch 7 -> an 8x8 grid
  config.pp.flip = False  # captions say left and right
  config.pp.label = 'segmentation_mask'  # the scenes have no class label
  config.model_name = f'SigLIP2-scenes-{arm}'
  image = dict(patches=dict(size=(7, 7)), hidden_size=128,
               transformer=dict(mlp_dim=512, num_heads=4, num_layers=4,
                                dropout_rate=0.0, attention_dropout_rate=0.0))
  if naflex:
    # SigLIP 2's NaFlex table: the learned 8x8 grid resized to each image's
    # grid (NaViT's 'learn_resized'; 'interp2d' is MoonViT's).
    image.update(posemb='learn_resized', max_grid=8)
  else:
    image.update(posemb='learn')
  config.model = ml_collections.ConfigDict({
      'image': image,
      'text': dict(width=64, num_layers=2, mlp_dim=256, num_heads=2,
                   vocab_size=256),
      'text_max_len': 32,
      'out_dim': 128,
      'naflex': naflex,
      # SigLIP's: exp(t) = 10, b = -10.
      'temperature_init': 10.0,
      'bias_init': -10.0,
      'model_name': config.get_ref('model_name'),
  })
  # Where the captions are, for the data helpers LiT shares.
  config.lit = ml_collections.ConfigDict({
      'vocab_path': '', 'text_key': 'caption', 'class_captions': None,
      'locked': False})
  decoder = arm != 'siglip'
  ssl = arm == 'siglip2'
  config.siglip2 = ml_collections.ConfigDict({
      # LocCa (Sec. 2.2): the decoder's loss added with weight 1 ("equal
      # weight"); the caption target predicted in parallel with
      # probability 0.5; all three tasks for every example.
      'decoder_weight': 1.0 if decoder else 0.0,
      'parallel_fraction': 0.5,
      'box_bins': 56,  # one per pixel of the 56 px scenes
      'decoder': dict(width=128, num_layers=2, num_heads=4, mlp_dim=512,
                      max_len=32),
      # SILC and TIPS (Sec. 2.3): on from 80% of training; weights 1 and
      # 0.25, both times a size factor (0.25 for B, 0.5 L, 1.0 So400m,
      # 0.5 g; B's here); one global view, 8 local ones; 50% of the
      # student's patches masked.
      'ssl_start': 0.8,
      'silc_weight': 1.0 if ssl else 0.0,
      'tips_weight': 0.25 if ssl else 0.0,
      'ssl_factor': 0.25,
      'mask_ratio': 0.5,
      # Not given by SigLIP 2 ("otherwise follow SILC"): DINO's.
      'momentum_teacher': 0.996,
      'teacher_temp': 0.04,
      'student_temp': 0.1,
      'center_momentum': 0.9,
      'head': dict(num_prototypes=1024, hidden_dim=512, bottleneck_dim=128,
                   num_layers=3),
      'crops': dict(global_scale=(0.4, 1.0), local_scale=(0.05, 0.4),
                    local_size=28, num_local=8, blur_sigma=(0.1, 2.0)),
      # NaFlex: patches per image, one drawn per batch (64: the scene at
      # 56 px as 8x8), each image's width stretched by a factor drawn
      # log-uniformly from `naflex_aspects`, so that a batch holds images
      # of other aspects and lengths, padded to the budget.
      'naflex_budgets': (16, 32, 48, 64) if naflex else (),
      'naflex_aspects': (0.5, 2.0),
  })
  # The sigmoid loss chunked over the devices; False: all-gathered.
  config.siglip_chunked = True
  config.evals = ml_collections.ConfigDict()
  config.evals.zeroshot = ml_collections.ConfigDict({
      'type': 'zeroshot', 'every': 0,
      'dataset': 'fashion_mnist_local', 'split': 'test', 'label': '',
      'class_names': CLASS_NAMES, 'templates': ('a {}',)})
  if decoder:
    config.evals.locca = ml_collections.ConfigDict({
        'type': 'locca', 'every': 0, 'dataset': '', 'split': '',
        'samples': 8})

  config.optimizer = 'adamw'
  config.weight_decay = 1e-4
  config.base_lr = 1e-3
  config.warmup_steps = 50
  config.total_steps = 500
  config.batch = 128
  config.batch_eval = 256
  config.shuffle_buffer = 10_000
  config.progress_every = 50
  config.checkpoint_every = 250
  return config.lock()
