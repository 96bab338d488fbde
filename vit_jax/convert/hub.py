"""Checkpoints by hub name, which files a checkpoint folder holds, and
where converted ones are kept."""

import importlib
import os
import re

# A timm or transformers folder's weights, as the hub and `save_for_hf`
# name them.
# Large ones come in shards, named by an index (`*.index.json`).
WEIGHTS = ('model.safetensors', 'model.safetensors.index.json',
           'pytorch_model.bin', 'pytorch_model.bin.index.json')

# What a hub checkpoint's folder holds that vit_jax reads: the weights, the
# config.json of timm or transformers, transformers' processor, a two-tower
# model's tokenizer.
HUB_FILES = ('config.json', 'model.safetensors', 'preprocessor_config.json',
             'tokenizer.json', 'tokenizer_config.json', 'spiece.model',
             'tokenizer.model', 'model.safetensors.index.json', 'model-*.safetensors',
             'pytorch_model.bin', 'pytorch_model.bin.index.json',
             'pytorch_model-*.bin')


def fetch(name: str, timeout: float = 5.) -> str:
  """The folder of hub checkpoint `name` (e.g. timm/vit_base_patch16_224.
  augreg_in21k, google/vit-base-patch16-224): huggingface_hub's cached
  copy, else downloaded (`HUB_FILES`). Fails in seconds offline."""
  import socket  # pylint: disable=g-import-not-at-top
  try:
    hub = importlib.import_module('huggingface_hub')
    return hub.snapshot_download(name, allow_patterns=list(HUB_FILES),
                                 local_files_only=True)
  except (ModuleNotFoundError, OSError, ValueError):  # absent, not cached
    pass
  try:
    if os.environ.get('HF_HUB_OFFLINE', '0') not in ('', '0'):
      raise OSError('HF_HUB_OFFLINE is set')  # the hub's own switch
    socket.create_connection(('huggingface.co', 443), timeout=timeout).close()
  except OSError as e:
    raise ConnectionError(
        f'Cannot reach huggingface.co to fetch {name} ({e}). Download its '
        f'{", ".join(HUB_FILES[:3])} (and tokenizer files) where there is '
        'network, then convert their folder.') from e
  hub = importlib.import_module('huggingface_hub')
  return hub.snapshot_download(name, allow_patterns=list(HUB_FILES))


def is_convertible(src: str) -> bool:
  """Whether `src` is a checkpoint that `as_npz` converts: a timm or
  transformers folder, a weights file, or a hub name (no .npz, no
  workdir)."""
  src = os.fspath(src)
  if os.path.isdir(src):
    return any(os.path.exists(os.path.join(src, n)) for n in WEIGHTS)
  if src.endswith(('.safetensors', '.bin', '.pth', '.pt')):
    return True
  return (not os.path.exists(src) and '://' not in src and
          re.fullmatch(r'[\w.-]+/[\w.-]+', src) is not None)


def cache_dir() -> str:
  """Where converted checkpoints are kept: $VIT_JAX_CACHE/converted
  (default ~/.cache/vit_jax/converted)."""
  root = os.environ.get('VIT_JAX_CACHE') or os.path.join(
      os.path.expanduser('~'), '.cache', 'vit_jax')
  return os.path.join(root, 'converted')


