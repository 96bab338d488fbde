"""The house's floor plan, read from the imports of `vit_jax/` (as text, by
`ast`; nothing is imported): the rules of docs/architecture.md hold, no
import circle, no import inside a function, and no family chosen by a
preset name's prefix."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'vit_jax'


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
  return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _modules():
  return {_module(p): p for p in PACKAGE.rglob('*.py')
          if 'configs' not in p.relative_to(PACKAGE).parts}


MODULES = _modules()


def _target(name: str) -> str:
  """The module an imported name lives in: `vit_jax.models.vit` for
  `from vit_jax.models import vit`, `vit_jax.cli` for `vit_jax.cli.x`."""
  while name not in MODULES and '.' in name:
    name = name.rsplit('.', 1)[0]
  return name


def _imports(path: pathlib.Path):
  """(imported vit_jax module, inside a function?) of each import."""
  tree = ast.parse(path.read_text())
  in_function = {id(n) for f in ast.walk(tree)
                 if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
  is_package = path.name == '__init__.py'
  module = _module(path)
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = module.split('.')[:len(module.split('.')) + is_package -
                                    node.level]
        base = '.'.join(parts + ([node.module] if node.module else []))
      names = [f'{base}.{a.name}' for a in node.names]
    for name in names:
      if name.startswith('vit_jax.') or name == 'vit_jax':
        yield _target(name), id(node) in in_function


EDGES = {m: {t for t, _ in _imports(p) if t != m} for m, p in MODULES.items()}

# Parts of the house, by module name (the first match).
PARTS = [
    ('compat', r'vit_jax\.original(\..*)?'),
    ('base', r'vit_jax\.(cli|losses)'),
    ('platform', r'vit_jax\.platform(\..*)?'),
    ('checkpoint files', r'vit_jax\.checkpoints\.(files|storage|pretrained)'),
    ('checkpoint reading', r'vit_jax\.checkpoints(\..*)?'),
    ('models', r'vit_jax\.models(\..*)?'),
    ('data pipeline', r'vit_jax\.data\.pipeline'),
    ('data', r'vit_jax\.data(\..*)?'),
    ('converters', r'vit_jax\.convert(\..*)?'),
    ('evaluators', r'vit_jax\.evaluators(\..*)?'),
    ('run', r'vit_jax\.run(\..*)?'),
    ('tasks', r'vit_jax\.tasks(\..*)?'),
    ('entry points', r'vit_jax\.(main|launch|plan|run_config|tpu_slices|'
                     r'pretrained|features|caption|nnx|'
                     r'analysis\.__main__)'),
    ('analysis', r'vit_jax\.(analysis(\..*)?|predict)'),
    ('face', r'vit_jax'),
]


def part(module: str) -> str:
  return next(name for name, pattern in PARTS if re.fullmatch(pattern,
                                                             module))


# (part, the parts it never imports), as docs/architecture.md states them.
RULES = [
    ('models', ('data', 'data pipeline', 'checkpoint files',
                'checkpoint reading', 'run', 'tasks', 'evaluators',
                'converters')),
    ('data', ('models', 'tasks', 'run')),
    ('data pipeline', ('models', 'tasks', 'run')),
    ('checkpoint files', ('run', 'converters', 'tasks')),
    ('checkpoint reading', ('run', 'converters', 'tasks')),
    ('converters', ('run', 'data pipeline')),
    ('evaluators', ('tasks', 'run', 'checkpoint reading',
                    'checkpoint files')),
    ('run', ('tasks', 'converters', 'entry points')),
    ('tasks', ('analysis', 'entry points')),
    ('analysis', ('run',)),
    ('base', ('platform', 'checkpoint files', 'checkpoint reading', 'models',
              'data', 'data pipeline', 'converters', 'evaluators', 'run',
              'tasks', 'entry points', 'analysis')),
    ('platform', ('checkpoint files', 'checkpoint reading', 'models', 'data',
                  'data pipeline', 'converters', 'evaluators', 'run',
                  'tasks', 'entry points', 'analysis')),
]


def test_every_module_has_a_part():
  assert {m: part(m) for m in MODULES}


@pytest.mark.parametrize('rule', RULES, ids=[r[0] for r in RULES])
def test_rule(rule):
  source, forbidden = rule
  broken = sorted(f'{m} imports {t}' for m, targets in EDGES.items()
                  if part(m) == source for t in targets
                  if part(t) in forbidden)
  assert not broken, broken


def test_nothing_in_the_house_imports_the_compatibility_names():
  """Only the package's face installs them (`vit_jax/__init__.py`)."""
  from_house = sorted(f'{m} imports {t}' for m, targets in EDGES.items()
                      if part(m) not in ('compat', 'face') for t in targets
                      if part(t) == 'compat')
  assert not from_house, from_house
  # The original's module names are no files of the package.
  assert not set(MODULES) & {'vit_jax.checkpoint', 'vit_jax.train',
                             'vit_jax.utils', 'vit_jax.models_vit',
                             'vit_jax.input_pipeline', 'vit_jax.preprocess'}


def test_configs_are_data():
  """Configs never import the run."""
  configs = PACKAGE.parent / 'configs'
  for path in configs.glob('*.py'):
    for line in path.read_text().splitlines():
      assert not re.match(r'from vit_jax(\.run| import (run_config|launch|'
                          r'main|train))\b', line), (path.name, line)


def test_no_circle():
  """No module imports itself through others (package faces aside: they
  only gather their own modules)."""
  graph = {m: {t for t in targets if not MODULES[t].name == '__init__.py'}
           for m, targets in EDGES.items()}
  done, stack = set(), []

  def visit(m):
    if m in stack:
      raise AssertionError(' -> '.join(stack[stack.index(m):] + [m]))
    if m in done:
      return
    stack.append(m)
    for t in sorted(graph[m]):
      visit(t)
    stack.pop()
    done.add(m)

  for m in sorted(graph):
    visit(m)


def test_no_import_inside_a_function():
  inside = sorted(f'{m}: {t}' for m, p in MODULES.items()
                  for t, in_function in _imports(p) if in_function)
  assert not inside, inside


def test_no_family_by_a_name_prefix():
  """A preset's family is the one that registered it (`models.registry`),
  never `name.startswith('DeiT-')` or the like."""
  prefix = re.compile(r"(startswith|endswith)\(\(?'(R\d*\+)?(ViT|DeiT3?|"
                      r"DINOv[23]|MAE|CLIP|SigLIP|EVA02|Swin|Mixer|BiT|LiT)"
                      r"-|endswith\('_384'")
  found = [f'{p.name}: {line.strip()}' for p in MODULES.values()
           for line in p.read_text().splitlines() if prefix.search(line)]
  assert not found, found
