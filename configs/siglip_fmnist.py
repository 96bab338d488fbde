r"""SigLIP or CLIP on Fashion-MNIST, offline: both towers trained from scratch
(the default job's ViT shape and LiT's tiny text tower) on the captions that
configs/lit_fmnist.py makes from class names and descriptions, then
zero-shot classification of the test set.

  python -m vit_jax.main --config=configs/siglip_fmnist.py:siglip \
      --workdir=/tmp/siglip_fmnist
  python -m vit_jax.main --config=configs/siglip_fmnist.py:clip \
      --workdir=/tmp/clip_fmnist

'siglip': the sigmoid loss with its learned temperature and bias (init 10
and -10), chunked over the devices (`--config.siglip_chunked=False`: the
all-gathered form). 'clip': the softmax loss, temperature init 10. The
batch divides by 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8).
"""

from vit_jax.configs import lit_fmnist


def get_config(arg='siglip'):
  losses = {'siglip': 'sigmoid', 'clip': 'softmax'}
  if arg not in losses:
    raise ValueError(f'Unknown variant {arg!r}: one of {tuple(losses)}.')
  config = lit_fmnist.get_config(losses[arg])
  # 'LiT-' names the two-tower model (models.LitModel) of any such run.
  config.model_name = f'LiT-fmnist-{arg}-scratch'
  config.lit.locked = False  # both towers learn
  config.model.temperature_init = 10.0
  config.base_lr = 1e-3
  config.total_steps = 500
  return config.lock()
