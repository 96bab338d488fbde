"""Paths that may be local, in a bucket (gs://, s3://) or at a URL (https://).

Everything a user names goes through `etils.epath`, as Orbax and tfds do.
Checkpoints that live elsewhere are streamed once into a local cache, where
numpy can read them.
"""

import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
import urllib.request

from etils import epath

CACHE_DIR = os.environ.get('VIT_JAX_CACHE',
                           os.path.expanduser('~/.cache/vit_jax'))
_URL = re.compile(r'https?://', re.IGNORECASE)
_REMOTE = re.compile(r'[a-z][a-z0-9+.-]*://', re.IGNORECASE)


def is_remote(path) -> bool:
  """Whether `path` is a URL or a bucket path rather than a local file."""
  return bool(_REMOTE.match(os.fspath(path)))


def absolute(path) -> str:
  """`path` as an absolute local path, or unchanged if remote."""
  path = os.fspath(path)
  return path if is_remote(path) else os.path.abspath(path)


def join(base, name: str) -> str:
  """`base/name`, keeping a URL's `//` (which epath.Path would fold)."""
  base = os.fspath(base)
  return f'{base.rstrip("/")}/{name}' if is_remote(base) else os.path.join(
      base, name)


def _fetch(path: str, dst: str, timeout: float):
  """Streams a URL or a bucket file into the local file `dst`."""
  try:
    with (urllib.request.urlopen(path, timeout=timeout) if _URL.match(path)
          else epath.Path(path).open('rb')) as src, open(dst, 'wb') as out:
      shutil.copyfileobj(src, out, length=1 << 20)
  except OSError as e:  # URLError and socket timeouts are OSErrors
    raise FileNotFoundError(f'Cannot download {path}: {e}') from e


def _version(path: str) -> str:
  """A bucket file's size and time (a rewritten file is fetched again)."""
  if _URL.match(path):
    return ''  # published files do not change
  src = epath.Path(path)
  if not src.is_file():
    raise FileNotFoundError(f'Checkpoint file not found: {path}')
  stat = src.stat()
  return f'{stat.length}-{stat.mtime}'


def local_copy(path, timeout: float = 60.) -> str:
  """A local file with the contents of `path`; remote files are cached once.

  The cache (`$VIT_JAX_CACHE`, default ~/.cache/vit_jax) is keyed by the
  path (and a bucket file's size and time); a copy appears atomically, so
  processes sharing a disk may race.
  """
  path = os.fspath(path)
  if not is_remote(path):
    if not os.path.isfile(path):
      raise FileNotFoundError(f'Checkpoint file not found: {path}')
    return path
  key = hashlib.sha256(f'{path}|{_version(path)}'.encode()).hexdigest()[:16]
  name = re.sub(r'[^\w.-]', '_', path.rstrip('/').rsplit('/', 1)[-1])
  cached = os.path.join(CACHE_DIR, f'{key}-{name}')
  if os.path.isfile(cached):
    return cached
  os.makedirs(CACHE_DIR, exist_ok=True)
  tmp = f'{cached}.tmp-{secrets.token_hex(6)}'
  try:
    _fetch(path, tmp, timeout)
    os.replace(tmp, cached)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  return cached


def write_json(path, data) -> None:
  """`data` as JSON at `path` (local or in a bucket), atomically."""
  epath.Path(path).parent.mkdir(parents=True, exist_ok=True)
  write_atomic(path, lambda f: f.write(json.dumps(data).encode()))


def write_atomic(path, write) -> None:
  """Calls `write(file)` on a temporary file beside `path`, then renames it.

  Local files are synced to disk before the rename, so a crash leaves the
  old file or the new one, never a torn one. For a bucket the file is
  written locally first (zip writers seek, bucket files cannot).
  """
  path = epath.Path(path)
  tmp = path.parent / f'{path.name}.tmp-{secrets.token_hex(6)}'
  try:
    if is_remote(path):
      with tempfile.TemporaryFile() as local, tmp.open('wb') as f:
        write(local)
        local.seek(0)
        shutil.copyfileobj(local, f, length=1 << 20)
    else:
      with tmp.open('wb') as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
  finally:
    if tmp.exists():
      tmp.unlink()
