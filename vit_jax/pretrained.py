"""From any checkpoint to a model: `from_pretrained` (`vit_jax.models.
from_pretrained`).

  m = models.from_pretrained('facebook/dinov2-small')  # or a folder, a file
  x = transform.prepare('image.jpg', m.transform)[None]
  features = m.model.apply({'params': m.params}, x, train=False)

The source is a published .npz (its record beside it, if any), a training
workdir (its export and record, else its `config.json` and latest state),
a timm or transformers folder or weights file or hub name (converted once,
and cached: `convert.converter.as_npz`), or big_vision's .npz. The model is the
preset plus everything the record says (the settings that differ, the
head, the table's resize), at the recorded image size; a two-tower model
(LiT, CLIP, SigLIP) takes its towers' sizes from the file.
"""

import os
from typing import Any, Dict, NamedTuple, Optional

import flax.linen as nn
import jax
import numpy as np

from vit_jax.checkpoints import files
from vit_jax.checkpoints import record as checkpoint_record
from vit_jax.checkpoints import loading
from vit_jax.convert import converter
from vit_jax.convert import transform as transforms
from vit_jax.models import dpt
from vit_jax.models import lit
from vit_jax.models import registry


class Pretrained(NamedTuple):
  """A checkpoint's model, its parameters and its eval transform."""
  model: nn.Module
  params: Dict[str, Any]
  transform: transforms.Transform


def _preset_in_name(path: str) -> Optional[str]:
  """The longest preset named in the file's name (ViT-B_16.npz,
  imagenet21k_R50+ViT-B_16.npz), or None."""
  name = os.path.basename(path)
  found = [p for p in registry.MODEL_CONFIGS if p in name]
  return max(found, key=len) if found else None


def from_pretrained(src, *, model_name: Optional[str] = None,
                    image_size=None,
                    **overrides) -> Pretrained:
  """(model, params, transform) of the checkpoint `src`.

  `model_name`: the preset, where neither a record nor the file's name says
  it. `image_size`: the side the model sees (default: the recorded one,
  else the one the position table implies); the table is resized to it as
  the source does. A NaFlex tower (`posemb_grid`) takes any (height,
  width), its table resized to each image's grid at run time. A video
  model (ViViT, VideoMAE) takes clips (N, T, H, W, C) of the recorded
  `num_frames` at the recorded side, as its tables are. A depth model
  (Depth Anything, DPT: the record's `dpt`) is a `models.dpt.DPT`, whose
  output is transformers' `predicted_depth` (N, H, W). `overrides` change
  the model config (nested dicts key by key), e.g.
  `classifier='token_unpooled'` for every token's features.
  """
  src = os.fspath(src)
  path, record = converter.checkpoint_and_record(src, model_name)
  record = record or {}
  name = model_name or record.get('model_name') or _preset_in_name(path)
  if name is None:
    raise ValueError(f'{src}: neither a record nor its name says which preset '
                     'it is: pass model_name=.')
  name, config = checkpoint_record.settings(record, name, source=src)
  config = transforms.merged(config, overrides)
  size = image_size or transforms.recorded_size(record)
  normalization = checkpoint_record.normalization(record, name)
  if 'dpt' in record:
    model, params, size = _dpt(config, path, size, record['dpt'])
  elif registry.model_class(name, config) is lit.LitModel:
    model, params, size = _two_towers(config, path)
  elif registry.takes_clips(name, config):  # clips
    model, params, size, _ = loading.load_video_model(
        config, path, size, record.get('num_frames'))
  else:
    # load_params resizes the table as the record says (posemb_resize).
    model, params, size = loading.load_model(config, path, size)
  spec = transforms.resolve(size, record, normalization)
  return Pretrained(model, params, spec)


def _dpt(config: Dict[str, Any], path: str, size, settings):
  """A `models.dpt.DPT`: the recorded backbone (its table resized to
  `size` as the record says) and the head (`dpt/` in the file), as
  `settings` (the record's `dpt`) build them."""
  found = dict(files.read_params(path))
  head = found.pop('dpt')
  backbone, params, size = loading.load_model(config, path, size,
                                              found=found)
  model = dpt.DPT(backbone=backbone, dpt=dpt.DPTHead(**settings['head']),
                  indices=tuple(settings['indices']), norm=settings['norm'])
  return model, {'backbone': params, 'dpt': head}, size


def _two_towers(config: Dict[str, Any], path: str):
  """A LitModel and its parameters, the towers' sizes as the file's: its
  text length, vocabulary, projections and image table."""
  found = files.read_params(path)
  config = transforms.merged(config, _file_sizes(found, config))
  model = lit.LitModel(**{k: v for k, v in config.items()
                          if k in lit.LitModel.__dataclass_fields__})
  side = config['pp']['size']
  abstract = jax.eval_shape(lambda: model.init(
      jax.random.key(0), images=np.zeros((1, side, side, 3), np.float32),
      tokens=np.zeros((1, config['pp']['max_len']), np.int32)))['params']
  params = loading.load_params(path, init_params=abstract, model_config={},
                               resize_posemb=False, found=found)
  return model, params, side


def _file_sizes(found, config) -> Dict[str, Any]:
  """What a two-tower file's shapes say of the model config."""
  txt, img = found['txt'], found['img']
  width = lambda head: files.shape_of(head['kernel'])[-1] if head else None
  sizes = {'out_dim': (width(img.get('head')), width(txt.get('head'))),
           'pp': {'size': loading.image_size(img, config['image'])}}
  if 'pos_embedding' in txt:  # a text transformer's
    sizes['pp']['max_len'] = files.shape_of(txt['pos_embedding'])[1]
    sizes['text'] = {'vocab_size': files.shape_of(
        txt['Embed_0']['embedding'])[0]}
  return sizes
