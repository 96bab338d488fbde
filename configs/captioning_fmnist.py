r"""Captioning on Fashion-MNIST, offline: CapPa and a LLaVA-style connector.

  python -m vit_jax.main --config=configs/captioning_fmnist.py:cappa \
      --workdir=/tmp/cappa
  python -m vit_jax.caption --checkpoint=/tmp/cappa image.png

Arms:
  cappa: a ViT and a CapPa decoder trained together from scratch, 75% of
    the examples by parallel prediction (CapPa's `masked_pred_prob`).
  cappa_ar: the same, teacher forcing only (the paper's "Cap").
  llava: the default job's exported ViT frozen (the README's first command
    writes it; `--config.pretrained_path` takes another), its penultimate
    block's patch tokens through a 2-layer MLP projector into a small
    prefix LM; projector and LM train (LLaVA's second stage; the first is
    `--config.captioning.trained=projector` with a `decoder_init`).
  internvl: InternVL's connector on the same frozen ViT: its last block's
    tokens, 2 x 2 neighbours into one (pixel shuffle), InternVL's MLP; the
    image as dynamic tiles of the encoder's 28 px (`pp.tiles`: a 56 px
    scene is 2 x 2 tiles and a thumbnail, 5 x 4 tokens; an item one tile).
  prismatic: Prismatic's (OpenVLA's) fusion: the default job's ViT and a
    DINO-trained one (configs/dino_fmnist.py's export, DINO_ENCODER), both
    frozen, each at its own input size, their penultimate blocks' tokens
    concatenated per patch on one grid, through Prismatic's 3-layer MLP.
Add ',scenes' (e.g. `:cappa,scenes`) to caption the 56 px scenes of
`fashion_mnist_scenes` with where their items are ("a sandal to the left
of a bag"), unflipped, instead of single items.

Captions of an item: its names in varied templates ("a photo of a
sneaker"). The run ends with the scoring classifier's accuracy (each
class's prompts scored by log-likelihood), and exact match, token F1 and
CIDEr-D of greedy captions of the test split; docs/captioning.md has the
table.
"""

import ml_collections

from vit_jax.configs import default

# Fashion-MNIST's classes in its label order: the names captions use.
NAMES = (('t-shirt', 'top', 'tee'), ('trouser', 'pair of trousers', 'pants'),
         ('pullover', 'sweater', 'jumper'), ('dress',), ('coat', 'jacket'),
         ('sandal', 'pair of sandals'), ('shirt', 'blouse'),
         ('sneaker', 'trainer'), ('bag', 'handbag'), ('ankle boot', 'boot'))
TEMPLATES = ('a {}', 'a photo of a {}', 'a picture of a {}', 'an image of a {}',
             'this is a {}')
ARMS = ('cappa', 'cappa_ar', 'llava', 'internvl', 'prismatic')
DEFAULT_ENCODER = '/tmp/vit_default/ViT-fmnist.npz'
# configs/dino_fmnist.py's first command writes it.
DINO_ENCODER = '/tmp/dino/ViT-fmnist.npz'
CONNECTORS = {'cappa': 'cross_attention', 'cappa_ar': 'cross_attention',
              'llava': 'prefix', 'internvl': 'pixel_shuffle_mlp',
              'prismatic': 'fused_mlp'}


def class_captions():
  """Each class's captions: every template on every name ('an' before a
  vowel)."""
  def fill(template, name):
    return template.format(name).replace(' a a', ' an a').replace(
        'a a', 'an a', 1)
  return tuple(tuple(fill(t, n) for n in names for t in TEMPLATES)
               for names in NAMES)


def get_config(arg: str = 'cappa') -> ml_collections.ConfigDict:
  arm, _, data = arg.partition(',')
  if arm not in ARMS or data not in ('', 'scenes'):
    raise ValueError(f'Unknown argument {arg!r}; expected one of {ARMS}, '
                     "maybe with ',scenes'.")
  config = default.get_config().unlock()
  config.trainer = 'captioning'
  config.model_name = f'ViT-fmnist-{arm}'
  config.pp.flip = False  # a caption may say left and right
  frozen = arm in ('llava', 'internvl', 'prismatic')
  config.captioning = ml_collections.ConfigDict(dict(
      connector=CONNECTORS[arm],
      # The encoder's block the decoder reads, through its final norm or not
      # (LLaVA and Prismatic: the penultimate; InternVL: the last).
      block=-2 if arm in ('llava', 'prismatic') else -1,
      norm=not frozen,
      trained='decoder' if frozen else 'all',
      masked_pred_prob=0.75 if arm == 'cappa' else 0.,
      decoder=dict(width=128, num_layers=2, num_heads=4, mlp_dim=256,
                   remat=False, dtype='float32'),
      # '': a SentencePiece vocabulary fitted to the captions (workdir).
      tokenizer='sentencepiece',
      vocab_path='',
      vocab_size=256,
      # Tokens of the longest caption and its </s>: 18 here (the fitted
      # vocabulary has ~60 pieces, as few words as the captions use).
      max_len=24,
      text_key='',  # a dataset's caption feature, instead of class captions
      class_captions=class_captions(),
      decoder_init='',  # a captioner's .decoder.npz to start the decoder
      # Prismatic: frozen encoders fused per patch, each dict(path, size,
      # mean=None, std=None: its input normalization, None: [-1, 1]), on a
      # fusion_grid x fusion_grid grid (jax.image.resize's fusion_resize).
      encoders=(),
      fusion_grid=4,
      fusion_resize='bilinear',
  ))
  if arm in ('llava', 'internvl'):
    config.pretrained_path = DEFAULT_ENCODER
  if arm == 'internvl':  # tiles of the encoder's size: a scene has 2 x 2
    config.pp.tiles = dict(min=1, max=4 if data == 'scenes' else 1)
  if arm == 'prismatic':  # a scene: the supervised ViT at 56 px (8 x 8)
    scenes = data == 'scenes'
    config.captioning.encoders = (
        dict(path=DEFAULT_ENCODER, size=56 if scenes else 28),
        dict(path=DINO_ENCODER, size=28))
    config.captioning.fusion_grid = 8 if scenes else 4
  config.evals = ml_collections.ConfigDict()
  config.evals.captions = dict(type='captioning', every=0, samples=8)
  if data == 'scenes':
    config.dataset = 'fashion_mnist_scenes'
    config.pp.label = 'segmentation_mask'
    config.pp.crop = 28 if arm == 'internvl' else 56  # InternVL: its tiles
    config.captioning.text_key = 'caption'
    config.captioning.max_len = 64  # 4 items: 49 tokens
    config.shuffle_buffer = 4096
  else:
    config.evals.scoring = dict(
        type='scoring', every=0,
        class_names=tuple(c[0] for c in class_captions()),  # 'a t-shirt'
        templates=('{}', 'a photo of {}'))
  config.optimizer = 'adamw'
  config.weight_decay = 1e-4
  config.base_lr = 1e-3
  config.warmup_steps = 100
  config.total_steps = 1000
  config.batch = 128
  config.batch_eval = 500
  config.progress_every = 100
  config.checkpoint_every = 500
  return config.lock()
