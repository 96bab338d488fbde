"""Checks of a run's config that need neither data nor a compiled step.

They run before the data stack (TensorFlow) loads, so that a bad value or
a missing file is one `Error:` line within a second of the command: the
settings every training run shares (`validate`, which a task's
`check_config` calls) and the files a task reads (`check_files`).
"""

import os

from absl import logging

from vit_jax.checkpoints import storage
from vit_jax.models import registry
from vit_jax.models import vit as models_vit
from vit_jax.platform import sharding
from vit_jax.run import optim

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
  check_layer_decay(config)
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


def check_layer_decay(config) -> None:
  """`layer_decay`: a factor in (0, 1], for a model of ViT blocks."""
  decay = config.get('layer_decay')
  if decay is None:
    return
  if not 0 < decay <= 1:
    raise ValueError(f'config.layer_decay={decay} must be in (0, 1]; None '
                     'turns it off.')
  if config.model is not None:
    cls = registry.model_class(config.model_name, config.model)
    if not issubclass(cls, models_vit.VisionTransformer):
      raise ValueError(f'config.layer_decay decays the blocks of a ViT; '
                       f'{config.model_name} is a {cls.__name__}.')


def check_image_size(config) -> None:
  """`pp.crop` makes whole patches (a ViT) or windows (a Swin): as the
  model's family says (`Family.image_multiple`)."""
  model, side = config.model, config.pp.crop
  image_multiple = registry.family(config.model_name, model).image_multiple
  if 'navit' in config or model is None or image_multiple is None:
    return  # NaViT's images keep their own sizes
  found = image_multiple(model)
  if found is None:
    return
  multiple, what = found
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
  if not registry.family(config.model_name, model).patch_resizable(model):
    raise ValueError(f'config.{sizes[0][0]}: only a ViT without a ResNet '
                     "and with posemb other than 'learn2d' runs at another "
                     'patch size.')
  side = config.pp.crop
  for key, size in sizes:
    if not isinstance(size, int) or size < 1 or side % size:
      fits = [p for p in range(1, side + 1) if side % p == 0]
      raise ValueError(f'config.{key}: patch size {size!r} does not divide '
                       f'pp.crop={side}; divisors: {fits}.')


def check_files(files):
  """The local files of `files`, (config key, path) pairs, exist where set
  (remote ones are fetched, and checked, by the task)."""
  for key, path in files:
    if path and not storage.is_remote(path) and not os.path.exists(path):
      raise FileNotFoundError(f'config.{key}: {path}: no such file.')
