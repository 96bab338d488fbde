"""The original's `vit_jax.checkpoint`: its helpers, and the names it
exported, from where they live now (`vit_jax.checkpoints`: `files` reads
and writes, `loading` fits a checkpoint to a model)."""

import sys
from typing import Any, Mapping, Optional, Tuple

from etils import epath
from flax import traverse_util
import tqdm.auto as tqdm

# pylint: disable=unused-import
from vit_jax.checkpoints.files import CheckpointError
from vit_jax.checkpoints.files import inspect_params
from vit_jax.checkpoints import files
from vit_jax.checkpoints.files import published_flat
from vit_jax.checkpoints.files import read_params
from vit_jax.checkpoints.files import save
from vit_jax.checkpoints.files import scan_like
from vit_jax.checkpoints.files import shape_of
from vit_jax.checkpoints.files import wrong_shapes
from vit_jax.checkpoints.loading import default_resize_method
from vit_jax.checkpoints.loading import image_size
from vit_jax.checkpoints.loading import load_model
from vit_jax.checkpoints.loading import load_params
from vit_jax.checkpoints.loading import model_config_for
from vit_jax.checkpoints.pretrained import augreg_index as get_augreg_df
from vit_jax.convert import transform
from vit_jax.models.posemb_resize import interpolate_posembed
from vit_jax.models.posemb_resize import resize_posemb_grid
# pylint: enable=unused-import


def load(path):
  """The original's `load`: the file's parameters (`files.load`). Where the
  record beside it changes the model (`convert` wrote it), a note says so:
  the preset's model alone computes something else."""
  params = files.load(path)
  recorded = transform.load_transform(path) if not str(path).startswith(
      ('gs://', 'http://', 'https://')) else None
  if recorded and recorded.get('model'):
    print(f'Note: {transform.transform_path(path).name} beside {path} '
          f'changes the model of {recorded.get("model_name", "the preset")} '
          f'({", ".join(sorted(recorded["model"]))}): '
          'vit_jax.models.from_pretrained(path) builds it with them.',
          file=sys.stderr)
  return params


def recover_tree(keys, values):
  """The nested dict of flat '/'-separated `keys` and their `values`."""
  return traverse_util.unflatten_dict(
      {tuple(k.split('/')): v for k, v in zip(keys, values)})


def copy(src, dst, progress: bool = True, block_size: int = 10 << 20):
  """Copies the file `src` to `dst` (local, gs://) in blocks, with a
  progress bar."""
  src, dst = epath.Path(src), epath.Path(dst)
  blocks = -(-src.stat().length // block_size)
  with src.open('rb') as fin, dst.open('wb') as fout:
    for _ in (tqdm.trange(blocks) if progress else range(blocks)):
      fout.write(fin.read(block_size))


def load_pretrained(*,
                    pretrained_path,
                    init_params: Mapping[str, Any],
                    model_config,
                    new_grid: Optional[Tuple[int, int]] = None,
                    old_grid: Optional[Tuple[int, int]] = None,
                    resize_method: Optional[str] = None) :
  """Loads a checkpoint to fine-tune the model of `init_params`: the
  original's name for `load_params(..., new_head=True)`, which see.

  At a new resolution (Sec. 3.2 of the paper) 'learn' tables are resized in
  2-D on the patch grid (prefix entries kept) and 'learn2d' ones in 1-D; a
  Mixer cannot change resolution. `init_params` holds arrays: the fresh
  head (and `pre_logits`, if the file has none) come from it.
  """
  return load_params(pretrained_path, init_params=init_params,
                     model_config=model_config, new_head=True,
                     new_grid=new_grid, old_grid=old_grid,
                     resize_method=resize_method)
