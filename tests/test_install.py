"""Installing into environments that have their own jax, TensorFlow, pandas:
setup.py's ranges, the lock, and scripts/pip_keep.py."""

import importlib.util
import pathlib
import types

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).parent.parent


def _script(name):
  """scripts/{name}.py as a module."""
  spec = importlib.util.spec_from_file_location(
      name, ROOT / 'scripts' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _setup_requirements():
  return _script('declared_requirements').declared()


def _lock():
  """{name: version} of requirements.txt."""
  pins = {}
  for line in (ROOT / 'requirements.txt').read_text().splitlines():
    if line.strip() and not line.startswith('#'):
      name, version = line.split('==')
      pins[canonicalize_name(name)] = version.strip()
  return pins


def test_ranges_not_pins():
  requires, extras = _setup_requirements()
  for spec in requires + sum(extras.values(), []):
    req = Requirement(spec)
    assert req.specifier, f'{spec}: no lower bound'
    assert all(s.operator in ('>=', '<') for s in req.specifier), spec
  names = {canonicalize_name(Requirement(r).name) for r in requires}
  assert 'tensorflow' in names and 'tensorflow-cpu' not in names


def test_the_lock_is_in_the_ranges():
  """CI installs the lock as constraints: each locked version is one the
  ranges allow, and everything CI installs is locked."""
  requires, extras = _setup_requirements()
  lock = _lock()
  for spec in requires + extras['test'] + extras['tpu']:
    req = Requirement(spec)
    name = canonicalize_name(req.name)
    assert name in lock, f'{name} is not in requirements.txt'
    assert req.specifier.contains(lock[name]), (spec, lock[name])
  assert 'tensorflow-cpu' not in lock and 'torch' not in lock


def _distribution(name, version):
  return types.SimpleNamespace(metadata={'Name': name}, version=version)


def test_pip_keep_pins_the_runtime_stack():
  pip_keep = _script('pip_keep')
  installed = [_distribution(*d) for d in (
      ('jax', '0.7.2'), ('jaxlib', '0.7.2'), ('jax_cuda12_plugin', '0.7.2'),
      ('jax-cuda12-pjrt', '0.7.2'), ('tensorflow', '2.19.0'),
      ('pandas', '2.2.2'), ('numpy', '2.0.2'), ('flax', '0.10.6'),
      ('jaxtyping', '0.3.2'), ('torch', '2.8.0'))]
  assert pip_keep.kept(installed) == [
      'jax-cuda12-pjrt==0.7.2', 'jax-cuda12-plugin==0.7.2', 'jax==0.7.2',
      'jaxlib==0.7.2', 'numpy==2.0.2', 'pandas==2.2.2',
      'tensorflow==2.19.0', 'torch==2.8.0']
  assert pip_keep.tensorflow_conflict(pip_keep.kept(installed)) is None


def test_pip_keep_refuses_a_second_tensorflow():
  pip_keep = _script('pip_keep')
  pins = pip_keep.kept([_distribution('tensorflow_cpu', '2.21.0')])
  error = pip_keep.tensorflow_conflict(pins)
  assert error.startswith('Error: tensorflow-cpu is installed')
  assert 'pip uninstall -y tensorflow-cpu' in error
