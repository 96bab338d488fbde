"""How a checkpoint's source prepares an image for evaluation.

`convert` records the source's eval transform beside the `.npz` it writes,
in `<name>.transform.json`, with timm's `pretrained_cfg` keys:
`input_size` ([3, H, W]), `crop_pct`, `interpolation`, `mean`, `std` and
`crop_mode`; `model`: overrides of the preset's model config, such as
{"transformer": {"gelu_approximate": false}}; `model_name`: the preset;
`posemb_resize`: how the position table is resized, where it is not the
family's way (`posemb_resize.RESIZE_METHODS`); `vocab`: a two-tower
model's tokenizer file, beside it; `max_num_patches`: a NaFlex tower's
patch budget (SigLIP 2's processor), whose square image `input_size` is.
`predict` reads it back by default.

`prepare(file, transform)` prepares an image with timm's meaning: PIL decodes
it to RGB, then resizes and center-crops it as timm's eval transform does on
a PIL image (torchvision's `Resize` is PIL's `resize` with the same filter,
`CenterCrop` rounds the offset with `round`), and normalizes it as
`ToTensor` and `Normalize` do, channels last. Without a record the transform
is the original release's (`GOOGLE`).
"""

import dataclasses
import io
import json
import math
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple
import warnings

from absl import flags
from etils import epath
import numpy as np
from PIL import Image

from vit_jax import cli
from vit_jax.checkpoints import files
from vit_jax.checkpoints import record

TRANSFORM_KEYS = ('input_size', 'crop_pct', 'interpolation', 'mean', 'std',
                  'crop_mode', 'model', 'model_name', 'posemb_resize',
                  'vocab', 'max_num_patches', 'num_frames', 'frame_stride',
                  'test_views', 'dpt')
# A record's keys that say nothing of the image transform.
MODEL_KEYS = ('model', 'model_name', 'posemb_resize', 'vocab', 'dpt')

# PIL's default `Image.MAX_IMAGE_PIXELS`: 1/4 GiB of RGB pixels once decoded.
MAX_PIXELS = 89_478_485

# timm's names of PIL's filters (timm.data.transforms.str_to_pil_interp).
INTERPOLATIONS = {
    'nearest': Image.Resampling.NEAREST,
    'bilinear': Image.Resampling.BILINEAR,
    'bicubic': Image.Resampling.BICUBIC,
    'box': Image.Resampling.BOX,
    'hamming': Image.Resampling.HAMMING,
    'lanczos': Image.Resampling.LANCZOS,
}
CROP_MODES = ('center', 'squash', 'border')
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# timm's `resolve_data_config` defaults, for the keys a record leaves out.
TIMM_DEFAULTS = dict(crop_pct=0.875, crop_mode='center',
                     interpolation='bicubic', mean=IMAGENET_MEAN,
                     std=IMAGENET_STD)
# The original release evaluates with `tf.image.resize(im, [size, size])`
# (bilinear, the whole image, aspect lost) and (im - 127.5) / 127.5; its
# notebook feeds an image of the model's size as x / 128 - 1.
GOOGLE = dict(crop_pct=1.0, crop_mode='squash', interpolation='bilinear',
              mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


def _channels(name, values) -> Tuple[float, float, float]:
  values = tuple(float(v) for v in np.atleast_1d(values))
  if len(values) == 1:
    values *= 3
  if len(values) != 3:
    raise ValueError(f'{name} has {len(values)} values; give 1 or 3 (RGB).')
  return values


@dataclasses.dataclass(frozen=True)
class Transform:
  """An eval transform, with timm's meaning.

  Attributes:
    size: the side of the square the model sees, or its (height, width)
      (a NaFlex tower's any; as timm, both sides are then resized to
      floor(side / crop_pct) and center-cropped, whatever the crop_mode but
      'border', which needs a square).
    crop_pct: the crop's share of the resized image, which is
      floor(size / crop_pct) on the short side ('center'), on both sides
      ('squash', aspect lost) or on the long side ('border', padded with the
      mean); then the central `size` x `size`.
    crop_mode: 'center', 'squash' or 'border'.
    interpolation: PIL's filter, by timm's name (`INTERPOLATIONS`).
    mean: per channel (RGB), of pixels in [0, 1].
    std: per channel (RGB), of pixels in [0, 1].
  """
  size: int
  crop_pct: float = 1.0
  crop_mode: str = 'squash'
  interpolation: str = 'bilinear'
  mean: Sequence[float] = (0.5, 0.5, 0.5)
  std: Sequence[float] = (0.5, 0.5, 0.5)

  def __post_init__(self):
    sides = tuple(self.size) if np.ndim(self.size) else (self.size,)
    if len(sides) not in (1, 2) or any(
        int(v) != v or v < 1 for v in sides):
      raise ValueError(f'The image size must be a positive integer or a '
                       f'(height, width) of them, not {self.size!r}.')
    sides = tuple(int(v) for v in sides)
    object.__setattr__(self, 'size', sides[0] if len(set(sides)) == 1
                       else sides)
    if self.crop_mode == 'border' and self.hw[0] != self.hw[1]:
      raise ValueError(f"crop_mode='border' needs a square size, not "
                       f'{self.hw[0]} x {self.hw[1]}.')
    if not 0 < self.crop_pct <= 4:
      raise ValueError(f'crop_pct must be in (0, 4], not {self.crop_pct}.')
    if self.crop_mode not in CROP_MODES:
      raise ValueError(cli.closest(self.crop_mode, CROP_MODES, 'crop_mode'))
    if self.interpolation not in INTERPOLATIONS:
      raise ValueError(cli.closest(self.interpolation, INTERPOLATIONS,
                                   'interpolation'))
    object.__setattr__(self, 'mean', _channels('mean', self.mean))
    object.__setattr__(self, 'std', _channels('std', self.std))
    if min(self.std) <= 0:
      raise ValueError(f'std must be positive, not {self.std}.')

  @property
  def hw(self) -> Tuple[int, int]:
    """(height, width) that the model sees."""
    return self.size if isinstance(self.size, tuple) else (self.size,) * 2

  @property
  def scale_size(self):
    """The resized side (sides) that the crop is taken from (timm's
    rounding)."""
    if isinstance(self.size, tuple):
      return tuple(math.floor(v / self.crop_pct) for v in self.size)
    return math.floor(self.size / self.crop_pct)

  def describe(self) -> str:
    """What `prepare` does, in words."""
    s, how = self.scale_size, f'({self.interpolation})'
    if isinstance(s, tuple):
      crop = (f', center crop {self.hw[0]} x {self.hw[1]}'
              if s != self.hw else '')
      return (f'resize to {s[0]} x {s[1]} {how}{crop}, mean {self.mean}, '
              f'std {self.std}')
    steps = {
        'center': f'resize short side to {s} {how}, center crop {self.size}',
        'squash': f'resize to {s} x {s} {how}' + (
            f', center crop {self.size}' if s != self.size else ''),
        'border': f'resize long side to {s} {how}, pad with the mean and '
                  f'center crop {self.size}',
    }[self.crop_mode]
    return f'{steps}, mean {self.mean}, std {self.std}'


def recorded_size(recorded: Optional[Mapping[str, Any]]) -> Optional[int]:
  """The side of a record's square `input_size`, or None without one."""
  if not recorded or 'input_size' not in recorded:
    return None
  height, width = recorded['input_size'][-2:]
  if height != width:
    raise ValueError(f'The recorded input_size {height} x {width} is not '
                     'square: give the image size.')
  return int(height)


def resolve(size: int, recorded: Optional[Mapping[str, Any]] = None,
            normalization=None, **overrides) -> Transform:
  """The transform at `size`: `overrides` that are not None, over the
  record's keys, over timm's defaults (with a recorded transform) or
  `GOOGLE` (none: no record, or one of model settings only). A `crop_pct`
  given without a `crop_mode` that anything names means timm's center crop:
  the original release's squash has no crop."""
  recorded = recorded or {}
  timm = any(k not in MODEL_KEYS for k in recorded)
  fields = dict(TIMM_DEFAULTS if timm else GOOGLE)
  if not timm and normalization:  # the preset's, when nothing is recorded
    fields.update(mean=normalization[0], std=normalization[1])
  fields.update({k: recorded[k] for k in fields if k in recorded})
  overrides = {k: v for k, v in overrides.items() if v is not None}
  if 'crop_pct' in overrides and 'crop_mode' not in {*overrides, *recorded}:
    fields['crop_mode'] = 'center'
  fields.update(overrides)
  return Transform(size=size, **fields)


# Model configs amended by a record (`checkpoints/record.py`).
merged = record.merged
model_overrides = record.model_overrides
recorded_normalization = record.recorded_normalization


def model_config(preset, recorded: Optional[Mapping[str, Any]] = None):
  """The preset's model config, as a dict, with the record's `model`
  overrides merged in (`merged`)."""
  config = preset.to_dict() if hasattr(preset, 'to_dict') else dict(preset)
  return merged(config, (recorded or {}).get('model') or {})




def preset_settings(name: Optional[str], recorded=None, *,
                    source: str = 'the checkpoint'):
  """(model config dict, (mean, std)) of preset `name` (else the recorded
  model: a preset or a custom model) as a checkpoint's `recorded`
  transform amends it: its model overrides, its normalization."""
  name, model = record.settings(recorded, name, source=source)
  return model, record.normalization(recorded, name)


# Reading and preparing images.


def _read(source) -> Tuple[str, bytes]:
  """(name for messages, bytes) of a path or of the file's bytes."""
  if isinstance(source, (bytes, bytearray, memoryview)):
    return 'The image', bytes(source)
  path = epath.Path(source)
  if not path.exists():
    raise FileNotFoundError(f'{source}: no such file.')
  if path.is_dir():
    raise IsADirectoryError(f'{source} is a directory, not an image.')
  return os.fspath(source), path.read_bytes()


def decode(source, max_pixels: int = MAX_PIXELS) -> Image.Image:
  """The RGB image at `source` (a path or the file's bytes); refused from its
  header, before decoding, if it has more than `max_pixels` pixels."""
  name, data = _read(source)
  with warnings.catch_warnings():
    # PIL warns above its own limit, which `max_pixels` replaces here; it
    # still refuses, while opening, images over twice that.
    warnings.simplefilter('ignore', Image.DecompressionBombWarning)
    try:
      image = Image.open(io.BytesIO(data))  # reads the header only
    except Image.DecompressionBombError as e:
      raise ValueError(f'{name} is over the limit of {max_pixels:,} pixels: '
                       f'downscale it first. PIL: {e}') from e
    except Image.UnidentifiedImageError as e:
      raise ValueError(f'{name} is not an image that PIL can decode.') from e
    width, height = image.size
    if width * height > max_pixels:
      raise ValueError(f'{name} is {width} x {height} pixels, over the limit '
                       f'of {max_pixels:,}: downscale it first.')
    try:
      return image.convert('RGB')
    except OSError as e:  # truncated or corrupt data
      raise ValueError(f'{name} cannot be decoded: {e}') from e


def _resized_size(width: int, height: int, t: Transform) -> Tuple[int, int]:
  """(width, height) before the crop, rounded as timm's eval transform."""
  s = t.scale_size
  if isinstance(s, tuple):  # (height, width): timm's Resize of a pair
    return s[1], s[0]
  if t.crop_mode == 'squash':
    return s, s
  if t.crop_mode == 'center':  # torchvision's Resize(s): long side truncated
    return (s, int(s * height / width)) if width <= height else (
        int(s * width / height), s)
  ratio = max(width / s, height / s)  # timm's ResizeKeepRatio(longest=1)
  return round(width / ratio), round(height / ratio)


def _center_crop(image: Image.Image, hw: Tuple[int, int],
                 fill) -> Image.Image:
  """torchvision's CenterCrop to (height, width) `hw`: pads a side shorter
  than its size with `fill` ((size - side) // 2 before), then crops at
  round((side - size) / 2)."""
  def offset(side, size):
    return -((size - side) // 2) if side < size else int(
        round((side - size) / 2.0))

  width, height = image.size
  out = Image.new('RGB', (hw[1], hw[0]), fill)
  out.paste(image, (-offset(width, hw[1]), -offset(height, hw[0])))
  return out


def prepare(source, transform: Transform,
            max_pixels: int = MAX_PIXELS) -> np.ndarray:
  """The image at `source` (a path or the file's bytes) as the model sees
  it: (height, width, 3) float32, normalized by the transform's mean and
  std."""
  return apply(decode(source, max_pixels), transform)


def apply(image: Image.Image, transform: Transform) -> np.ndarray:
  """An RGB image (a video's frame, say) as `prepare` makes it."""
  size = _resized_size(*image.size, transform)
  if size != image.size:
    image = image.resize(size, INTERPOLATIONS[transform.interpolation])
  fill = (tuple(round(255 * v) for v in transform.mean)
          if transform.crop_mode == 'border' else (0, 0, 0))
  image = _center_crop(image, transform.hw, fill)
  # As ToTensor and Normalize: float32 / 255, then (x - mean) / std.
  pixels = np.asarray(image, np.float32) / np.float32(255)
  return ((pixels - np.float32(transform.mean)) /
          np.float32(transform.std)).astype(np.float32)


# The command-line flags of the transform, for the tools that prepare images.


def define_flags() -> None:
  """--crop_pct, --crop_mode, --interpolation, --mean and --std."""
  flags.DEFINE_float('crop_pct', None, 'Crop share of the resized image '
                     "(default: the checkpoint's transform.json, else 1).")
  flags.DEFINE_enum('crop_mode', None, CROP_MODES,
                    'center: short side resized, edges cut; squash: both '
                    'sides resized; border: long side resized, padded.')
  flags.DEFINE_enum('interpolation', None, list(INTERPOLATIONS),
                    "PIL's filter for the resize.")
  flags.DEFINE_list('mean', None, 'Per-channel mean of pixels in [0, 1], e.g. '
                    '0.485,0.456,0.406 (ImageNet) or 0.5 (Google).')
  flags.DEFINE_list('std', None, 'Per-channel std, e.g. 0.229,0.224,0.225 '
                    '(ImageNet) or 0.5 (Google).')


def flag_overrides() -> Dict[str, Any]:
  """The transform flags that were given, by field name."""
  given = {}
  for name in ('crop_pct', 'crop_mode', 'interpolation', 'mean', 'std'):
    value = flags.FLAGS[name].value
    if value is None:
      continue
    if name in ('mean', 'std'):
      try:
        value = [float(v) for v in value]
      except ValueError as e:
        raise ValueError(f'--{name}: {e}') from e
    given[name] = value
  return given


def summary(transform: Transform, record_path: Optional[str],
            overridden: Sequence[str] = ()) -> str:
  """'Preprocessing: ... [where the settings come from]', for stderr."""
  if record_path:
    source = f'from {epath.Path(record_path).name}'
  else:
    source = "the original release's: no .transform.json beside the checkpoint"
  if overridden:
    source += '; ' + ', '.join(f'--{k}' for k in overridden) + ' given'
  return f'Preprocessing: {transform.describe()} [{source}]'


# The record beside a checkpoint.


beside = files.beside  # `<name>.<suffix>` beside `<name>.npz`


def transform_path(npz_path) -> epath.Path:
  """`<name>.transform.json` beside `<name>.npz`."""
  return beside(npz_path, 'transform.json')


def save_transform(npz_path, transform: Dict[str, Any]) -> None:
  """Writes the `TRANSFORM_KEYS` of `transform` beside `npz_path`."""
  kept = {k: transform[k] for k in TRANSFORM_KEYS if k in transform}
  transform_path(npz_path).write_text(json.dumps(kept, indent=1) + '\n')


def load_transform(npz_path) -> Optional[Dict[str, Any]]:
  """The transform recorded beside `npz_path`, or None if there is none."""
  return files.read_record(npz_path)
