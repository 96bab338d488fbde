r"""Features of images from a checkpoint, in an .npz: the outputs of chosen
blocks as patch maps or tokens, or the model's pooled features.

  python -m vit_jax.features --checkpoint=DINOv2-S_14.npz photos/ \
      --out=feats.npz
  python -m vit_jax.features --checkpoint=facebook/dinov2-small \
      --indices=0,5,-1 --output_fmt=NLC --norm --prefix_tokens cat.jpg \
      --out=feats.npz
  python -m vit_jax.features --model_name=ViT-B_16 --checkpoint=ViT-B_16.npz \
      --output_fmt=pooled --tfds=cifar10:test[:1000] --out=cifar10.npz

Inputs are image files, folders (every image file under them, sorted) and
the images of a tfds split (`--tfds=NAME:SPLIT`, named `NAME:SPLIT/INDEX`).
The checkpoint, `--model_name`, `--size` and the transform flags work as in
`predict`, whose eval transform prepares every image; a head is not needed.
A NaFlex model takes `--max_num_patches=N` (as `predict`), with
`--output_fmt=pooled`. `--indices`: n, the last n blocks (Swin: stages),
or block indices such as 0,5,-1 (`forward_intermediates`, timm's meaning). The .npz holds a float32
array `block_{i}` per block (i from the first block), `block_{i}_prefix`
(the class and register tokens) with `--prefix_tokens`, or `pooled`: the
model's output without its head, as the few-shot evaluator reads it; and
`names`, the images' paths as given.
"""

import itertools
import sys

from absl import flags
from etils import epath
import jax
import ml_collections
import numpy as np
from PIL import Image
import tensorflow_datasets as tfds
import tqdm

from vit_jax import cli
from vit_jax import models
from vit_jax import predict
from vit_jax.checkpoints import storage
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.data import pipeline
from vit_jax.evaluators import common
from vit_jax.models import backbone
from vit_jax.models import intermediates
from vit_jax.models import registry
from vit_jax.platform import sharding

FLAGS = flags.FLAGS
OUTPUT_FORMATS = ('NHWC', 'NLC', 'pooled')
# The files that a folder contributes: those PIL can open, by extension.
IMAGE_EXTENSIONS = frozenset(
    ext for ext, kind in Image.registered_extensions().items()
    if kind in Image.OPEN)


def parse_indices(text: str):
  """An int n (the last n blocks) or a tuple of block indices."""
  try:
    values = tuple(int(v) for v in text.split(','))
  except ValueError:
    raise ValueError(f'--indices={text}: give n, the last n blocks (e.g. 1), '
                     'or block indices (e.g. 0,5,-1).') from None
  return values[0] if len(values) == 1 and values[0] >= 0 else values


def image_files(paths):
  """The files of `paths`: each file as given, each folder's image files
  (`IMAGE_EXTENSIONS`), found recursively and sorted."""
  found = []
  for name in paths:
    path = epath.Path(name)
    if path.is_dir():
      inside = sorted(folder / f for folder, _, names in path.walk()
                      for f in names
                      if epath.Path(f).suffix.lower() in IMAGE_EXTENSIONS)
      if not inside:
        raise FileNotFoundError(f'{name}: no image files in the folder.')
      found += [str(p) for p in inside]
    elif path.exists():
      found.append(name)
    else:
      raise FileNotFoundError(f'{name}: no such file or folder.')
  return found


def tfds_images(spec: str, data_dir):
  """(count, iterator of (name, encoded image)) of `spec`, 'NAME:SPLIT'."""
  name, _, split = spec.partition(':')
  if not name or not split:
    raise ValueError(f'--tfds={spec}: expected NAME:SPLIT, e.g. '
                     'cifar10:test[:100].')
  builder = pipeline.get_builder(ml_collections.ConfigDict(dict(
      dataset=name, tfds_data_dir=data_dir, tfds_manual_dir=None,
      tfds_download=True)))
  try:
    count = builder.info.splits[split].num_examples
  except ValueError as e:  # an unknown split, a slice past its end
    raise ValueError(f'--tfds={spec}: {e}') from None
  if not count:
    raise ValueError(f'--tfds={spec}: the split is empty.')
  examples = tfds.as_numpy(pipeline.read_encoded(builder, split))
  return count, ((f'{spec}/{i}', example['image'])
                 for i, example in enumerate(examples))


def check_flags(paths):
  """What the flags ask, checked before anything loads: (files, block
  indices or None for pooled features)."""
  if not paths and not FLAGS.tfds:
    raise ValueError('Give image files or folders, or --tfds=NAME:SPLIT.')
  out = epath.Path(FLAGS.out)
  if out.suffix != '.npz':
    raise ValueError(f'--out={FLAGS.out}: the file must end in .npz.')
  if not out.parent.is_dir():
    raise FileNotFoundError(f'--out={FLAGS.out}: no folder {out.parent}.')
  indices = parse_indices(FLAGS.indices)
  if FLAGS.output_fmt == 'pooled':
    given = [f'--{k}' for k in ('indices', 'norm', 'prefix_tokens')
             if FLAGS[k].present]
    if given:
      raise ValueError(f'--output_fmt=pooled takes no {", ".join(given)}: '
                       "pooled features are the model's output.")
    indices = None
  predict.check_max_num_patches(FLAGS.max_num_patches, FLAGS.size)
  if FLAGS.max_num_patches and indices is not None:
    raise ValueError('--max_num_patches: images of other grids have other '
                     'block shapes; only --output_fmt=pooled stacks them.')
  return image_files(paths), indices


def load(checkpoint: str):
  """(backbone module, its parameters, the image transform), as `predict`
  reads the checkpoint and says the transform on stderr."""
  path, recorded = converter.checkpoint_and_record(checkpoint)
  loaded = models.from_pretrained(path, model_name=FLAGS.model_name,
                                  image_size=FLAGS.size)
  model_name = FLAGS.model_name or (recorded or {}).get('model_name', '')
  if getattr(loaded.model, 'TAKES_CLIPS', False):
    raise ValueError(f'{path} is a video model ({model_name}): it takes '
                     'clips, not images; its features are forward_'
                     "intermediates' of models.from_pretrained.")
  module, params = backbone.image_encoder(loaded.model, loaded.params)
  if FLAGS.max_num_patches:
    spec = transform.resolve(loaded.transform.size, recorded,
                             registry.input_normalization(model_name),
                             **transform.flag_overrides())
    print(predict.naflex_summary(spec, predict.naflex_patch(module, path),
                                 FLAGS.max_num_patches), file=sys.stderr)
    return module, params, spec
  spec = predict.transform_for(path, recorded, loaded.transform.size,
                               model_name)
  return module, params, spec


def block_indices(module, params, size: int, indices):
  """The blocks (Swin: stages) that `indices` names, counted from the first,
  as the model checks them."""
  image = jax.ShapeDtypeStruct((1, size, size, 3), np.float32)
  every = jax.eval_shape(lambda p, x: module.apply(
      {'params': p}, x, method='forward_intermediates',
      intermediates_only=True), params, image)
  return intermediates.take_indices(len(every), indices)


def feature_fn(module, indices, output_fmt: str, norm: bool, prefix: bool):
  """A jitted (params, images) -> {array name: features}."""
  if indices is None:
    pre_logits = common.pre_logits_fn(module)
    return jax.jit(lambda p, x: {'pooled': pre_logits(p, x)})
  if prefix and not isinstance(module, models.VisionTransformer):
    raise ValueError(f'--prefix_tokens: a {type(module).__name__} has none; '
                     'only a ViT has prefix tokens.')
  extra = dict(return_prefix_tokens=True) if prefix else {}

  def features(params, images):
    taken = module.apply({'params': params}, images,
                         method='forward_intermediates', indices=indices,
                         norm=norm, output_fmt=output_fmt,
                         intermediates_only=True, **extra)
    out = {}
    for i, block in zip(indices, taken):
      if prefix:
        block, out[f'block_{i}_prefix'] = block
      out[f'block_{i}'] = block
    return out

  return jax.jit(features)


def batches(sources, spec, batch_size: int, rows: int):
  """(names, images padded with zeros to `rows`) of `batch_size` sources
  at a time, each prepared by `spec`."""
  sources = iter(sources)
  while chunk := list(itertools.islice(sources, batch_size)):
    images = np.zeros((rows, spec.size, spec.size, 3), np.float32)
    for row, (_, source) in enumerate(chunk):
      images[row] = transform.prepare(source, spec)
    yield [name for name, _ in chunk], images


def run(fn, params, stream, data):
  """(names, numpy float32 features) of each batch of `stream`; each batch
  is dispatched before the previous one's features are fetched, so that
  the next images are prepared while the devices compute."""
  def fetch(names, out):
    return names, jax.tree.map(
        lambda y: np.asarray(y, np.float32)[:len(names)], out)

  pending = None
  for names, images in stream:
    out = names, fn(params, jax.device_put(images, data))
    if pending is not None:
      yield fetch(*pending)
    pending = out
  if pending is not None:
    yield fetch(*pending)


def extract_naflex(fn, params, sources, count: int, spec, patch: int,
                   max_patches: int):
  """`extract`'s arrays with each source at its own NaFlex grid of at most
  `max_patches` patches (`predict.naflex_image`), one at a time."""
  names, outs = [], []
  for name, source in tqdm.tqdm(sources, total=count, unit='image',
                                disable=count < 2):
    image = predict.naflex_image(source, spec, patch, max_patches)
    outs.append(jax.tree.map(lambda y: np.asarray(y, np.float32),
                             fn(params, image[None])))
    names.append(name)
  arrays = {k: np.concatenate([out[k] for out in outs]) for k in outs[0]}
  return dict(arrays, names=np.array(names))


def extract(fn, params, sources, count: int, spec):
  """{array name: features of every source, in order}, with `names`; in
  batches of `--batch_size` sharded over this process's devices."""
  mesh = sharding.make_mesh([('data', -1)], jax.local_devices())
  params = jax.device_put(params, sharding.tree_shardings(params, mesh))
  batch_size = min(FLAGS.batch_size, count)
  # Every batch has the same rows, a multiple of the devices: one program.
  rows = -(-batch_size // mesh.size) * mesh.size
  stream = batches(sources, spec, batch_size, rows)
  names, outs = [], []
  with tqdm.tqdm(total=count, unit='image',
                 disable=count <= batch_size) as bar:
    for batch_names, out in run(fn, params, stream,
                                sharding.batch_sharding(mesh)):
      names += batch_names
      outs.append(out)
      bar.update(len(batch_names))
  arrays = {k: np.concatenate([out[k] for out in outs]) for k in outs[0]}
  return dict(arrays, names=np.array(names))


def main(argv):
  files, indices = check_flags(argv[1:])
  sources, count = [(path, path) for path in files], len(files)
  if FLAGS.tfds:
    tfds_count, examples = tfds_images(FLAGS.tfds, FLAGS.tfds_data_dir)
    sources, count = itertools.chain(sources, examples), count + tfds_count
  module, params, spec = load(FLAGS.checkpoint)
  if indices is not None:
    indices = block_indices(module, params, spec.size, indices)
  fn = feature_fn(module, indices, FLAGS.output_fmt, FLAGS.norm,
                  FLAGS.prefix_tokens)
  if FLAGS.max_num_patches:
    patch = int(module.patches['size'][0])
    arrays = extract_naflex(fn, params, sources, count, spec, patch,
                            FLAGS.max_num_patches)
  else:
    arrays = extract(fn, params, sources, count, spec)
  storage.write_atomic(FLAGS.out, lambda f: np.savez(f, **arrays))
  shapes = ', '.join(f'{k} {v.shape}' for k, v in arrays.items())
  print(f'Features of {count} images: {shapes} in {FLAGS.out}')
  return 0


def define_flags():
  """The command line's flags; `predict`'s, the transform's and these."""
  flags.DEFINE_string('checkpoint', None, 'The .npz file or workdir, or a '
                      'timm or transformers folder, file or hub name.')
  flags.DEFINE_string('model_name', None, 'Preset, e.g. ViT-B_16 (default: '
                      "the one the checkpoint's record names).")
  flags.DEFINE_integer('size', None, 'Image side (default: the recorded '
                       "transform's, else the checkpoint's).")
  flags.DEFINE_string('indices', '1', 'n: the last n blocks; or block '
                      'indices, e.g. 0,5,-1.')
  flags.DEFINE_enum('output_fmt', 'NHWC', OUTPUT_FORMATS,
                    'Patch maps, patch tokens, or the pooled features.')
  flags.DEFINE_bool('norm', False, "Each block's output through the final "
                    "norm (Swin: the last stage's only).")
  flags.DEFINE_bool('prefix_tokens', False, 'Also the class and register '
                    'tokens (ViT), as block_{i}_prefix.')
  flags.DEFINE_integer('batch_size', 64, 'Images per step.', lower_bound=1)
  flags.DEFINE_integer('max_num_patches', None, 'NaFlex models: each image '
                       'resized, aspect kept, to at most this many patches '
                       "(SigLIP 2's processor), instead of --size; pooled "
                       'features only.')
  flags.DEFINE_string('tfds', None, 'A tfds split, NAME:SPLIT, e.g. '
                      'cifar10:test[:100].')
  flags.DEFINE_string('tfds_data_dir', None, "tfds' data folder.")
  flags.DEFINE_string('out', None, 'The .npz to write.')
  transform.define_flags()
  flags.mark_flags_as_required(['checkpoint', 'out'])


if __name__ == '__main__':
  # Defined here, not on import, as predict's: other modules define theirs.
  define_flags()
  cli.run(main)
