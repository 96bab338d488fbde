"""The original release's API (google-research/vision_transformer), in one
place, for code written against it: its module names, and the functions
that only it uses. Nothing in the package imports from here.

`install()` (run by `import vit_jax`, which stays light: nothing loads
before it is asked for) makes each of the original's module names in
`MODULES` import the module that holds its code now, and gives `LitModel`
the original's conveniences (`lit.py`) as its module loads. Its config aliases
(`eval_every`, `optim_dtype`, `model_or_filename`) are in
`configs/common.py`, the original's `vit_jax.configs.common`.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

# The original's module name (and this package's earlier ones) -> the
# module that answers to it.
MODULES = {
    'vit_jax.checkpoint': 'vit_jax.original.checkpoint',
    'vit_jax.inference_time': 'vit_jax.tasks.inference_time',
    'vit_jax.input_pipeline': 'vit_jax.data.pipeline',
    'vit_jax.models_lit': 'vit_jax.models.lit',
    'vit_jax.models_mixer': 'vit_jax.models.mixer',
    'vit_jax.models_resnet': 'vit_jax.models.resnet',
    'vit_jax.models_vit': 'vit_jax.models.vit',
    'vit_jax.preprocess': 'vit_jax.original.preprocess',
    'vit_jax.train': 'vit_jax.original.train',
    'vit_jax.utils': 'vit_jax.original.utils',
    # Earlier names of this package.
    'vit_jax.checkpoint_files': 'vit_jax.checkpoints.files',
    'vit_jax.model_configs': 'vit_jax.models.registry',
    'vit_jax.tokenizers': 'vit_jax.data.tokenizers',
}


class _Alias(importlib.abc.Loader):
  """Loads an alias as the module it names: the same module object."""

  def __init__(self, target: str):
    self.target = target

  def create_module(self, spec):
    module = importlib.import_module(self.target)
    self.spec = module.__spec__
    return module

  def exec_module(self, module):
    module.__spec__ = self.spec  # the import set the alias's; keep its own


class _WithConveniences(importlib.abc.Loader):
  """Loads `vit_jax.models.lit`, then gives its LitModel the original's
  conveniences."""

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    module.__loader__ = module.__spec__.loader = self.loader
    self.loader.exec_module(module)
    importlib.import_module('vit_jax.original.lit').install()


class _Finder(importlib.abc.MetaPathFinder):

  def find_spec(self, name, path=None, target=None):
    del target
    if name in MODULES:
      return importlib.util.spec_from_loader(name, _Alias(MODULES[name]))
    if name == 'vit_jax.models.lit':
      spec = importlib.machinery.PathFinder.find_spec(name, path)
      spec.loader = _WithConveniences(spec.loader)
      return spec
    return None


def install() -> None:
  """The original's module names, and LitModel's conveniences; once."""
  if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
