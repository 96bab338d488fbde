"""What a workdir keeps of its run, so that no run overwrites another's.

Each run that trains records its config in `{workdir}/config.json`. A
later start in a workdir with checkpoints must describe the same run: settings
that change what is computed (model, data, schedule, seed...) are compared,
and a difference is refused before anything is read or written, unless
the user allows it. Settings that only say how or when (evaluators,
logging, saving, the mesh, data locations) may change on resume.
"""

import contextlib
import json

from etils import epath
import jax

from vit_jax.checkpoints import storage

CONFIG = 'config.json'
# May differ on resume: they do not change the trained parameters.
FREE_KEYS = frozenset((
    'evals', 'eval_every', 'batch_eval', 'checkpoint_every', 'max_to_keep', 'mesh',
    'sharding_rules', 'sharding_strategy', 'prefetch', 'progress_bar',
    'progress_every', 'tfds_data_dir', 'tfds_download', 'tfds_manual_dir',
    'pretrained_dir', 'pretrained_path'))


def _flat(tree, prefix=''):
  """{'a.b': value} of a nested dict, values as JSON would give them back."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}{key}.'))
    else:
      out[prefix + key] = json.loads(json.dumps(value, default=str))
  return out


def _as_json(config):
  resolved = config.copy_and_resolve_references().to_dict()
  return json.loads(json.dumps(resolved, default=str))


def has_checkpoint(workdir) -> bool:
  """Whether `workdir` holds a finished Orbax step (`checkpoints/<step>`)."""
  path = epath.Path(workdir) / 'checkpoints'
  return path.is_dir() and any(p.name.isdigit() for p in path.iterdir())


def check_config(config, workdir, *, allow_change: bool = False):
  """Refuses to resume a run whose recorded settings differ, unless
  `allow_change`."""
  path = epath.Path(storage.join(workdir, CONFIG))
  if allow_change or not (has_checkpoint(workdir) and path.exists()):
    return
  now = _flat({k: v for k, v in _as_json(config).items()
               if k not in FREE_KEYS})
  before = _flat({k: v for k, v in json.loads(path.read_text()).items()
                  if k not in FREE_KEYS})
  # Settings that one side lacks are a config written by another version
  # of the code (a key added or removed since), not another run.
  changed = sorted(k for k in before.keys() & now.keys()
                   if before[k] != now[k])
  if changed:
    listing = '\n'.join(f'  {k}: {before[k]!r} -> {now[k]!r}'
                        for k in changed[:20])
    raise ValueError(
        f'{workdir} holds a run with other settings; resuming it would mix '
        f'two runs and overwrite its results:\n{listing}\nUse a new '
        '--workdir, or pass --allow_config_change to continue anyway.')


def record_config(config, workdir):
  """`{workdir}/config.json`: the settings of the run that trains there."""
  if jax.process_index() == 0:
    storage.write_json(storage.join(workdir, CONFIG), _as_json(config))


def results_name(workdir) -> str:
  """`results.json`, or `eval_results.json` beside a training run's."""
  path = epath.Path(storage.join(workdir, 'results.json'))
  if path.exists() and 'step' in json.loads(path.read_text()):
    return 'eval_results.json'
  return 'results.json'


@contextlib.contextmanager
def removed_if_failed(workdir):
  """Removes `workdir` if the run made it and fails before any checkpoint."""
  path = epath.Path(workdir)
  existed = path.exists()
  try:
    yield
  except BaseException:
    if (not existed and path.exists() and not has_checkpoint(workdir) and
        jax.process_index() == 0):
      path.rmtree()
    raise
