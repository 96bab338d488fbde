"""TensorFlow's C++ start-up lines, kept off the user's screen.

`import tensorflow` (2.21) writes, straight to file descriptor 2 and before
absl's logging is set up, "WARNING: All log messages before
absl::InitializeLog() is called are written to STDERR" and glog INFO lines
("oneDNN custom operations are on", the CPU's instructions), twice. It does
so on CPUs where oneDNN's custom ops are on by default (AVX-512) or with
TF_ENABLE_ONEDNN_OPTS=1; TF_CPP_MIN_LOG_LEVEL does not reach them.

`install()` (run by `import vit_jax`) makes the first import of TensorFlow,
by whichever module asks for it (the data pipeline, clu, flax), write its
stderr to a temporary file; what is not start-up noise is then written back
to stderr, so a real error still shows. oneDNN itself stays as the user's
environment set it.
"""

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import tempfile

# absl's pre-init warning; glog INFO and WARNING lines
# ("I0000 00:00:1796157084.382262    2123 port.cc:153] ..."), the second
# line of cpu_feature_guard's message, and the ERROR line of CUDA's failed
# start on a machine without a GPU. Other ERROR lines pass.
NOISE = re.compile(
    r'WARNING: All log messages before absl::InitializeLog\(\)'
    r'|[IW]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] '
    r'|E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit'
    r'|To enable the following instructions: ')


def without_noise(text: str, noise=NOISE) -> str:
  """`text` without the lines of TensorFlow's start-up noise (`noise`)."""
  return ''.join(line for line in text.splitlines(keepends=True)
                 if not noise.match(line))


@contextlib.contextmanager
def filtered_stderr(noise=NOISE):
  """File descriptor 2 goes to a temporary file; its lines, less those
  `noise` matches, go to stderr at the end."""
  try:
    sys.stderr.flush()
    saved = os.dup(2)
  except (OSError, ValueError):  # no fd 2 to redirect: nothing to filter
    yield
    return
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = without_noise(captured.read().decode(errors='replace'), noise)
      if kept:
        sys.stderr.write(kept)
        sys.stderr.flush()


class _QuietLoader(importlib.abc.Loader):
  """Runs TensorFlow's own loader inside `filtered_stderr`."""

  def __init__(self, loader):
    self.loader = loader

  def create_module(self, spec):
    return self.loader.create_module(spec)

  def exec_module(self, module):
    # The module keeps its own loader, as if imported plainly.
    module.__loader__ = module.__spec__.loader = self.loader
    with filtered_stderr():
      self.loader.exec_module(module)
      # CUDA starts (and, without a GPU, fails) on the first look at the
      # devices: here, where its lines are filtered. GPUs stay visible.
      module.config.list_physical_devices('GPU')


class _Finder(importlib.abc.MetaPathFinder):
  """Finds `tensorflow` as usual, once, and wraps its loader."""

  def find_spec(self, name, path=None, target=None):
    # Not removed at the first look: `importlib.util.find_spec` (flax.io
    # asks) looks without importing; the import comes later.
    if name != 'tensorflow' or name in sys.modules:
      return None
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is not None and spec.loader is not None:
      spec.loader = _QuietLoader(spec.loader)
    return spec


def install() -> None:
  """Quiets TensorFlow's first import, unless it happened already."""
  if 'tensorflow' in sys.modules:
    return
  if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())
