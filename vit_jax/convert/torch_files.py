"""torch's checkpoint files (`torch.save`'s zip: `pytorch_model.bin`, `.pth`)
as numpy arrays, without torch.

The file is a zip of `data.pkl`, a pickle of the state dict whose tensors
are `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`
over storages in `data/<key>`. The pickle is read with only those names
allowed: any other object (a class, a function) is refused, so that no
code a file names ever runs. torch's pre-1.6 format (no zip) is not read.
"""

import collections
import pickle
import sys
from typing import Any, Dict
import zipfile

import ml_dtypes
import numpy as np

# torch's typed storage classes, as the pickle names them.
_DTYPES = {
    'FloatStorage': np.float32, 'DoubleStorage': np.float64,
    'HalfStorage': np.float16, 'BFloat16Storage': ml_dtypes.bfloat16,
    'LongStorage': np.int64, 'IntStorage': np.int32,
    'ShortStorage': np.int16, 'CharStorage': np.int8,
    'ByteStorage': np.uint8, 'BoolStorage': np.bool_,
}


class _Storage(str):
  """A storage class's name, which says its dtype."""


def _rebuild_tensor(storage, offset, size, stride, *unused):
  """`torch._utils._rebuild_tensor_v2`: a view of `storage`, copied."""
  del unused
  itemsize = storage.dtype.itemsize
  view = np.lib.stride_tricks.as_strided(
      storage[offset:], shape=tuple(size),
      strides=tuple(s * itemsize for s in stride))
  return np.array(view)


def _rebuild_parameter(data, requires_grad, hooks, *unused):
  del requires_grad, hooks, unused
  return data


_ALLOWED = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
    ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
}


class _Unpickler(pickle.Unpickler):
  """Tensors and dicts only; storages read from the zip once each."""

  def __init__(self, archive: zipfile.ZipFile, prefix: str, path: str):
    super().__init__(archive.open(f'{prefix}data.pkl'))
    self.archive, self.prefix, self.path = archive, prefix, path
    self.storages: Dict[str, np.ndarray] = {}

  def find_class(self, module, name):
    if module == 'torch' and name in _DTYPES:
      return _Storage(name)
    if (module, name) in _ALLOWED:
      return _ALLOWED[(module, name)]
    raise pickle.UnpicklingError(
        f'{self.path} holds {module}.{name}, not only tensors: it is not '
        'read (no object a file names is ever loaded here).')

  def persistent_load(self, pid):
    kind, storage, key = pid[:3]
    if kind != 'storage' or not isinstance(storage, _Storage):
      raise pickle.UnpicklingError(f'{self.path}: unknown storage {pid!r}.')
    if key not in self.storages:
      data = self.archive.read(f'{self.prefix}data/{key}')
      dtype = np.dtype(_DTYPES[storage])
      if sys.byteorder != 'little':
        dtype = dtype.newbyteorder('<')
      self.storages[key] = np.frombuffer(data, dtype)
    return self.storages[key]


def load(path: str) -> Dict[str, Any]:
  """The state dict of torch's zip file at `path`, as numpy arrays.
  Raises ValueError on anything else."""
  try:
    archive = zipfile.ZipFile(path)
  except zipfile.BadZipFile as e:
    raise ValueError(f'{path} is not a zip file of torch.save (torch '
                     "1.6's format and later): read it with torch, or save "
                     'its state_dict() as .safetensors.') from e
  with archive:
    pickles = [n for n in archive.namelist() if n.endswith('/data.pkl')]
    if len(pickles) != 1:
      raise ValueError(f'{path}: expected one data.pkl in the zip, found '
                       f'{len(pickles)}.')
    try:
      state = _Unpickler(archive, pickles[0][:-len('data.pkl')], path).load()
    except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as e:
      raise ValueError(f'Cannot read {path}: {e}') from e
  if not isinstance(state, dict):
    raise ValueError(f'{path} holds a {type(state).__name__}, not a state '
                     'dict.')
  return dict(state.get('state_dict', state))
