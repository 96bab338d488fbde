"""The original release's config of `trainer='inference_time'`.

  python -m vit_jax.main --config=configs/inference_time.py --workdir=/tmp/it
"""

from vit_jax.configs import common


def get_config():
  config = common.with_model(common.get_config(), 'ViT-B_32')
  config.trainer = 'inference_time'
  config.pp.crop = 224
  config.batch = 64
  return config.lock()
