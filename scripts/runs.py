"""What the scripts that run configs over seeds share: a run of
`vit_jax.main` (skipped once finished), the default job's encoder at
initialization, and a mean with its standard error."""

import json
import os
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main_run(config, workdir, *flags):
  """`python -m vit_jax.main --config=configs/{config}` once; its
  results.json."""
  results = os.path.join(workdir, 'results.json')
  if not os.path.exists(results):
    subprocess.run([sys.executable, '-m', 'vit_jax.main',
                    f'--config={ROOT}/configs/{config}',
                    f'--workdir={workdir}', *flags], check=True, cwd=ROOT)
  with open(results) as f:
    return json.load(f)


def seeded(seed, steps):
  """The flags of one seed's run of `steps` steps, without periodic
  checkpoints."""
  return [f'--config.seed={seed}', f'--config.total_steps={steps}',
          f'--config.progress_every={max(steps // 5, 1)}',
          '--config.checkpoint_every=0']


def initial_encoder(seed, path):
  """The default job's ViT without a head at initialization (the loop's
  init key for `seed`), written as .npz at `path` unless there."""
  # pylint: disable=g-import-not-at-top
  import jax
  import jax.numpy as jnp
  sys.path.insert(0, ROOT)
  from vit_jax.checkpoints import files
  from vit_jax import models
  from vit_jax.configs import default
  # pylint: enable=g-import-not-at-top
  if not os.path.exists(path):
    config = default.get_config()
    model = models.VisionTransformer(num_classes=None, **config.model)
    key = jax.random.split(jax.random.key(seed))[0]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    shape = (1, config.pp.crop, config.pp.crop, 3)
    files.save(model.init(key, jnp.zeros(shape), train=False)['params'],
                    path)
  return path


def mean_se(values):
  """'mean +- standard error' of the values, 4 decimals."""
  values = np.asarray(values)
  se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.
  return f'{values.mean():.4f} +- {se:.4f}'
