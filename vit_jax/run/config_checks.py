"""Checks of a run's config that need neither data nor a compiled step.

`preflight(config, num_devices_data)` runs before the data stack
(TensorFlow) is imported, so that a bad value, an unknown trainer or a
missing file is one `Error:` line within a second of the command.
"""

import os

from absl import logging

from vit_jax import checkpoint
from vit_jax import cli
from vit_jax import models
from vit_jax.models import swin as models_swin
from vit_jax.models import vit as models_vit
from vit_jax.run import optim
from vit_jax.run import sharding
from vit_jax.run import storage

# `config.trainer`: the tasks of `train.TASKS`, the evaluations of
# `train.EVALUATIONS`, and `inference_time`.
TRAINERS = ('train', 'classification', 'lit', 'distill', 'mae', 'dino',
            'navit', 'evaluate', 'fewshot', 'zeroshot', 'inference_time')
# The trainers whose step needs no data, only its shapes (`vit_jax.plan`).
PLANNED = ('train', 'classification', 'mae')


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


def augreg_filename(directory, model_or_filename: str) -> str:
  """A filename as is; for a model ('R_Ti_16'), its i21k pre-training of
  the best final validation accuracy in `{directory}/index.csv`, as the
  original chose."""
  if '-' in model_or_filename:
    return model_or_filename
  df = checkpoint.get_augreg_df(directory=directory)
  mine = df[(df.filename.str.split('-').str[0] == model_or_filename) &
            (df.ds == 'i21k')]
  if mine.empty:
    raise ValueError(f'{directory}/index.csv lists no i21k checkpoint of '
                     f'{model_or_filename!r}.')
  best = mine.sort_values('final_val').iloc[-1]
  logging.info('AugReg checkpoint %s for %s (final_val %.3f)', best.filename,
               model_or_filename, best.final_val)
  return best.filename


def validate(config, num_devices_data: int):
  """Fails fast, before any compilation, on settings every task shares."""
  choices = {'optimizer': ('sgd', 'adamw'),
             'decay_type': ('cosine', 'linear'),
             'sharding_strategy': sharding.STRATEGIES,
             'momentum_dtype': ('float32', 'bfloat16')}
  for key, allowed in choices.items():
    if config[key] not in allowed:
      raise ValueError(f'config.{key}={config[key]!r}; expected one of '
                       f'{allowed}.')
  if config.optimizer == 'sgd' and config.weight_decay:
    raise ValueError(f'config.weight_decay={config.weight_decay} needs '
                     "optimizer='adamw'; SGD has none (set it to 0).")
  if config.total_steps <= 0 or config.warmup_steps < 0:
    raise ValueError(f'Need total_steps ({config.total_steps}) > 0 and '
                     f'warmup_steps ({config.warmup_steps}) >= 0.')
  if config.warmup_steps >= config.total_steps:
    logging.warning('warmup_steps=%d is not shorter than total_steps=%d: '
                    'warming up for %d steps instead.', config.warmup_steps,
                    config.total_steps, optim.warmup_steps(config))
  micro = config.batch // config.accum_steps
  if config.batch % config.accum_steps or micro % num_devices_data:
    raise ValueError(
        f'batch={config.batch} must split into accum_steps='
        f'{config.accum_steps} micro-batches divisible by the '
        f'{num_devices_data} devices on the mesh `data` axis.')
  check_image_size(config)
  check_patch_sizes(config)
  if config.batch_eval % num_devices_data:
    raise ValueError(f'batch_eval={config.batch_eval} is not divisible by the '
                     f'{num_devices_data} devices on the `data` axis.')


def check_image_size(config) -> None:
  """`pp.crop` makes whole patches (a ViT) or windows (a Swin)."""
  cls = models.model_class(config.model_name)
  model, side = config.model, config.pp.crop
  if 'navit' in config or model is None:
    return  # NaViT's images keep their own sizes
  if cls is models.VisionTransformer and model.get('resnet') is None:
    multiple, what = models_vit.patch_size(model.patches), 'its patch size'
  elif cls is models.SwinTransformer:
    multiple = (models_swin.image_multiple(
        model.patch_size, model.window_size, len(model.depths)),) * 2
    what = 'patch x window x 2**(stages - 1)'
  else:
    return
  if side % multiple[0] or side % multiple[1]:
    fits = [k * multiple[0] for k in range(max(side // multiple[0], 1),
                                           side // multiple[0] + 2)]
    raise ValueError(
        f'pp.crop={side} does not fit {config.model_name}: sides must be '
        f'multiples of {what}, {multiple[0]}; e.g. --config.pp.crop='
        f'{" or ".join(str(f) for f in fits)}.')


def check_patch_sizes(config) -> None:
  """FlexiViT's patch sizes, trained (`model.patch_sizes`) or evaluated
  (`evals.NAME.patch_size`): a plain ViT's, each a divisor of `pp.crop`."""
  model = config.model or {}
  sizes = [('model.patch_sizes', p) for p in model.get('patch_sizes') or ()]
  sizes += [(f'evals.{name}.patch_size', e.patch_size)
            for name, e in config.evals.items() if e.get('patch_size')]
  if not sizes:
    return
  if model.get('patch_sizes') and config.trainer in ('lit', 'distill', 'mae',
                                                     'dino', 'navit'):
    raise ValueError("config.model.patch_sizes trains a FlexiViT with "
                     f"trainer='train', not {config.trainer!r}.")
  if (models.model_class(config.model_name) is not models.VisionTransformer
      or model.get('resnet') is not None or model.get('posemb') == 'learn2d'):
    raise ValueError(f'config.{sizes[0][0]}: only a ViT without a ResNet '
                     "and with posemb other than 'learn2d' runs at another "
                     'patch size.')
  side = config.pp.crop
  for key, size in sizes:
    if not isinstance(size, int) or size < 1 or side % size:
      fits = [p for p in range(1, side + 1) if side % p == 0]
      raise ValueError(f'config.{key}: patch size {size!r} does not divide '
                       f'pp.crop={side}; divisors: {fits}.')


def _input_files(config):
  """(config key, path) of the files that the run reads, where set."""
  files = [('pretrained_path' if config.pretrained_path else
            'pretrained_dir', pretrained_path(config))]
  if config.trainer == 'distill':
    files.append(('distill.teacher_path', config.distill.teacher_path))
  if 'lit' in config:
    files.append(('lit.vocab_path', config.lit.get('vocab_path')))
  return [(key, path) for key, path in files if path]


def check_files(config):
  """The local files that the config names exist (remote ones are fetched,
  and checked, by the task)."""
  for key, path in _input_files(config):
    if not storage.is_remote(path) and not os.path.exists(path):
      raise FileNotFoundError(f'config.{key}: {path}: no such file.')


def preflight(config):
  """Every check that needs only the config and the devices."""
  if config.trainer not in TRAINERS:
    raise ValueError(cli.closest(config.trainer, TRAINERS, 'config.trainer'))
  if config.trainer != 'inference_time':
    validate(config, sharding.make_mesh(config.mesh).shape['data'])
  check_files(config)
