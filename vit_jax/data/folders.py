"""Image folders (`config.dataset` a folder of {train,test}/<class>/<image>):
their files that are no images, named.

TensorFlow's decoder stops a run on such a file with an error that names
no file. A run on a folder names it instead (`bad_file_error`, called when
decoding fails), or, with `config.skip_bad_images`, leaves every such file
out before it starts (`without_bad_files`) and says how many.
"""

import sys
from typing import Dict, List

from PIL import Image
import tensorflow_datasets as tfds


def decodes(path: str) -> bool:
  """Whether PIL reads `path` as an image, whole."""
  try:
    with Image.open(path) as image:
      image.load()
    return True
  except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
    return False


def _examples(builder: tfds.ImageFolder) -> Dict[str, list]:
  return builder._split_examples  # pylint: disable=protected-access


def bad_files(builder: tfds.ImageFolder) -> Dict[str, List[str]]:
  """{split: the paths of its files that are no images}."""
  return {split: [e.image_path for e in examples
                  if not decodes(e.image_path)]
          for split, examples in _examples(builder).items()}


def bad_file_error(builder: tfds.ImageFolder) -> ValueError:
  """The error that names the folder's first file that is no image; None
  if every file decodes (the failure was another)."""
  bad = sorted(p for paths in bad_files(builder).values() for p in paths)
  if not bad:
    return None
  more = f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''
  return ValueError(f'{bad[0]} is not an image that can be decoded{more}: '
                    'remove it, or pass --config.skip_bad_images=True to '
                    'leave such files out.')


def without_bad_files(builder: tfds.ImageFolder) -> tfds.ImageFolder:
  """`builder` without the files that are no images, its splits' sizes
  counted again; a note says how many were left out."""
  bad = bad_files(builder)
  count = sum(len(paths) for paths in bad.values())
  if not count:
    return builder
  kept = {split: [e for e in examples if e.image_path not in bad[split]]
          for split, examples in _examples(builder).items()}
  builder._split_examples = kept  # pylint: disable=protected-access
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[len(examples)],
                          num_bytes=0)
      for split, examples in kept.items()]))
  first = sorted(p for paths in bad.values() for p in paths)[0]
  note = (f'Note: skipped {count} file(s) of {builder.data_dir} that are no '
          f'images (the first: {first}).')
  if note not in _SAID:  # a run reads its folder more than once
    _SAID.add(note)
    print(note, file=sys.stderr, flush=True)
  return builder


_SAID = set()
