"""transformers' video models as vit_jax's ViViT: VivitForVideoClassification
and VivitModel (model 1, a learned joint table and a class token), and
VideoMAEForVideoClassification, VideoMAEModel and VideoMAEForPreTraining's
encoder (`families.videomae`'s options). `transformers_layout.to_timm`
renames their weights as a ViT's; this module reads the rest: the 3-D
tubelet kernel, the settings, the preset and the eval transform.

The eval transform is the processor's, per frame: resize, centre crop, and
its rescale and normalization as the mean and std of pixels in [0, 1]
(ViViT's `offset` rescale to [-1, 1] followed by its mean and std of 0.5
is mean 0.75 and std 0.25), and `num_frames`, the frames the model takes.
"""

import json
import os
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_defaults
from vit_jax.convert.names import timm_to_npz
from vit_jax.convert.transformers_layout import architecture
from vit_jax.models import registry
from vit_jax.models import vivit
from vit_jax.models.encoder import Encoder

Flat = Dict[str, np.ndarray]
KINDS = {'vivit': 'ViViT', 'videomae': 'VideoMAE'}  # kind: vit_jax family
_KERNEL = 'embedding/kernel'
_KEY_BIAS = 'MultiHeadDotProductAttention_1/key/bias'


def _unsupported(arch: str, key: str, value, why: str) -> ValueError:
  return ValueError(f"transformers' {arch} with {key}={value!r} is not "
                    f'supported: {why}.')


def _sides(config: Dict[str, Any]) -> Tuple[int, int, int]:
  """(frames per tubelet, patch height, patch width) of a config."""
  tubelet = config['tubelet_size']
  if isinstance(tubelet, (list, tuple)):  # ViViT's (t, ph, pw)
    return tuple(int(s) for s in tubelet)
  patch = config['patch_size']
  patch = patch if isinstance(patch, (list, tuple)) else (patch, patch)
  return int(tubelet), int(patch[0]), int(patch[1])


def model_settings(config: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's ViViT config (without head or preset) of a video config."""
  arch, kind = architecture(config), config['model_type']
  if config.get('num_channels', 3) != 3:
    raise _unsupported(arch, 'num_channels', config['num_channels'],
                       "vit_jax's pipelines feed RGB frames")
  videomae = kind == 'videomae'
  # use_mean_pooling: no final norm (the classifier has `fc_norm`).
  mean_pooling = videomae and config['use_mean_pooling']
  classifier = arch == 'VideoMAEForVideoClassification'
  if classifier and not mean_pooling:
    raise _unsupported(arch, 'use_mean_pooling', False, 'its head reads the '
                       "first patch token, which vit_jax's ViViT does not "
                       'pool')
  tubelet, height, width = _sides(config)
  # Older VideoMAE files name it `qkv_bias`, which transformers reads so.
  bias = config['qkv_bias'] if 'qkv_bias' in config else config['qv_bias']
  transformer = dict(
      num_layers=config['num_hidden_layers'],
      num_heads=config['num_attention_heads'],
      mlp_dim=config['intermediate_size'], dropout_rate=0.,
      attention_dropout_rate=0., layer_norm_eps=config['layer_norm_eps'],
      qkv_bias=('qv' if videomae else 'qkv') if bias else 'none',
      final_norm=not mean_pooling,
      **transformers_config.mlp_of(arch, config))
  settings = dict(hidden_size=config['hidden_size'], tubelet=tubelet,
                  patches={'size': [height, width]}, encoder='unfactorised',
                  transformer=transformer,
                  classifier='gap' if videomae else 'token',
                  temporal_posemb='sincos' if videomae else 'joint')
  if videomae:  # torch's LayerNorm default: 1e-5
    settings.update(fc_norm=classifier, fc_norm_eps=1e-5)
  return settings


def to_npz(timm_state: Flat, extra: Flat, config: Dict[str, Any]) -> Flat:
  """The published ViViT names of `to_timm`'s state dict (and `extra`,
  ViViT's pooler as `pre_logits`): the Conv3d kernel (D, C, t, p, p) as
  flax's (t, p, p, C, D); no key biases for VideoMAE."""
  flat = timm_to_npz(timm_state, config['num_attention_heads'])
  flat[_KERNEL] = flat[_KERNEL].transpose(2, 3, 4, 1, 0)
  if config['model_type'] == 'videomae':  # `to_timm`'s zeros
    flat = {k: v for k, v in flat.items() if not k.endswith(_KEY_BIAS)}
  return {**flat, **extra}


def _shape(model: Dict[str, Any]) -> tuple:
  t = model['transformer']
  return (model['hidden_size'], model['tubelet'],
          tuple(model['patches']['size']), t['num_layers'], t['num_heads'],
          t['mlp_dim'])


def _completed(preset: Dict[str, Any]) -> Dict[str, Any]:
  """A preset's config with ViViT's and its Encoder's defaults for the
  fields it leaves out."""
  out = {k: v.default for k, v in vivit.ViViT.__dataclass_fields__.items()
         if k != 'parent' and not callable(v.default)}
  encoder = {k: v.default for k, v in Encoder.__dataclass_fields__.items()
             if k != 'parent' and not callable(v.default)}
  out.update(preset)
  out['transformer'] = {**encoder, **preset['transformer']}
  out['patches'] = {'size': tuple(preset['patches']['size'])}
  return out


def preset_and_model(config: Dict[str, Any], settings: Dict[str, Any],
                     model_name: Optional[str]):
  """(preset, the record's model config): `model_name` or the family's
  preset of these shapes, with what differs; else FAMILY-custom, whole."""
  family = KINDS[config['model_type']]
  settings = dict(settings, patches={'size': tuple(
      settings['patches']['size'])})
  name = model_name or next((p.model_name for p in registry.FAMILIES[
      family].presets if _shape(p.to_dict()) == _shape(settings)), None)
  if name is None:
    return f'{family}-custom', dict(settings, representation_size=None)
  if registry.family(name).name != family:
    raise ValueError(f"transformers' {architecture(config)} is a {family} "
                     f'model; {name} is not one of its presets.')
  preset = _completed(registry.MODEL_CONFIGS[name].to_dict())
  if _shape(preset) != _shape(settings):
    raise ValueError(f"transformers' {architecture(config)} of shapes "
                     f'{_shape(settings)} (width, tubelet, patch, depth, '
                     f'heads, MLP) is not {name}: {_shape(preset)}.')
  out = {k: v for k, v in settings.items()
         if k != 'transformer' and preset[k] != v}
  inner = {k: v for k, v in settings['transformer'].items()
           if preset['transformer'][k] != v}
  return name, dict(out, **({'transformer': inner} if inner else {}))


def _processor(weights: str) -> Optional[Dict[str, Any]]:
  folder = os.path.dirname(weights)
  for name in ('preprocessor_config.json', 'video_preprocessor_config.json'):
    if os.path.exists(os.path.join(folder, name)):
      with open(os.path.join(folder, name)) as f:
        return json.load(f)
  return None


def eval_transform(weights: str, config: Dict[str, Any]) -> Dict[str, Any]:
  """The processor's eval transform beside `weights` (timm's keys, the mean
  and std of [0, 1] pixels) and `num_frames`; without one, the processor
  class's defaults at the config's image size, with a note."""
  kind = config['model_type']
  processor = _processor(weights)
  if processor is None:
    print(f'Note: no preprocessor_config.json beside {weights}: assuming '
          f"transformers' {KINDS[kind]} processor's defaults at "
          f"{config['image_size']} px.", file=sys.stderr)
    side = config['image_size']
    processor = dict(image_processor_type={
        'vivit': 'VivitImageProcessor',
        'videomae': 'VideoMAEImageProcessor'}[kind],
                     crop_size={'height': side, 'width': side})
  processor = transformers_defaults.complete_processor(processor)
  # Rescaled pixels are a * x - offset for x in [0, 1], then normalized.
  a = 255. * (processor['rescale_factor'] if processor['do_rescale'] else 1)
  offset = 1. if processor['do_rescale'] and processor.get('offset') else 0.
  normalize = processor['do_normalize']
  mean = np.asarray(processor['image_mean'] if normalize else [0.] * 3)
  std = np.asarray(processor['image_std'] if normalize else [1.] * 3)
  plain = dict(processor, do_rescale=True, rescale_factor=1 / 255,
               do_normalize=True, image_mean=list((mean + offset) / a),
               image_std=list(std / a))
  plain.pop('offset', None)
  return dict(transformers_config.eval_transform(plain),
              num_frames=int(config['num_frames']))


def _check_dims(flat: Flat, settings: Dict[str, Any], path: str) -> None:
  """config.json and the weights must describe the same model."""
  t = settings['transformer']
  kernel = flat[_KERNEL].shape
  have = dict(width=kernel[-1], tubelet=kernel[:3],
              depth=len({k.split('/')[1] for k in flat
                         if k.startswith('Transformer/encoderblock_')}),
              mlp_dim=flat['Transformer/encoderblock_0/MlpBlock_3/Dense_0/'
                           'kernel'].shape[-1])
  said = dict(width=settings['hidden_size'], tubelet=(
      settings['tubelet'], *settings['patches']['size']),
              depth=t['num_layers'], mlp_dim=t['mlp_dim'])
  wrong = [f'{k} {v} (weights: {have[k]})' for k, v in said.items()
           if tuple(np.atleast_1d(have[k])) != tuple(np.atleast_1d(v))]
  if wrong:
    raise ValueError(f"{path}'s config.json does not describe its weights: "
                     f'it says {", ".join(wrong)}.')


def read(timm_state: Flat, extra: Flat, config: Dict[str, Any],
         weights: str, model_name: Optional[str]):
  """(published names, preset, model overrides, eval transform) of a video
  model's tower renamed to timm's (`to_timm`)."""
  settings = model_settings(config)
  flat = to_npz(timm_state, extra, config)
  _check_dims(flat, settings, weights)
  name, model = preset_and_model(config, settings, model_name)
  return flat, name, model, eval_transform(weights, config)


# Writing (`--layout=transformers`): what each class computes, beyond the
# unfactorised encoder, square patches and no `pre_logits` (but VivitModel's
# pooler): (class token, its table, fc_norm, final norm, qkv biases).
_VIVIT = ('token', ('joint', None), False, True, ('qkv', 'none'))
_VIDEOMAE = ('gap', ('sincos',), None, None, ('qv', 'none'))


def _misfits(model: Dict[str, Any], flat: Flat) -> list:
  """What neither ViViT's nor VideoMAE's classes compute of `model`."""
  t = dict(model['transformer'])
  videomae = model.get('temporal_posemb') == 'sincos'
  classifier, posembs, fc_norm, final_norm, biases = (
      _VIDEOMAE if videomae else _VIVIT)
  head = 'head/kernel' in flat
  if videomae:  # the classifier's fc_norm; VideoMAEModel's final norm or none
    fc_norm, final_norm = head, (False if head else t.get('final_norm', True))
  have = dict(encoder=model.get('encoder', 'unfactorised'),
              classifier=model.get('classifier', 'token'),
              temporal_posemb=model.get('temporal_posemb'),
              fc_norm=bool(model.get('fc_norm')),
              final_norm=t.get('final_norm', True),
              qkv_bias=t.get('qkv_bias', 'qkv'),
              quick_gelu=t.get('quick_gelu', False),
              patches=tuple(model['patches']['size']))
  want = dict(encoder='unfactorised', classifier=classifier,
              temporal_posemb=posembs, fc_norm=fc_norm, final_norm=final_norm,
              qkv_bias=biases, quick_gelu=False,
              patches=(have['patches'][0],) * 2)
  wrong = [f'{k}={have[k]!r}' for k, v in want.items()
           if have[k] not in (v if isinstance(v, tuple) and k != 'patches'
                              else (v,))]
  if 'pre_logits/kernel' in flat and (videomae or head):
    wrong.append('pre_logits (only VivitModel has a pooler)')
  if videomae and head and model.get('fc_norm_eps') != 1e-5:
    wrong.append(f"fc_norm_eps={model.get('fc_norm_eps')} (transformers: "
                 '1e-5)')
  return wrong


def export_architecture(model: Dict[str, Any], flat: Flat) -> str:
  """The transformers class of a ViViT's `model` and weights `flat`; else
  one ValueError naming what none computes."""
  videomae = model.get('temporal_posemb') == 'sincos'
  head = 'head/kernel' in flat
  arch = {(False, True): 'VivitForVideoClassification',
          (False, False): 'VivitModel',
          (True, True): 'VideoMAEForVideoClassification',
          (True, False): 'VideoMAEModel'}[videomae, head]
  wrong = _misfits(model, flat)
  if wrong:
    raise ValueError(f"{model.get('model_name')} cannot be written as "
                     f"transformers' {arch}: it has {'; '.join(wrong)}.")
  return arch


def config_json(arch: str, model: Dict[str, Any], flat: Flat, side: int,
                frames: int) -> Dict[str, Any]:
  """transformers' config.json of `arch` computing `model`."""
  t = model['transformer']
  tubelet, patch = model['tubelet'], model['patches']['size'][0]
  videomae = arch.startswith('VideoMAE')
  config = dict(
      architectures=[arch], model_type='videomae' if videomae else 'vivit',
      hidden_size=model['hidden_size'], num_hidden_layers=t['num_layers'],
      num_attention_heads=t['num_heads'], intermediate_size=t['mlp_dim'],
      image_size=side, num_frames=frames, num_channels=3,
      layer_norm_eps=float(t.get('layer_norm_eps', 1e-6)),
      hidden_act=('gelu_fast' if not videomae else 'gelu_pytorch_tanh')
      if t.get('gelu_approximate', True) else 'gelu',
      hidden_dropout_prob=0., attention_probs_dropout_prob=0.)
  biases = t.get('qkv_bias', 'qkv') != 'none'
  if videomae:
    config.update(patch_size=patch, tubelet_size=tubelet, qv_bias=biases,
                  use_mean_pooling=arch.endswith('Classification') or
                  not t.get('final_norm', True))
  else:
    config.update(tubelet_size=[tubelet, patch, patch], qkv_bias=biases)
  if 'head/kernel' in flat:
    names = [f'LABEL_{i}' for i in range(flat['head/kernel'].shape[-1])]
    config.update(id2label=dict(enumerate(names)),
                  label2id={n: i for i, n in enumerate(names)})
  if 'pre_logits/bias' in flat:
    config.update(pooler_output_size=flat['pre_logits/bias'].shape[0],
                  pooler_act='tanh')
  return config


def preprocessor_json(arch: str, spec) -> Dict[str, Any]:
  """The image processor of an eval transform (`transform.Transform`):
  ViViT's with its offset rescale to [-1, 1], so its mean and std are
  2 * mean - 1 and 2 * std; VideoMAE's as an image's."""
  out = transformers_config.preprocessor_json(spec)
  if arch.startswith('VideoMAE'):
    return dict(out, image_processor_type='VideoMAEImageProcessor')
  return dict(out, image_processor_type='VivitImageProcessor',
              rescale_factor=1 / 127.5, offset=True,
              image_mean=[2 * m - 1 for m in spec.mean],
              image_std=[2 * s for s in spec.std])
