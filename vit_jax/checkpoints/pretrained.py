"""Which checkpoint a config starts from: `pretrained_path`, else
`{pretrained_dir}/{model_name}.npz`, or an AugReg checkpoint chosen from
its directory's `index.csv` (as the original chose)."""

from absl import logging
from etils import epath

from vit_jax.checkpoints import storage


def pretrained_path(config):
  """`pretrained_path`, else `{pretrained_dir}/{model_name}.npz` (an AugReg
  checkpoint's name with `model_or_filename`), else None."""
  if config.pretrained_path:
    return config.pretrained_path
  if config.pretrained_dir:
    name = config.model_name
    if config.get('model_or_filename'):
      name = augreg_filename(config.pretrained_dir, config.model_or_filename)
    return storage.join(config.pretrained_dir, f'{name}.npz')
  return None


def augreg_index(directory='gs://vit_models/augreg'):
  """The pandas DataFrame of `{directory}/index.csv`, which describes the
  AugReg checkpoints ("How to train your ViT?"): one row per pre-trained
  (`filename`) and fine-tuned (`adapt_filename`) pair, with their settings
  and accuracies (`final_val`, `adapt_final_test`, ...)."""
  import pandas as pd  # pylint: disable=g-import-not-at-top  (only here)
  with epath.Path(directory, 'index.csv').open() as f:
    return pd.read_csv(f)


def augreg_filename(directory, model_or_filename: str) -> str:
  """A filename as is; for a model ('R_Ti_16'), its i21k pre-training of
  the best final validation accuracy in `{directory}/index.csv`, as the
  original chose."""
  if '-' in model_or_filename:
    return model_or_filename
  df = augreg_index(directory=directory)
  mine = df[(df.filename.str.split('-').str[0] == model_or_filename) &
            (df.ds == 'i21k')]
  if mine.empty:
    raise ValueError(f'{directory}/index.csv lists no i21k checkpoint of '
                     f'{model_or_filename!r}.')
  best = mine.sort_values('final_val').iloc[-1]
  logging.info('AugReg checkpoint %s for %s (final_val %.3f)', best.filename,
               model_or_filename, best.final_val)
  return best.filename
