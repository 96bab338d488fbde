"""What rebuilds a checkpoint: the record beside its `.npz`.

`<name>.transform.json` beside `<name>.npz` holds `model_name` and `model`
(for a preset: the settings that differ from it; for a custom model, a name
that is no preset: every setting that differs from its class's defaults,
which is the whole model), `model_class` (what builds it), and the eval
transform in timm's
`pretrained_cfg` keys (`input_size`, `crop_pct`, `crop_mode`,
`interpolation`, `mean`, `std`). `convert` writes it from a source's
files, the loop from a run's config (`of_run`) beside every export. Every
tool reads a checkpoint's model through `settings`, and a training workdir
through its `config.json` and its export (`resolve`).
"""

import dataclasses
import json
from typing import Any, Dict, Mapping, Optional, Tuple

from etils import epath
import numpy as np

from vit_jax import cli
from vit_jax.checkpoints import files
from vit_jax.checkpoints import storage
from vit_jax.models import registry

RECORD = 'transform.json'
CONFIG = 'config.json'  # a workdir's record of its run (run/run_record.py)
# Settings that are no part of a rebuilt model: the file's head tells the
# classes; the module's name and parent are Flax's.
_NOT_RECORDED = ('parent', 'name', 'num_classes', 'model_name')


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]):
  """`base` (a model config dict) with `overrides` merged in, nested dicts
  key by key; `model_overrides` is its inverse."""
  out = dict(base)
  for key, value in overrides.items():
    out[key] = (merged(out.get(key) or {}, value)
                if isinstance(value, Mapping) else value)
  return out


def _listed(value):
  return list(value) if isinstance(value, (tuple, list)) else value


def model_overrides(base, new) -> Dict[str, Any]:
  """The fields of model config `new` that differ from `base` (nested dicts
  key by key, tuples as lists): what `merged` merges back."""
  out = {}
  for key, value in new.items():
    old = base.get(key)
    if isinstance(value, Mapping) and isinstance(old, Mapping):
      inner = model_overrides(old, value)
      if inner:
        out[key] = inner
    elif _listed(value) != _listed(old):
      out[key] = _listed(value)
  return out


def _jsonable(value):
  """A module attribute as JSON keeps it (a dtype by its name)."""
  if hasattr(value, 'keys'):  # dicts and ConfigDicts
    return {k: _jsonable(value[k]) for k in value.keys()}
  if isinstance(value, (tuple, list)):
    return [_jsonable(v) for v in value]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  return np.dtype(value).name


def _fields(cls_or_module, values: bool):
  """{field: its value on the module, or its default on the class}."""
  out = {}
  for f in dataclasses.fields(cls_or_module):
    if not f.init or f.name in _NOT_RECORDED:
      continue
    if values:
      out[f.name] = _jsonable(getattr(cls_or_module, f.name))
    elif f.default is not dataclasses.MISSING:
      out[f.name] = _jsonable(f.default)
    elif f.default_factory is not dataclasses.MISSING:
      out[f.name] = _jsonable(f.default_factory())
  return out


def model_record(name: str, module) -> Dict[str, Any]:
  """{'model_name', 'model'} of the image model `module` under `name`."""
  settings = _fields(module, values=True)
  if name in registry.MODEL_CONFIGS:
    base = registry.MODEL_CONFIGS[name].to_dict()
  else:
    base = _fields(type(module), values=False)
  return {'model_name': name, 'model': model_overrides(base, settings),
          'model_class': type(module).__name__}


def eval_transform(pp) -> Dict[str, Any]:
  """The data pipeline's eval transform of `pp` (`preprocess_eval`), in the
  record's keys: the whole image resized to `pp.crop` (bilinear), or to
  `pp.resize` then a central crop, or timm's short side and center crop."""
  crop = int(pp['crop'])
  if pp.get('crop_pct'):
    out = dict(crop_pct=float(pp['crop_pct']), crop_mode='center',
               interpolation=pp.get('interpolation') or 'bilinear')
  else:
    out = dict(crop_pct=crop / (pp.get('resize') or crop),
               crop_mode='squash', interpolation='bilinear')
  mean, std = pp.get('mean'), pp.get('std')
  out['mean'] = list(mean or registry.NORMALIZATIONS['google'][0])
  out['std'] = list(std or registry.NORMALIZATIONS['google'][1])
  return {'input_size': [3, crop, crop], **out}


def of_run(config, module) -> Dict[str, Any]:
  """The record of a run's export: its model (`module`, the exported one)
  under the run's `model_name`, its eval transform, and a video run's
  views."""
  record = model_record(config.model_name, module)
  if config.get('pp') and config.pp.get('crop'):
    record.update(eval_transform(config.pp))
  record.update(video_views(config.get('video')))
  return record


def video_views(video) -> Dict[str, Any]:
  """The record's keys of the clips a video run's test sees (`config.video`;
  none without): frames per view, their stride, the views."""
  if not video:
    return {}
  return {'num_frames': video['frames'], 'frame_stride': video['stride'],
          'test_views': video['test_views']}


def write(npz_path, record: Mapping[str, Any]) -> None:
  """`record` beside `npz_path`, atomically."""
  storage.write_json(str(files.beside(npz_path, RECORD)), dict(record))


def read(npz_path) -> Optional[Dict[str, Any]]:
  """The record beside `npz_path`, or None."""
  return files.read_record(npz_path)


def _of_config(run: Mapping[str, Any]) -> Dict[str, Any]:
  """A record from a workdir's `config.json`: its model and transform."""
  model = {k: v for k, v in (run.get('model') or {}).items()
           if k != 'model_name'}
  name = run['model_name']
  if name in registry.MODEL_CONFIGS:
    model = model_overrides(registry.MODEL_CONFIGS[name].to_dict(), model)
  record = {'model_name': name, 'model': model}
  if (run.get('pp') or {}).get('crop'):
    record.update(eval_transform(run['pp']))
  record.update(video_views(run.get('video')))
  return record


def resolve(path) -> Tuple[str, Optional[Dict[str, Any]]]:
  """(checkpoint, record) of `path`: an `.npz` and the record beside it; a
  training workdir's export `{model_name}.npz` (its record, else the one
  its `config.json` gives), else its latest state with that record."""
  path = str(path)
  folder = epath.Path(path)
  if not folder.is_dir():
    return path, read(path) if path.endswith('.npz') else None
  # A workdir, its `checkpoints` or one `checkpoints/<step>` (that step).
  step = folder.name.isdigit()
  workdir = folder.parent.parent if step else (
      folder.parent if folder.name == 'checkpoints' else folder)
  if not (workdir / CONFIG).exists():
    return path, None
  run = json.loads((workdir / CONFIG).read_text())
  export = storage.join(str(workdir), f'{run["model_name"]}.npz')
  if not step and epath.Path(export).exists():
    return export, read(export) or _of_config(run)
  return path, _of_config(run)


def settings(record: Optional[Mapping[str, Any]], model_name=None, *,
             source: str = 'the checkpoint') -> Tuple[str, Dict[str, Any]]:
  """(name, model config dict) of a checkpoint: preset `model_name` (else
  the recorded one) amended by the record's `model`, or the recorded custom
  model whole. Raises ValueError naming `source` when nothing says it."""
  record = record or {}
  if 'segmentation' in record:
    raise ValueError(f'{source} is a segmentation probe (a backbone and its '
                     "head): evaluate it with trainer='segmentation'.")
  name = model_name or record.get('model_name')
  if not name:
    raise ValueError(f'{source} has no record of its model (no '
                     f'{RECORD} beside it): name its preset.')
  if name in registry.MODEL_CONFIGS:
    return name, merged(registry.MODEL_CONFIGS[name].to_dict(),
                        record.get('model') or {})
  if name == record.get('model_name') and record.get('model'):
    model = {**record['model'], 'model_name': name}
    built = registry.model_class(name, model).__name__
    if record.get('model_class', built) != built:
      raise ValueError(
          f'{source} holds a {record["model_class"]} ({name}), which no '
          'registered family builds: evaluate it with its run\'s config '
          "(trainer='evaluate').")
    return name, model
  raise registry.UnknownPreset(
      cli.closest(name, registry.MODEL_CONFIGS, 'model preset'))


def recorded_normalization(record) -> Optional[Tuple[tuple, tuple]]:
  """(mean, std) of a record, if it names both."""
  if not record or 'mean' not in record or 'std' not in record:
    return None
  return tuple(record['mean']), tuple(record['std'])


def normalization(record, name: str) -> Tuple[tuple, tuple]:
  """(mean, std) of the record, else the one the preset `name` expects."""
  return recorded_normalization(record) or registry.input_normalization(name)
