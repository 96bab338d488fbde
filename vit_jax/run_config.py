"""A run's model and input normalization, settled from the command line.

`--config.model_name=PRESET` on any config brings that preset's whole model
config and the normalization its weights expect, in place of the config's
own model; so does a record that names the preset, when the command line
names none. A timm or transformers folder, file or hub name as
`pretrained_path` is converted first (once, cached). The record beside the
checkpoint (`NAME.transform.json`, which `convert` writes: the model
settings that differ from the preset, mean and std; a two-tower model's
tokenizer, as `lit.vocab_path`) applies over that. Values given on the command line
(`--config.model.*`, `--config.pp.mean`, `--config.pp.std`) win over both.
Each change is said in one note line on stderr. predict and analysis take
the same preset and record through `transform.preset_settings`.
"""

import copy
import sys
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from absl import flags
import jax
from ml_collections import config_flags

from vit_jax import cli
from vit_jax.checkpoints import pretrained
from vit_jax.checkpoints import storage
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.models import registry

Normalization = Tuple[Optional[tuple], Optional[tuple]]


def _note(line: str) -> None:
  if jax.process_index() == 0:
    print(f'Note: {line}.', file=sys.stderr, flush=True)


def _normalization(config) -> Normalization:
  return config.pp.get('mean'), config.pp.get('std')


def _describe(normalization: Normalization) -> str:
  """"ImageNet's mean and std", ... for a note."""
  mean, std = normalization
  if mean is None and std is None:
    return "Google's [-1, 1] (mean and std 0.5)"
  if (mean, std) == registry.NORMALIZATIONS['imagenet']:
    return "ImageNet's mean and std"
  return f'mean {mean} and std {std}'


def _differing(a: Mapping[str, Any], b: Mapping[str, Any], prefix=''):
  """Keys (dotted) whose values differ between nested dicts `a` and `b`."""
  out = []
  for key in sorted(set(a) | set(b)):
    x, y = a.get(key), b.get(key)
    if isinstance(x, Mapping) and isinstance(y, Mapping):
      out += _differing(x, y, f'{prefix}{key}.')
    elif x != y:
      out.append(f'{prefix}{key}')
  return out


def checkpoint_record(config) -> Optional[Dict[str, Any]]:
  """The record beside the config's pretrained file, if there is one."""
  path = pretrained.pretrained_path(config)
  if not path or (storage.is_remote(path) and not path.startswith('gs://')):
    return None
  return transform.load_transform(path)


def _convert_pretrained(config) -> None:
  """A timm or transformers folder, weights file or hub name as
  `pretrained_path`: converted once (`converter.as_npz`), the run reads the
  .npz and its record; a training workdir: its export, if it has one."""
  path = config.get('pretrained_path')
  if not path or (storage.is_remote(path) and not path.startswith('gs://')):
    return
  found, _ = converter.checkpoint_and_record(path)
  if found != path:
    config.pretrained_path = found
    _note(f'config.pretrained_path={path} is read as {found}')


def _recorded_vocabulary(config, recorded) -> None:
  """A two-tower checkpoint's tokenizer (beside it, `vocab` in its record)
  as `lit.vocab_path`, unless one is set."""
  if not recorded or not recorded.get('vocab') or 'lit' not in config:
    return
  if not config.lit.get('vocab_path'):
    config.lit.vocab_path = str(transform.beside(config.pretrained_path,
                                                 recorded['vocab']))
    _note(f'config.lit.vocab_path={config.lit.vocab_path}: the tokenizer '
          'beside the checkpoint')


def _model_dict(config) -> Dict[str, Any]:
  model = config.model.to_dict() if config.model is not None else {}
  model.pop('model_name', None)
  return model


def held_model_flags(argv, config_flag: str = 'config'):
  """(argv, held): where `--config.model_name=` names a preset, the
  `--config.model.*` flags are held out of absl's parsing, which checks
  them against the config file's model; `resolve` parses them against the
  preset's."""
  prefix = f'--{config_flag}.'
  names = [a.split('=', 1)[1] for a in argv
           if a.startswith(prefix + 'model_name=')]
  if not names or names[-1] not in registry.MODEL_CONFIGS:
    return list(argv), []
  held = [a for a in argv if a.startswith(prefix + 'model.')]
  return [a for a in argv if a not in held], held


def _parse_held(config, held, config_flag: str = 'config'):
  """(config, overrides) of the held `--config.model.*` flags, parsed by
  ml_collections against `config`'s own fields and types."""
  values = flags.FlagValues()
  argv, saved = ['vit_jax', *held], sys.argv
  sys.argv = argv  # config_flags reads its overrides from here, on DEFINE
  try:
    config_flags.DEFINE_config_dict(config_flag, config, flag_values=values,
                                    lock_config=False)
    values(argv)
  except (AttributeError, KeyError, flags.Error) as e:
    for arg in held:
      node, key = config, arg.split('=')[0]
      for part in key[len(config_flag) + 3:].split('.'):
        if not hasattr(node, 'keys') or part not in node:
          raise ValueError(f'{key}: the model of {config.model_name} has '
                           f'no such field.') from None
        node = node[part]
    raise ValueError(str(e)) from None
  finally:
    sys.argv = saved
  return values[config_flag].value, config_flags.get_override_values(
      values[config_flag])


def _other_class(config, recorded) -> bool:
  """Whether the record is of a model class other than the config's own
  (a ViViT or TimeSformer started from an image ViT's export): then the
  config's model stands, and the task fits the weights to it."""
  built = (recorded or {}).get('model_class')
  if not built or config.get('model') is None:
    return False
  return registry.model_class(config.model_name, config.model).__name__ != (
      built)


def resolve(config, given: Optional[Mapping[str, Any]] = None,
            held: Sequence[str] = ()):
  """`config` with its model and normalization settled, as a new config.

  `given`: the flat overrides of the command line (`config_flags.
  get_override_values`). With 'model_name' among them, naming a preset, the
  model is that preset's; the checkpoint's record then applies, and the
  given `model.*`, `pp.mean` and `pp.std` last, with the `held` flags
  (`held_model_flags`).
  """
  given = dict(given or {})
  out = copy.deepcopy(config)
  name = config.model_name
  before = _model_dict(config), _normalization(config)
  with out.unlocked():
    _convert_pretrained(out)
    recorded = checkpoint_record(out) or {}
    recorded_name = recorded.get('model_name')
    if _other_class(out, recorded):  # e.g. a video model from an image's
      recorded_name = None
    if ('model_name' not in given and recorded_name and
        recorded_name != name and recorded_name in registry.MODEL_CONFIGS):
      _note(f'{out.pretrained_path} is {recorded_name}, as its record says: '
            f'the run uses that preset, not {name}')
      out.model_name = name = recorded_name
      given['model_name'] = name
    elif ('model_name' not in given and recorded_name and
          recorded_name != name and recorded.get('model')):
      _note(f'{out.pretrained_path} is the custom model {recorded_name}, as '
            f'its record says: the run uses its model, not {name}\'s')
      registry.set_model(out, recorded_name, recorded['model'])
      name = recorded_name
    if 'model_name' in given:
      if name in registry.MODEL_CONFIGS:
        registry.set_model(out, name)
      else:
        hint = cli.closest(name, registry.MODEL_CONFIGS, 'preset')
        _note(f'config.model_name={name!r} is no preset, so the config\'s '
              f'own model is used under that name ({hint.split("; ")[-1]})')
    preset = _model_dict(out), _normalization(out)
    recorded = checkpoint_record(out)
    _recorded_vocabulary(out, recorded)
    if recorded and out.model is not None:
      if not _other_class(out, recorded):
        with out.model.unlocked():  # what a custom model lacks
          out.model.update(recorded.get('model') or {})
      if transform.recorded_normalization(recorded):
        registry.set_normalization(
            out, transform.recorded_normalization(recorded))
    mine = {k: v for k, v in given.items()
            if k.startswith(('model.', 'pp.mean', 'pp.std'))}
    out.update_from_flattened_dict(mine)
  if held:
    out, parsed = _parse_held(out, held)
    given.update(parsed)
  _say(config, out, given, before, preset, recorded)
  return out.lock() if config.is_locked else out


def _say(config, out, given, before, preset, recorded) -> None:
  """One note line for the preset's changes, one for the record's."""
  mine = sorted(k for k in given
                if k.startswith('model.') or k in ('pp.mean', 'pp.std'))
  after = _model_dict(out), _normalization(out)
  if preset != before and 'model_name' in given:
    changed = [k for k in _differing(before[0], preset[0])
               if f'model.{k}' not in given]
    parts = [f'config.model_name={config.model_name}: the preset won over '
             "the config's own model"]
    if changed:
      parts.append('differing in ' + ', '.join(changed[:6]) +
                   (', ...' if len(changed) > 6 else ''))
    if preset[1] != before[1]:
      parts.append(f'inputs normalized with {_describe(preset[1])}, as its '
                   'weights expect')
    if mine:
      parts.append(', '.join(f'--config.{k}' for k in mine) + ' given, '
                   'over it')
    _note('; '.join(parts))
  if recorded and after != preset:
    path = transform.transform_path(pretrained.pretrained_path(out))
    changed = [k for k in _differing(preset[0], after[0])
               if f'model.{k}' not in given]
    parts = [f'{path.name} (beside the checkpoint) applies']
    if changed:
      parts.append('model ' + ', '.join(changed))
    if after[1] != preset[1] and not {'pp.mean', 'pp.std'} & set(given):
      parts.append(f'inputs normalized with {_describe(after[1])}')
    if len(parts) > 1:
      _note(': '.join(parts[:1]) + ': ' + '; '.join(parts[1:]))
