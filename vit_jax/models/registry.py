"""The model families, each registered once by its own module
(`vit_jax/models/families/`), and what every caller asks of them.

A family is a set of presets built by one class, with what its published
weights need: their source (Google's or timm's), the input normalization,
the native resolution, how timm lays out their state dict and which timm
architectures are theirs. Nothing chooses a family by a preset's name:
a preset belongs to the family that registered it; a custom model (a name
that is no preset) to the first family whose class takes every field of
its config, else to `DEFAULT` (Google's ViT).
"""

import copy
import dataclasses
import re
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import cli
from vit_jax.models import lit
from vit_jax.platform import target

# Pixel mean and std (of pixels in [0, 1]) that weights expect: Google's
# checkpoints take [-1, 1]; timm's ImageNet's statistics. The models never
# normalize; the data pipelines, predict and analysis do.
NORMALIZATIONS = {'google': ((0.5,) * 3, (0.5,) * 3),
                  'imagenet': ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
                  'clip': ((0.48145466, 0.4578275, 0.40821073),
                           (0.26862954, 0.26130258, 0.27577711))}


@dataclasses.dataclass(frozen=True)
class Family:
  """A model family, as its module registers it.

  Attributes:
    name: e.g. 'ViT', 'DINOv2'.
    model: the `nn.Module` class that builds its presets.
    presets: its preset configs (each with its `model_name`).
    weights: whose published weights they load: 'google' (inputs in
      [-1, 1], position tables resized bicubic) or 'timm' (ImageNet's mean
      and std, timm's antialiased bicubic).
    normalization: the key in NORMALIZATIONS where it is not the weights'
      source's (CLIP's for CLIP and EVA-02).
    native: the image side of the published weights; None for a model that
      takes any (or a fixed token count).
    native_sizes: presets published at another side ({'Swin-B_384': 384}).
    timm_layout: how timm's state dict of its weights maps to the published
      names (`vit_jax.convert`): 'vit', 'eva', 'beit', 'swin', 'mixer',
      'naflex', 'aimv2' or 'sam'; None: no timm weights.
    timm_architecture: a regex that timm's `architecture` fully matches for
      this family's weights (where the layout alone does not tell).
    timm_tag: a regex that timm's pretrained tag matches (MAE's encoders
      are plain ViTs: only the tag tells).
    image_multiple: model config -> ((h, w), what) that image sides must be
      multiples of, or None.
    patch_resizable: model config -> whether it runs at another patch size
      (FlexiViT's PI-resize).
  """
  name: str
  model: type
  presets: Sequence[ml_collections.ConfigDict]
  weights: str = 'google'
  normalization: Optional[str] = None
  native: Optional[int] = 224
  native_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
  timm_layout: Optional[str] = None
  timm_architecture: Optional[str] = None
  timm_tag: Optional[str] = None
  image_multiple: Optional[Callable[[Any], Optional[Tuple[tuple, str]]]] = None
  patch_resizable: Callable[[Any], bool] = lambda model_config: False

  @property
  def input_normalization(self) -> Tuple[tuple, tuple]:
    """(mean, std) of the inputs that its weights expect."""
    key = self.normalization or (
        'imagenet' if self.weights == 'timm' else 'google')
    return NORMALIZATIONS[key]

  @property
  def posemb_resize_method(self) -> str:
    """How its position tables are resized to a new grid: as its weights'
    source does (timm's antialiased bicubic, or Google's bicubic)."""
    return 'bicubic_antialias' if self.weights == 'timm' else 'bicubic'


class UnknownPreset(KeyError, ValueError):
  """A preset name that does not exist; says the closest ones."""

  def __str__(self):
    return self.args[0]


class Presets(dict):
  """The presets by name; an unknown name raises `UnknownPreset` (a
  KeyError that the command lines print as one line)."""

  def __missing__(self, name):
    raise UnknownPreset(cli.closest(name, self, 'model preset'))


FAMILIES: Dict[str, Family] = {}
MODEL_CONFIGS = Presets()
_FAMILY_OF: Dict[str, Family] = {}
DEFAULT = 'ViT'  # the family of a model name that is no preset


def register(family: Family) -> Family:
  """Adds `family` and its presets (locked: a typo in an override fails at
  once instead of adding a field)."""
  if family.name in FAMILIES:
    raise ValueError(f'Family {family.name} is registered twice.')
  for config in family.presets:
    if config.model_name in MODEL_CONFIGS:
      raise ValueError(f'Preset {config.model_name} is registered twice.')
  FAMILIES[family.name] = family
  for config in family.presets:
    MODEL_CONFIGS[config.model_name] = config.lock()
    _FAMILY_OF[config.model_name] = family
  return family


def family(name: str, model_config=None) -> Family:
  """The family of a preset; of a custom model, the first whose class
  takes every field of its `model_config` (else `DEFAULT`'s)."""
  if name in _FAMILY_OF:
    return _FAMILY_OF[name]
  if model_config is not None:
    fields = set(model_config.to_dict() if hasattr(model_config, 'to_dict')
                 else model_config) - {'model_name'}
    for fam in FAMILIES.values():
      if fields <= set(fam.model.__dataclass_fields__):
        return fam
  return FAMILIES[DEFAULT]


def model_class(name: str, model_config=None):
  """The model class of a preset or a custom model (`family`)."""
  return family(name, model_config).model


def takes_clips(name: str, model_config=None) -> bool:
  """Whether the model takes clips (batch, T, H, W, C): a video model."""
  return getattr(model_class(name, model_config), 'TAKES_CLIPS', False)


def get_model(name: str, **kw) -> nn.Module:
  """The model of preset `name`; `kw` overrides its config. `dtype='auto'`
  is this process's devices' for training (`target.compute_dtype`)."""
  config = dict(MODEL_CONFIGS[name].to_dict(), **kw)
  if config.get('dtype') == 'auto':
    config['dtype'] = target.compute_dtype()
  return model_class(name)(**config)


def input_normalization(name: str) -> Tuple[tuple, tuple]:
  """(mean, std) of the inputs that the preset `name` expects."""
  return family(name).input_normalization


def weights_source(name: str) -> str:
  """'timm' for presets of timm's weights, else 'google'."""
  return family(name).weights


def posemb_resize_method(name: str) -> str:
  """How the position table of preset `name` is resized ('bicubic' for a
  name that is no preset)."""
  if name not in MODEL_CONFIGS:
    return 'bicubic'
  return family(name).posemb_resize_method


def native_resolution(name: str) -> Optional[int]:
  """The image side of the preset's published weights; None for models
  that take any and for custom names."""
  if name not in MODEL_CONFIGS:
    return None
  fam = family(name)
  return fam.native_sizes.get(name, fam.native)


def presets_of(*layouts: str) -> Sequence[str]:
  """The presets of the families whose timm layout is one of `layouts`."""
  return [name for name, fam in _FAMILY_OF.items()
          if fam.timm_layout in layouts]


def timm_family(architecture: str, tag: str = '') -> Optional[Family]:
  """The family that claims timm's `architecture` (or pretrained `tag`);
  None where only the weights' shapes tell (a plain ViT, DeiT, DINOv2)."""
  by_name = [f for f in FAMILIES.values() if f.timm_architecture and
             re.fullmatch(f.timm_architecture, architecture)]
  by_tag = [f for f in FAMILIES.values() if f.timm_tag and
            re.match(f.timm_tag, tag)]
  return next(iter(by_name + by_tag), None)


def set_model(config, name: str, model=None):
  """`config.model` from preset `name` (or the dict `model`, under that
  name), and `pp.mean`/`pp.std` as its weights expect; `config.model.
  model_name` refers to `config.model_name`, so the name has one source."""
  if model is None:
    model = MODEL_CONFIGS[name]
  config.model_name = name
  set_normalization(config, input_normalization(name))
  # A deep copy keeps the preset's typed None fields (placeholders), so that
  # --config.model.transformer.layerscale_init=1e-5 parses as a float.
  config.model = copy.deepcopy(ml_collections.ConfigDict(model))
  config.model.model_name = config.get_ref('model_name')
  return config


def set_normalization(config, normalization) -> None:
  """pp.mean/std; None for Google's [-1, 1], which the pipeline makes."""
  mean, std = (tuple(float(v) for v in x) for x in normalization)
  if (mean, std) == NORMALIZATIONS['google']:
    mean = std = None
  config.pp.mean, config.pp.std = mean, std


def count_params(model: nn.Module, image_shape=(1, 224, 224, 3)) -> int:
  """Counts parameters from shapes alone (no memory, no compute)."""
  if isinstance(model, lit.LitModel):  # it takes tokens too
    tokens = jnp.zeros((1, model.pp['max_len']), jnp.int32)
    init = lambda: model.init(jax.random.key(0), images=jnp.zeros(
        image_shape), tokens=tokens)
  else:
    init = lambda: model.init(jax.random.key(0), jnp.zeros(image_shape),
                              train=False)
  variables = jax.eval_shape(init)
  return sum(x.size for x in jax.tree.leaves(variables['params']))
