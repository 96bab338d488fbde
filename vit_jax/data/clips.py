"""Clips as files hold them, and the windows a video model sees of them.

A clip is a folder of frames (image files, in name order), an animated
image (GIF, WebP, APNG: PIL reads them), or a video file (`.mp4`, `.webm`,
...: read with PyAV, `pip install av`). `test_offsets` places the test's
views in time, as the video evaluator does (`vit_jax/evaluators/video.py`).
No TensorFlow here: `vit_jax.predict` reads clips with it.
"""

from typing import List

from etils import epath
import numpy as np
from PIL import Image
from PIL import ImageSequence

# Read with PyAV; PIL reads the animated images (and every frame file).
VIDEO_EXTENSIONS = frozenset(
    ('.mp4', '.m4v', '.mov', '.avi', '.mkv', '.webm', '.mpg', '.mpeg'))
IMAGE_EXTENSIONS = frozenset(
    ext for ext, kind in Image.registered_extensions().items()
    if kind in Image.OPEN)


def last_offset(length: int, frames: int, stride: int) -> int:
  """The latest start of a window of `frames` frames `stride` apart in a
  clip of `length` frames."""
  if frames < 1 or stride < 1:
    raise ValueError(f'config.video.frames={frames}, stride={stride}: both '
                     'must be at least 1.')
  last = length - (frames - 1) * stride - 1
  if last < 0:
    raise ValueError(
        f'config.video.frames={frames} at stride {stride} spans '
        f'{(frames - 1) * stride + 1} frames; the clips have {length}. Take '
        'fewer frames or a smaller stride.')
  return last


def test_offsets(length: int, frames: int, stride: int,
                 views: int) -> np.ndarray:
  """The starts of `views` windows spaced evenly over the clip: the first
  starts at frame 0 and the last ends at the clip's last frame (rounded to
  the nearest frame, numpy's half to even); one view is the centre one."""
  last = last_offset(length, frames, stride)
  if views < 1:
    raise ValueError(f'{views} test views: expected at least 1.')
  if views == 1:
    return np.array([last // 2])
  return np.rint(np.linspace(0, last, views)).astype(np.int32)


def is_clip(path) -> bool:
  """Whether `path` is a clip: a folder, a video file or an image of more
  than one frame."""
  path = epath.Path(path)
  if path.is_dir() or path.suffix.lower() in VIDEO_EXTENSIONS:
    return True
  try:
    with Image.open(path) as image:
      return getattr(image, 'n_frames', 1) > 1
  except (OSError, ValueError):
    return False


def read_frames(path) -> List[Image.Image]:
  """The RGB frames of the clip at `path`; a ValueError (naming it) for a
  file that is no clip, and where a video file needs PyAV."""
  path = epath.Path(path)
  if not path.exists():
    raise ValueError(f'{path}: no such file or folder.')
  if path.is_dir():
    names = sorted(p for p in path.iterdir()
                   if p.suffix.lower() in IMAGE_EXTENSIONS)
    if not names:
      raise ValueError(f'{path}: no image files in the folder.')
    return [Image.open(p).convert('RGB') for p in names]
  if path.suffix.lower() in VIDEO_EXTENSIONS:
    return _video_frames(path)
  try:
    with Image.open(path) as image:
      frames = [f.convert('RGB') for f in ImageSequence.Iterator(image)]
  except (OSError, ValueError) as e:
    raise ValueError(f'{path} is neither a video nor an image that PIL can '
                     f'decode: {e}') from e
  if len(frames) < 2:
    raise ValueError(f'{path} is a still image, not a clip: give a video '
                     'file, an animated image or a folder of its frames.')
  return frames


def _video_frames(path) -> List[Image.Image]:
  try:
    import av  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(f'{path}: reading {path.suffix} files needs PyAV (pip '
                     'install av); or give a folder of its frames.') from None
  try:
    with av.open(str(path)) as container:
      return [frame.to_image().convert('RGB')
              for frame in container.decode(video=0)]
  except (av.FFmpegError, ValueError) as e:
    raise ValueError(f'{path} cannot be decoded as a video: {e}') from e
