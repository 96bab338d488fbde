r"""The paper's position-embedding ablation (Appendix D.4, Table 8), small.

The default Fashion-MNIST job with one scheme changed, all on the same budget:
'learn' (1-D, the default), 'none', 'learn2d', 'relative', 'sincos2d', and
'gap' (1-D, mean pooling instead of the class token).

  python -m vit_jax.main --config=configs/ablation_posemb.py:none \
      --workdir=/tmp/ablation_none
  python scripts/posemb_ablation.py --workdir=/tmp/ablation  # all, as a table
"""

import ml_collections

from vit_jax.configs import default

VARIANTS = ('learn', 'none', 'learn2d', 'relative', 'sincos2d', 'gap')


def get_config(variant: str = 'learn') -> ml_collections.ConfigDict:
  if variant not in VARIANTS:
    raise ValueError(f'Unknown variant {variant!r}; known: {VARIANTS}.')
  config = default.get_config().unlock()
  if variant == 'gap':
    config.model.classifier = 'gap'
  else:
    config.model.posemb = variant
  config.total_steps = 1500
  config.evals.test.every = 0
  config.checkpoint_every = 0
  return config.lock()
