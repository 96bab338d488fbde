r"""Top-k classes of images, from a checkpoint (.npz or training workdir).

  python -m vit_jax.predict --model_name=ViT-B_16 --checkpoint=ViT-B_16.npz \
      cat.jpg dog.png

Images are prepared as the checkpoint's source evaluates (`preprocess`):
by the `<name>.transform.json` beside the checkpoint that `convert` writes
from timm's `pretrained_cfg` (e.g. short side to 248, bicubic, center crop
224, ImageNet mean and std), else as the original release does (the whole
image resized to the square, bilinear, to [-1, 1]); `--crop_pct`,
`--crop_mode`, `--interpolation`, `--mean` and `--std` override either, and
stderr says which applied. The side is `--size`, else the record's, else
the one that the checkpoint's position table implies; the table is resized
to any other. A NaFlex model (SigLIP 2's, `posemb_grid`) takes
`--max_num_patches=N` instead: each image resized, its aspect kept, to at
most N patches (SigLIP 2's processor), normalized by the transform's mean
and std. Class names: ImageNet-1k or -21k for heads of 1,000 or 21,843
classes, `--labels=FILE` (one name per line) for others, else class indices.

`--task=depth` takes a depth model (a converted Depth Anything or DPT,
whose record holds `dpt`) and writes, per image, into `--output_dir`:
`<stem>.npy`, the model's depth (H, W) at the transform's side (raw:
relative inverse depth for Depth Anything and DPT), and `<stem>.png`, that
map scaled to 0-255 per image (its minimum black, its maximum white).

  python -m vit_jax.predict --task=depth --checkpoint=depth_anything.npz \
      --output_dir=depth room.jpg
"""

import os
import sys
from typing import Tuple

from absl import app
from absl import flags
from etils import epath
import jax
import numpy as np
from PIL import Image

from vit_jax.checkpoints import loading
from vit_jax import cli
from vit_jax import pretrained
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.data import clips
from vit_jax.data import packing
from vit_jax.models import lit
from vit_jax.models import registry

FLAGS = flags.FLAGS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'data')
LABEL_FILES = {1000: 'imagenet2012_labels.txt',
               21843: 'imagenet21k_labels.txt'}


# The side that a checkpoint's position table implies; here for callers of
# the command line's functions.
image_size = loading.image_size


def load_classifier(model_name, path, size=None, recorded=None):
  """(model, params, image side) for the checkpoint at `path`: preset
  `model_name`, else the model its `recorded` transform names, with the
  record's `model` settings."""
  if model_name and model_name not in registry.MODEL_CONFIGS:
    raise ValueError(cli.closest(model_name, registry.MODEL_CONFIGS, 'model'))
  config, _ = transform.preset_settings(model_name, recorded, source=path)
  name = config.get('model_name') or ''
  if registry.model_class(name, config) is lit.LitModel:
    raise ValueError(f'{path} is a two-tower model ({name}): it has no '
                     "classes to predict; evaluate it with trainer='zeroshot'.")
  if registry.takes_clips(name, config):
    model, params, size, _ = loading.load_video_model(
        config, path, size, (recorded or {}).get('num_frames'))
  else:
    model, params, size = loading.load_model(config, path, size)
  if not model.num_classes:
    raise ValueError(f'{path} has no `head`: it cannot classify.')
  return model, params, size


def read_image(path, spec):
  """The image at `path` as the model sees it, by a `transform.Transform`
  or, for a side, the original release's preprocessing at that side."""
  if not isinstance(spec, transform.Transform):
    spec = transform.resolve(spec)
  return transform.prepare(path, spec)


def check_max_num_patches(max_patches, size=None):
  """--max_num_patches's value, checked before anything loads."""
  if max_patches is None:
    return
  if max_patches < 1:
    raise ValueError(f'--max_num_patches={max_patches}: give a positive '
                     'number of patches.')
  if size:
    raise ValueError('--max_num_patches sizes each image itself; give no '
                     '--size.')


def naflex_patch(model, path) -> int:
  """The patch side of a model whose table is resized to each image's
  grid (a NaFlex tower's `posemb_grid`), which --max_num_patches needs."""
  if getattr(model, 'posemb_grid', None) is None:
    raise ValueError(f'--max_num_patches: {path} is no NaFlex model (its '
                     'position table is not resized to each image: '
                     'posemb_grid); give --size instead.')
  return int(model.patches['size'][0])


def naflex_image(source, spec, patch: int, max_patches: int) -> np.ndarray:
  """The image as SigLIP 2's NaFlex processor sizes it: aspect kept, at
  most `max_patches` patches (`packing.naflex_grid`), resized bilinearly
  (`packing.resize`), then normalized by `spec`'s mean and std."""
  image = np.asarray(transform.decode(source))
  rows, cols = packing.naflex_grid(*image.shape[:2], patch, max_patches)
  pixels = packing.resize(image, rows * patch, cols * patch).astype(
      np.float32) / np.float32(255)
  return ((pixels - np.float32(spec.mean)) / np.float32(spec.std)).astype(
      np.float32)


def naflex_summary(spec, patch: int, max_patches: int) -> str:
  return (f'Transform: NaFlex, each image resized (bilinear, aspect kept) to '
          f'at most {max_patches} patches of {patch} px; mean {spec.mean}, '
          f'std {spec.std}.')


def _flag(name):
  """A flag of the command line's (None where it is not defined)."""
  return getattr(FLAGS, name) if name in FLAGS else None


def clip_views(recorded, frames_in_clip=None):
  """(frames, stride, views) of a video model's test: the flags', else the
  record's (`num_frames`, `frame_stride`, `test_views`); without a stride,
  one that spreads the window over the whole clip of `frames_in_clip`."""
  recorded = recorded or {}
  frames = _flag('frames') or recorded.get('num_frames')
  if not frames:
    raise ValueError('The checkpoint records no frames per clip: give '
                     '--frames.')
  stride = _flag('frame_stride') or recorded.get('frame_stride')
  if not stride and frames_in_clip:
    stride = max(1, (frames_in_clip - 1) // max(1, frames - 1))
  return int(frames), stride, int(_flag('views') or recorded.get(
      'test_views') or 1)


def read_clip(path, spec, recorded) -> np.ndarray:
  """The clip at `path` as the video evaluator's views: (views, frames,
  height, width, 3), each frame by `spec`."""
  frames = clips.read_frames(path)
  count, stride, views = clip_views(recorded, len(frames))
  offsets = clips.test_offsets(len(frames), count, stride, views)
  prepared = {}
  def frame(i):
    if i not in prepared:
      prepared[i] = transform.apply(frames[i], spec)
    return prepared[i]
  return np.stack([np.stack([frame(int(o) + stride * t) for t in range(count)])
                   for o in offsets])


def class_names(num_classes, labels_path=None):
  """Names of the classes, from `labels_path` or the shipped ImageNet lists."""
  if labels_path is None and num_classes in LABEL_FILES:
    labels_path = os.path.join(DATA, LABEL_FILES[num_classes])
  if labels_path is None:
    return [str(i) for i in range(num_classes)]
  lines = epath.Path(labels_path).read_text().splitlines()
  names = [line.strip() for line in lines if line.strip()]
  if len(names) != num_classes:
    raise ValueError(f'{labels_path} names {len(names)} classes, but the '
                     f'head has {num_classes}.')
  return names


def predict(model, params, images):
  """Class probabilities (softmax) of a batch of preprocessed images; of
  clips' views (each (views, frames, H, W, 3)), of their mean logits, as
  the video evaluator scores a clip."""
  images = np.stack(images)
  logits = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False))(
      params, images.reshape(-1, *images.shape[-4:]) if images.ndim == 6
      else images)
  if images.ndim == 6:
    logits = logits.reshape(*images.shape[:2], -1).mean(1)
  return np.asarray(jax.nn.softmax(logits.astype(np.float32)))


def transform_for(path, recorded, size, model_name=''):
  """The transform of the checkpoint's record (else the preset's
  normalization) and the flags, said on stderr."""
  overrides = transform.flag_overrides()
  spec = transform.resolve(
      size, recorded, registry.input_normalization(model_name),
      **overrides)
  record_path = transform.transform_path(path) if recorded else None
  print(transform.summary(spec, record_path, list(overrides)),
        file=sys.stderr, flush=True)
  return spec


def depth_png(depth: np.ndarray) -> np.ndarray:
  """A depth map as 8-bit gray: its minimum 0, its maximum 255 (all 0 for
  a constant map)."""
  low, high = float(depth.min()), float(depth.max())
  scaled = (depth - low) / (high - low) if high > low else 0 * depth
  return np.round(scaled * 255).astype(np.uint8)


def write_depth(folder, path, depth) -> Tuple[str, str]:
  """`<stem>.npy` (the raw map) and `<stem>.png` (`depth_png`) of the
  image at `path`, in `folder`."""
  stem = os.path.join(folder, os.path.splitext(os.path.basename(
      os.path.normpath(path)))[0])
  depth = np.asarray(depth, np.float32)
  np.save(stem + '.npy', depth)
  Image.fromarray(depth_png(depth)).save(stem + '.png')
  return stem + '.npy', stem + '.png'


def predict_depth(paths, checkpoint, recorded, size, output_dir) -> int:
  """--task=depth: each image's depth map into `output_dir`."""
  if 'dpt' not in (recorded or {}):
    raise ValueError(f'{checkpoint} is not a depth model (its record has no '
                     '`dpt`): convert a DepthAnythingForDepthEstimation or '
                     'DPTForDepthEstimation.')
  found = pretrained.from_pretrained(checkpoint, image_size=size)
  spec = transform_for(checkpoint, recorded, found.transform.size)
  run = jax.jit(lambda p, x: found.model.apply({'params': p}, x))
  os.makedirs(output_dir, exist_ok=True)
  failed = 0
  for path in paths:
    try:
      image = transform.prepare(path, spec)
    except (OSError, ValueError) as e:
      print(f'Error: {e}' if path in str(e) else f'Error: {path}: {e}',
            file=sys.stderr)
      failed += 1
      continue
    depth = np.asarray(run(found.params, image[None]))[0]
    npy, png = write_depth(output_dir, path, depth)
    print(f'{path}: {npy} {png} (depth {depth.min():.4g} to '
          f'{depth.max():.4g})')
  return 1 if failed else 0


def main(argv):
  paths = argv[1:]
  if not paths:
    raise app.UsageError('Give one or more image files.')
  if FLAGS.task == 'depth' and not FLAGS.output_dir:
    raise ValueError('--task=depth writes its maps into --output_dir: give '
                     'one.')
  max_patches = FLAGS.max_num_patches
  check_max_num_patches(max_patches, FLAGS.size)
  checkpoint, recorded = converter.checkpoint_and_record(FLAGS.checkpoint)
  if FLAGS.task == 'depth':
    return predict_depth(paths, checkpoint, recorded,
                         FLAGS.size or transform.recorded_size(recorded),
                         FLAGS.output_dir)
  if 'dpt' in (recorded or {}):
    raise ValueError(f'{checkpoint} is a depth model: give --task=depth and '
                     '--output_dir.')
  model, params, size = load_classifier(
      FLAGS.model_name, checkpoint,
      FLAGS.size or transform.recorded_size(recorded), recorded)
  model_name = FLAGS.model_name or (recorded or {}).get('model_name', '')
  if max_patches:
    patch = naflex_patch(model, checkpoint)
    spec = transform.resolve(size, recorded,
                             registry.input_normalization(model_name),
                             **transform.flag_overrides())
    print(naflex_summary(spec, patch, max_patches), file=sys.stderr)
    prepare = lambda path: naflex_image(path, spec, patch, max_patches)
  else:
    spec = transform_for(checkpoint, recorded, size, model_name)
    prepare = lambda path: transform.prepare(path, spec)
  if getattr(model, 'TAKES_CLIPS', False):
    frames, stride, views = clip_views(recorded)
    gap = f'{stride} apart' if stride else 'spread over the clip'
    print(f'Clips: {views} view(s) of {frames} frames {gap}; their logits '
          'averaged.', file=sys.stderr)
    prepare = lambda path: read_clip(path, spec, recorded)
  elif any(clips.is_clip(path) for path in paths):
    clip = next(path for path in paths if clips.is_clip(path))
    raise ValueError(f'{clip} is a clip, and {checkpoint} an image model: '
                     'give images.')
  names = class_names(params['head']['kernel'].shape[-1], FLAGS.labels)
  images, good = [], []
  for path in paths:
    try:
      images.append(prepare(path))
      good.append(path)
    except (OSError, ValueError) as e:
      print(f'Error: {e}' if path in str(e) else f'Error: {path}: {e}',
            file=sys.stderr)
  if good:
    # NaFlex: each image at its own grid, one at a time.
    probs = (np.concatenate([predict(model, params, [x]) for x in images])
             if max_patches else predict(model, params, images))
    for path, probs in zip(good, probs):
      print(f'{path}:')
      for i in np.argsort(-probs)[:FLAGS.top_k]:
        print(f'  {probs[i]:.4f}  {names[i]}')
  return 0 if len(good) == len(paths) else 1


if __name__ == '__main__':
  # Defined here, not on import, so that other modules may define theirs.
  flags.DEFINE_string('model_name', None, 'Preset, e.g. ViT-B_16 (default: '
                      "the one the checkpoint's record names).")
  flags.DEFINE_string('checkpoint', None, 'The .npz file or workdir, or a '
                      'timm or transformers folder, file or hub name.')
  flags.DEFINE_enum('task', 'classify', ['classify', 'depth'],
                    "classify: top-k classes; depth: a depth model's maps, "
                    'as .npy and .png, into --output_dir.')
  flags.DEFINE_string('output_dir', None, '--task=depth: the folder of the '
                      'maps (made if absent).')
  flags.DEFINE_string('labels', None, 'Class names, one per line.')
  flags.DEFINE_integer('size', None, 'Image side (default: the recorded '
                       "transform's, else the checkpoint's).")
  flags.DEFINE_integer('top_k', 5, 'Classes printed per image.')
  flags.DEFINE_integer('max_num_patches', None, 'NaFlex models: each image '
                       'resized, aspect kept, to at most this many patches '
                       "(SigLIP 2's processor), instead of --size.")
  flags.DEFINE_integer('frames', None, 'Video models: frames per view '
                       "(default: the record's num_frames).")
  flags.DEFINE_integer('frame_stride', None, 'Video models: frames between '
                       "a view's frames (default: the record's, else spread "
                       'over the clip).')
  flags.DEFINE_integer('views', None, 'Video models: windows per clip, '
                       "spaced evenly (default: the record's test_views, "
                       'else 1).')
  transform.define_flags()
  flags.mark_flags_as_required(['checkpoint'])
  cli.run(main)
