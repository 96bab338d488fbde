"""What every command line shares: errors a user can fix, in a few lines.

`cli.run(main)` replaces `absl.app.run(main)`. An error the user caused
(a bad flag value, a missing or unreadable file, a config that does not
fit) is printed as `Error: MESSAGE` on stderr with exit status 1; the
traceback only with `--verbosity=1` or more, for bug reports.
"""

import difflib
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

# What the code raises for input a user can fix. `CheckpointError` is a
# ValueError; OSError covers missing files, permissions, a full disk and an
# unreachable host; ModuleNotFoundError comes with a `pip install` hint.
USER_ERRORS = (ValueError, OSError, ModuleNotFoundError, FloatingPointError)


def closest(name: str, choices, what: str) -> str:
  """'Unknown WHAT NAME; did you mean A, B?' (or the first few choices)."""
  choices = list(choices)
  near = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
  if near:
    return f'Unknown {what} {name!r}; did you mean {", ".join(near)}?'
  shown = ', '.join(sorted(choices)[:12])
  more = f' and {len(choices) - 12} more' if len(choices) > 12 else ''
  return f'Unknown {what} {name!r}; expected one of {shown}{more}.'


def _verbose() -> bool:
  return flags.FLAGS['verbosity'].present and logging.get_verbosity() >= 1


def _config_key_error(argv, config_flag):
  """The first `--CONFIG.a.b=v` of `argv` whose key the config lacks, with
  the closest keys at that level; None if every key exists."""
  values = flags.FlagValues()
  config_flags.DEFINE_config_file(config_flag, None, '', flag_values=values)
  prefix = f'--{config_flag}'
  base = argv[:1] + [a for a in argv if a.startswith(prefix + '=')]
  saved, sys.argv = sys.argv, base  # config_flags reads overrides from here
  try:
    values(base)
  except Exception:  # pylint: disable=broad-except
    return None  # the config file itself fails: absl's message says why
  finally:
    sys.argv = saved
  for arg in argv:
    if not arg.startswith(prefix + '.'):
      continue
    path = arg[len(prefix) + 1:].split('=')[0].split('.')
    node = values[config_flag].value
    for depth, key in enumerate(path):  # the first missing key
      if not hasattr(node, 'keys') or key not in node:
        where = ''.join(f'{k}.' for k in path[:depth])
        keys = node.keys() if hasattr(node, 'keys') else []
        return closest(where + key, [where + k for k in keys], 'config key')
      node = node[key]
  return None


def _parser(config_flag):
  """absl's flag parsing; a bad flag (an unknown config key included) is
  one line, not a trace."""
  def parse(argv):
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      message = str(e)
    except (AttributeError, KeyError):
      message = config_flag and _config_key_error(argv, config_flag)
      if message is None:
        raise
    print(f'Error: {message}\nPass --helpfull to see the flags.',
          file=sys.stderr, flush=True)
    sys.exit(1)
  return parse


def run(main, config_flag=None):
  """`app.run(main)`, with user errors as one short message; with
  `config_flag`, an unknown `--config.KEY` is named with the closest keys."""
  def guarded(argv):
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)  # absl's default, INFO, is noise
    try:
      return main(argv)
    except (*USER_ERRORS, app.UsageError) as e:  # one line, no flag listing
      if _verbose():
        raise
      print(f'Error: {e}', file=sys.stderr, flush=True)
      sys.exit(1)

  app.run(guarded, flags_parser=_parser(config_flag))
