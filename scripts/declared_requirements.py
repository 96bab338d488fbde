"""setup.py's requirements, read without running it (it calls
setuptools.setup on import): for tests/test_install.py and
scripts/lower_bounds.sh."""

import ast
import pathlib

SETUP = pathlib.Path(__file__).parent.parent / 'setup.py'


def declared(setup=SETUP):
  """(install_requires, extras_require) as setup.py writes them."""
  requires = extras = None
  for node in ast.walk(ast.parse(pathlib.Path(setup).read_text())):
    if isinstance(node, ast.Assign) and getattr(
        node.targets[0], 'id', '') == 'REQUIRES':
      requires = ast.literal_eval(node.value)
    if isinstance(node, ast.keyword) and node.arg == 'extras_require':
      extras = ast.literal_eval(node.value)
  return requires, extras
