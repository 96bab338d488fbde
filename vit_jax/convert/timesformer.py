"""transformers' TimeSformer (`TimesformerForVideoClassification`,
`TimesformerModel`) <-> vit_jax's `models.timesformer` names.

timm has no TimeSformer, so the weights are renamed to the published .npz
names directly (`to_npz`), and back (`from_npz`, `config_json`,
`processor_json`: `--layout=transformers`). transformers' blocks hold
each attention's query, key and value in one `qkv` Linear; a
`temporal_dense` after the temporal attention; `layernorm_before` and
`layernorm_after` around the spatial attention and the MLP (vit_jax's
`LayerNorm_0`, `LayerNorm_1`; published `LayerNorm_2`). The model config
comes from config.json (`model_config`), the eval transform from the
video processor's file (`eval_transform`): the frames are the config's
`num_frames`.
"""

import re
import sys
from typing import Any, Dict, Optional, Tuple

import numpy as np

from vit_jax.convert import transform
from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_defaults

Flat = Dict[str, np.ndarray]

ARCHITECTURES = {'TimesformerForVideoClassification': 'timesformer.',
                 'TimesformerModel': ''}
# TimesformerConfig's defaults (transformers 5.23), for a config.json that
# leaves some out.
DEFAULTS = dict(image_size=224, patch_size=16, num_channels=3, num_frames=8,
                hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                intermediate_size=3072, hidden_act='gelu',
                layer_norm_eps=1e-6, qkv_bias=True,
                attention_type='divided_space_time')
# TimesformerVideoProcessor's defaults: short side 224, center crop 224,
# bilinear, ImageNet's mean and std.
PROCESSOR = dict(size={'shortest_edge': 224}, do_center_crop=True,
                 crop_size={'height': 224, 'width': 224}, resample=2,
                 image_mean=[0.485, 0.456, 0.406],
                 image_std=[0.229, 0.224, 0.225])
PROCESSOR_FILES = ('preprocessor_config.json',
                   'video_preprocessor_config.json')
# transformers' hidden_act -> the MLP's gelu_approximate.
_GELUS = {'gelu': False, 'gelu_new': True, 'gelu_pytorch_tanh': True}
CUSTOM = 'TimeSformer-custom'

# (transformers' module, vit_jax's published name: the pre-Linen numbering
# of `checkpoints.files`) of the norms and dense layers; {i} a block's
# index.
_MODULES = [
    ('layernorm', 'Transformer/encoder_norm'),
    ('encoder.layer.{i}.layernorm_before',
     'Transformer/encoderblock_{i}/LayerNorm_0'),
    ('encoder.layer.{i}.layernorm_after',
     'Transformer/encoderblock_{i}/LayerNorm_2'),
    ('encoder.layer.{i}.temporal_layernorm',
     'Transformer/encoderblock_{i}/temporal_norm'),
    ('encoder.layer.{i}.intermediate.dense',
     'Transformer/encoderblock_{i}/MlpBlock_3/Dense_0'),
    ('encoder.layer.{i}.output.dense',
     'Transformer/encoderblock_{i}/MlpBlock_3/Dense_1'),
    ('encoder.layer.{i}.temporal_dense',
     'Transformer/encoderblock_{i}/temporal_dense'),
    ('classifier', 'head'),
]
# transformers' attention modules and vit_jax's.
_ATTENTIONS = [
    ('encoder.layer.{i}.attention',
     'Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1'),
    ('encoder.layer.{i}.temporal_attention',
     'Transformer/encoderblock_{i}/temporal_attention'),
]
_TABLES = {'embeddings.cls_token': 'cls',
           'embeddings.position_embeddings':
               'Transformer/posembed_input/pos_embedding',
           'embeddings.time_embeddings':
               'Transformer/posembed_input/pos_embedding_time'}


def is_timesformer(config: Dict[str, Any]) -> bool:
  return (config.get('architectures') or [None])[0] in ARCHITECTURES


def complete(config: Dict[str, Any]) -> Dict[str, Any]:
  return dict(DEFAULTS, **config)


def _template(template: str, i: Optional[str]) -> str:
  return template.replace('{i}', i or '')


def _match(key: str, template: str):
  """The block index (or '' for none) where `key` is `template`.LEAF."""
  pattern = re.escape(template).replace(r'\{i\}', r'(\d+)')
  match = re.fullmatch(pattern + r'\.(\w+)', key)
  if match is None:
    return None
  return (match.group(1) if '{i}' in template else ''), match.groups()[-1]


def _dense(key, value, name, leaf, out):
  """A Linear (out, in) or LayerNorm by vit_jax's names."""
  norm = 'norm' in name.rsplit('/', 1)[-1] or 'LayerNorm' in name
  if leaf == 'weight':
    out[f'{name}/scale' if norm else f'{name}/kernel'] = (
        value if norm else value.T)
  elif leaf == 'bias':
    out[f'{name}/bias'] = value
  else:
    raise ValueError(f"transformers' TimeSformer: {key} has no counterpart "
                     'in vit_jax.')


def _attention(prefix: str, leaf: str, part: str, value, heads: int,
               out: Flat) -> None:
  """`qkv` (3D, D) split into query/key/value kernels (D, H, K), biases
  (H, K); `output.dense` as `out` (H, K, D)."""
  if part == 'qkv':
    for name, piece in zip(('query', 'key', 'value'), np.split(value, 3)):
      if leaf == 'weight':
        out[f'{prefix}/{name}/kernel'] = piece.T.reshape(
            piece.shape[1], heads, -1)
      else:
        out[f'{prefix}/{name}/bias'] = piece.reshape(heads, -1)
  elif leaf == 'weight':
    out[f'{prefix}/out/kernel'] = value.T.reshape(heads, -1, value.shape[0])
  else:
    out[f'{prefix}/out/bias'] = value


def to_npz(state: Flat, config: Dict[str, Any]) -> Flat:
  """vit_jax's published names of transformers' TimeSformer `state`."""
  prefix = ARCHITECTURES[config['architectures'][0]]
  heads, out, unknown = config['num_attention_heads'], {}, []
  for key, value in state.items():
    if prefix and key.startswith(prefix):
      key = key[len(prefix):]
    value = np.asarray(value)
    if key in _TABLES:
      out[_TABLES[key]] = value
    elif key.startswith('embeddings.patch_embeddings.projection.'):
      leaf = key.rsplit('.', 1)[1]
      out[f'embedding/{"kernel" if leaf == "weight" else "bias"}'] = (
          value.transpose(2, 3, 1, 0) if leaf == 'weight' else value)
    elif not _rename(key, value, heads, out):
      unknown.append(key)
  if unknown:
    raise ValueError(f"transformers' TimeSformer: {len(unknown)} name(s) have "
                     f'no counterpart in vit_jax: {", ".join(unknown[:6])}.')
  return out


def _rename(key, value, heads, out) -> bool:
  """Renames a block's (or the final norm's, the head's) `key` into
  `out`; False if it is none of theirs."""
  for source, target in _ATTENTIONS:
    for part, module in (('qkv', 'attention.qkv'), ('out', 'output.dense')):
      found = _match(key, f'{source}.{module}')
      if found:
        i, leaf = found
        _attention(_template(target, i), leaf, part, value, heads, out)
        return True
  for source, target in _MODULES:
    found = _match(key, source)
    if found:
      i, leaf = found
      _dense(key, value, _template(target, i), leaf, out)
      return True
  return False


def model_config(config: Dict[str, Any]) -> Dict[str, Any]:
  """vit_jax's TimeSformer config of a complete config.json (`complete`);
  refuses what vit_jax does not compute."""
  if config['hidden_act'] not in _GELUS:
    raise ValueError(f"transformers' TimeSformer with hidden_act="
                     f"{config['hidden_act']!r}: vit_jax computes "
                     f'{", ".join(_GELUS)}.')
  if not config['qkv_bias'] or config['num_channels'] != 3:
    raise ValueError("transformers' TimeSformer without qkv_bias or of other "
                     'than 3 channels is not supported.')
  patch = config['patch_size']
  patch = list(patch) if isinstance(patch, (list, tuple)) else [patch] * 2
  transformer = dict(num_layers=config['num_hidden_layers'],
                     mlp_dim=config['intermediate_size'],
                     num_heads=config['num_attention_heads'],
                     dropout_rate=0., attention_dropout_rate=0.,
                     gelu_approximate=_GELUS[config['hidden_act']])
  if config['layer_norm_eps'] != 1e-6:
    transformer['layer_norm_eps'] = config['layer_norm_eps']
  return dict(patches=dict(size=patch), hidden_size=config['hidden_size'],
              transformer=transformer,
              attention_type=config['attention_type'],
              num_frames=config['num_frames'], representation_size=None,
              classifier='token')


def preset(model: Dict[str, Any], presets,
           model_name: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
  """(preset, what `model` changes of it): `model_name`, else the
  TimeSformer preset that `model` is, else (CUSTOM, `model` whole)."""
  if model_name is not None:
    return model_name, transform.model_overrides(
        presets[model_name].to_dict(), model)
  for name, config in presets.items():
    if ('attention_type' in config and
        not transform.model_overrides(config.to_dict(), model)):
      return name, {}
  return CUSTOM, model


def eval_transform(folder: str, config: Dict[str, Any]) -> Dict[str, Any]:
  """The video processor's eval transform (timm's keys) and the frames:
  its file beside the weights, else TimesformerVideoProcessor's defaults
  (ImageNet's mean and std, short side 224, center crop 224, bilinear)."""
  found = transformers_defaults.read_processor(folder, PROCESSOR_FILES)
  if found is not None:
    processor = dict(PROCESSOR, **found)
  else:
    print(f'Note: no {" or ".join(PROCESSOR_FILES)} in {folder}: assuming '
          "TimesformerVideoProcessor's defaults (short side 224, center crop "
          "224, bilinear, ImageNet's mean and std).", file=sys.stderr)
    processor = dict(PROCESSOR)
  out = transformers_config.eval_transform(processor)
  out['num_frames'] = config['num_frames']
  return out


def config_json(model: Dict[str, Any], flat: Flat,
                side: int) -> Dict[str, Any]:
  """transformers' config.json of vit_jax's TimeSformer `model` (a model
  config dict) with the published names `flat`, at `side` px; refuses what
  transformers computes otherwise."""
  if model.get('representation_size') or 'pre_logits/kernel' in flat:
    raise ValueError("transformers' TimeSformer has no pre_logits layer.")
  if model.get('attention_type') == 'space_only':
    raise ValueError("transformers' TimeSformer with attention_type="
                     "'space_only' returns a row per frame, which vit_jax "
                     'averages: not written.')
  block = model['transformer']
  head = flat.get('head/kernel')
  frames = flat['Transformer/posembed_input/pos_embedding_time'].shape[1]
  out = dict(
      architectures=['TimesformerForVideoClassification' if head is not None
                     else 'TimesformerModel'],
      model_type='timesformer', image_size=side,
      patch_size=int(model['patches']['size'][0]), num_channels=3,
      num_frames=frames, hidden_size=model['hidden_size'],
      num_hidden_layers=block['num_layers'],
      num_attention_heads=block['num_heads'],
      intermediate_size=block['mlp_dim'],
      hidden_act=('gelu_pytorch_tanh' if block.get('gelu_approximate', True)
                  else 'gelu'),
      layer_norm_eps=block.get('layer_norm_eps', 1e-6), qkv_bias=True,
      attention_type=model.get('attention_type', 'divided_space_time'),
      hidden_dropout_prob=0., attention_probs_dropout_prob=0.,
      drop_path_rate=0.)
  if head is not None:
    out['id2label'] = {str(i): f'LABEL_{i}' for i in range(head.shape[-1])}
  return out


def processor_json(preprocessor: Dict[str, Any]) -> Dict[str, Any]:
  """A video processor's file of an image processor's
  (`transformers_config.preprocessor_json`)."""
  out = {k: v for k, v in preprocessor.items()
         if k != 'image_processor_type'}
  return dict(out, video_processor_type='TimesformerVideoProcessor',
              do_sample_frames=False)


def from_npz(flat: Flat, config: Dict[str, Any]) -> Flat:
  """transformers' state dict of `config` (`ARCHITECTURES`) from vit_jax's
  published names: the reverse of `to_npz`."""
  prefix = ARCHITECTURES[config['architectures'][0]]
  inverse = {v: k for k, v in _TABLES.items()}
  out = {}
  for key, value in flat.items():
    if key in inverse:
      out[inverse[key]] = value
    elif key.startswith('embedding/'):
      leaf = key.rsplit('/', 1)[1]
      out['embeddings.patch_embeddings.projection.' + (
          'weight' if leaf == 'kernel' else 'bias')] = (
              value.transpose(3, 2, 0, 1) if leaf == 'kernel' else value)
  out.update(_blocks_from_npz(flat))
  return {k if k.startswith('classifier') else prefix + k: v
          for k, v in out.items()}


def _blocks_from_npz(flat: Flat) -> Flat:
  """`_rename`'s reverse."""
  out = {}
  for source, target in _MODULES:
    for key, value in flat.items():
      found = _match(key.replace('/', '.'), target.replace('/', '.'))
      if found:
        i, leaf = found
        name = _template(source, i)
        out[f'{name}.{"bias" if leaf == "bias" else "weight"}'] = (
            value.T if leaf == 'kernel' else value)
  for source, target in _ATTENTIONS:
    for key in flat:
      found = _match(key.replace('/', '.'),
                     target.replace('/', '.') + '.query')
      if not found or found[1] != 'kernel':
        continue
      base, i = _template(target, found[0]), found[0]
      name = _template(source, i)
      kernels = [flat[f'{base}/{p}/kernel'] for p in ('query', 'key', 'value')]
      out[f'{name}.attention.qkv.weight'] = np.concatenate(
          [k.reshape(k.shape[0], -1).T for k in kernels])
      out[f'{name}.attention.qkv.bias'] = np.concatenate(
          [flat[f'{base}/{p}/bias'].reshape(-1)
           for p in ('query', 'key', 'value')])
      kernel = flat[f'{base}/out/kernel']
      out[f'{name}.output.dense.weight'] = kernel.reshape(
          -1, kernel.shape[-1]).T
      out[f'{name}.output.dense.bias'] = flat[f'{base}/out/bias']
  return out
