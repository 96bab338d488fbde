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

# What the code raises for input a user can fix. `CheckpointError` is a
# ValueError; ModuleNotFoundError comes with a `pip install` hint.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError,
               IsADirectoryError, PermissionError, ModuleNotFoundError,
               FloatingPointError)


def closest(name: str, choices, what: str) -> str:
  """'Unknown WHAT NAME; did you mean A, B?' (or the first few choices)."""
  choices = list(choices)
  near = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
  if near:
    return f'Unknown {what} {name!r}; did you mean {", ".join(near)}?'
  shown = ', '.join(sorted(choices)[:12])
  more = ', ...' if len(choices) > 12 else ''
  return f'Unknown {what} {name!r}; expected one of {shown}{more}.'


def _verbose() -> bool:
  return flags.FLAGS['verbosity'].present and logging.get_verbosity() >= 1


def run(main):
  """`app.run(main)`, with user errors as one short message."""
  def guarded(argv):
    try:
      return main(argv)
    except USER_ERRORS as e:
      if _verbose():
        raise
      print(f'Error: {e}', file=sys.stderr, flush=True)
      sys.exit(1)

  app.run(guarded)
