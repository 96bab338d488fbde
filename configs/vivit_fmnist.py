r"""A small ViViT (Arnab et al., 2021) on moving Fashion-MNIST clips
(`moving_fashion_mnist`: one item moving on a dark frame, its class per
clip), offline.

  python -m vit_jax.main --config=configs/vivit_fmnist.py:scratch \
      --workdir=/tmp/vivit_scratch
  python -m vit_jax.main --config=configs/vivit_fmnist.py:from_image \
      --workdir=/tmp/vivit_image
  python -m vit_jax.main --config=configs/vivit_fmnist.py:factorised \
      --workdir=/tmp/vivit_fe
  python -m vit_jax.main --config=configs/vivit_fmnist.py:timesformer \
      --workdir=/tmp/timesformer
  python -m vit_jax.plan --config=configs/vivit_fmnist.py:factorised \
      --topology=v5e:2x2

Arms:
  scratch: the unfactorised encoder (attention over all tubelets) from
    random initialization.
  from_image: the same model from the default job's exported image ViT
    (the README's first command writes it; `--config.pretrained_path`
    takes another): its patch kernel inflated to the tubelet
    (`--config.video.kernel_init=central_frame` or `average`), its
    position table resized to the frame's grid and repeated over time.
  factorised: the factorised encoder (a spatial ViT per tubelet slot, then
    a temporal transformer over their class tokens), its spatial ViT the
    default job's whole.
  timesformer: TimeSformer (Bertasius et al., 2021) with divided
    space-time attention, from the default job's image ViT as the paper's
    code starts from one: the patch kernel, blocks and class token as they
    are, each block's temporal attention a copy of its spatial one behind
    a zero `temporal_dense`, the temporal table zero (a still clip gives
    the image model's features). Per-frame patches: no tubelet.

The model has the default job's widths (7 px patches, 128 wide, 4 blocks)
and 2-frame tubelets. docs/video.md compares the arms over 3 seeds.
"""

import ml_collections

from vit_jax.configs import common
from vit_jax.configs import default

DEFAULT_ENCODER = '/tmp/vit_default/ViT-fmnist.npz'
ARMS = ('scratch', 'from_image', 'factorised', 'timesformer')


def get_config(arm: str = 'from_image') -> ml_collections.ConfigDict:
  if arm not in ARMS:
    raise ValueError(f'Unknown arm {arm!r}; expected one of {ARMS}.')
  config = default.get_config().unlock()
  config.trainer = 'video'
  config.dataset = 'moving_fashion_mnist'
  config.pp.crop = 28  # 56 px frames resized: the image ViT's 4x4 grid
  config.pp.area_min = 1.0
  config.pp.flip = True
  config.video = ml_collections.ConfigDict(dict(
      frames=8,  # of 16: 4 tubelet slots of 2 frames
      stride=1,
      test_views=2,  # the clip's two halves, logits averaged (ViViT's views)
      kernel_init='central_frame'))
  image = config.model.to_dict()  # the default job's ViT: its widths
  model = {k: image[k] for k in ('patches', 'hidden_size', 'transformer',
                                 'classifier', 'representation_size',
                                 'dtype')}
  model.update(tubelet=2, encoder='unfactorised', temporal_posemb='joint')
  if arm == 'factorised':
    model.update(encoder='factorised', temporal_posemb='separate',
                 temporal_transformer=dict(image['transformer'],
                                           num_layers=2))
  name = 'ViViT-fmnist'
  if arm == 'timesformer':
    del model['tubelet'], model['encoder'], model['temporal_posemb']
    model['attention_type'] = 'divided_space_time'
    name = 'TimeSformer-fmnist'
  config = common.with_model(config, name, model)
  config.pretrained_path = '' if arm == 'scratch' else DEFAULT_ENCODER
  config.evals = ml_collections.ConfigDict()
  config.evals.test = dict(type='video_classification', every=500)
  config.base_lr = 1e-3
  config.warmup_steps = 50
  config.total_steps = 600
  config.batch = 32
  config.batch_eval = 64
  config.shuffle_buffer = 4096
  config.progress_every = 50
  config.checkpoint_every = 200
  return config.lock()
