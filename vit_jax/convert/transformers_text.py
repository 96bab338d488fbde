"""The text tower of Hugging Face transformers' `CLIPModel`, `SiglipModel`,
`Siglip2Model` (SigLIP's layout) and `Aimv2Model` <-> `models.lit.
TextTransformer` (a `LitModel`'s `txt/`).

transformers (under `text_model.`)     vit_jax (under `txt/`)
  embeddings.token_embedding             Embed_0/embedding
  embeddings.position_embedding          pos_embedding (1, L, D)
  encoder.layers.{i}.layer_norm1, 2      Encoder_0/encoderblock_{i}/
                                           LayerNorm_0, LayerNorm_1
  encoder.layers.{i}.self_attn.          .../MultiHeadDotProductAttention_0/
    q_proj, k_proj, v_proj, out_proj         query, key, value, out
  encoder.layers.{i}.mlp.fc1, fc2        .../MlpBlock_0/Dense_0, Dense_1
  final_layer_norm                       Encoder_0/encoder_norm
  head (SigLIP's, SigLIP 2's)            head
  text_projection (CLIP's, at the top,   head (its bias: zeros)
    without a bias)
and `logit_scale` (log temperature, as `t`), SigLIP's `logit_bias` (`b`).
AIMv2's blocks have no biases: `rms_norm1`, `rms_norm2` (LayerNorm_0, _1:
RMSNorms),
`attention.{q,k,v,out}_proj`, `ffn.gate_proj` and `up_proj` (fused as
Dense_0's [gate, up]), `ffn.down_proj`, the final `rms_norm`; its
`text_projection` as CLIP's.
How the tower computes comes from config.json: CLIP's causal attention and
end-token pooling (its legacy eos_token_id 2: the largest id), SigLIP's
last token, the activation and LayerNorm epsilon.
"""

import re
from typing import Any, Dict, Tuple

import numpy as np

from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_defaults

Flat = Dict[str, np.ndarray]

_NAMES = {'clip': 'CLIP', 'siglip': 'SigLIP', 'siglip2': 'SigLIP 2',
          'aimv2': 'AIMv2'}
_BLOCK = {  # module in a layer -> (vit_jax's module, layout)
    'layer_norm1': ('LayerNorm_0', 'norm'),
    'layer_norm2': ('LayerNorm_1', 'norm'),
    'self_attn.q_proj': ('MultiHeadDotProductAttention_0/query', 'heads'),
    'self_attn.k_proj': ('MultiHeadDotProductAttention_0/key', 'heads'),
    'self_attn.v_proj': ('MultiHeadDotProductAttention_0/value', 'heads'),
    'self_attn.out_proj': ('MultiHeadDotProductAttention_0/out', 'out'),
    'mlp.fc1': ('MlpBlock_0/Dense_0', 'dense'),
    'mlp.fc2': ('MlpBlock_0/Dense_1', 'dense'),
}
_AIMV2_BLOCK = {
    'rms_norm1': ('LayerNorm_0', 'rms'),
    'rms_norm2': ('LayerNorm_1', 'rms'),
    'attention.q_proj': ('MultiHeadDotProductAttention_0/query', 'heads'),
    'attention.k_proj': ('MultiHeadDotProductAttention_0/key', 'heads'),
    'attention.v_proj': ('MultiHeadDotProductAttention_0/value', 'heads'),
    'attention.out_proj': ('MultiHeadDotProductAttention_0/out', 'out'),
    'ffn.gate_up_proj': ('MlpBlock_0/Dense_0', 'dense'),  # `_fuse_swiglu`
    'ffn.down_proj': ('MlpBlock_0/Dense_1', 'dense'),
}
# Leaves of a layout other than a Linear's weight and bias; CLIP's
# text_projection is a Linear without bias.
_LEAVES = {'embed': {'weight': 'embedding'}, 'posemb': {'weight': ''},
           'norm': {'weight': 'scale', 'bias': 'bias'},
           'projection': {'weight': 'kernel'}, 'rms': {'weight': 'scale'}}


def _error(kind: str, message: str) -> ValueError:
  return ValueError(f"transformers' {_NAMES[kind]} text tower: {message}")


def _kind(config: Dict[str, Any]) -> str:
  kind = config.get('model_type')
  if kind not in _NAMES:
    raise ValueError(f"config.json's model_type={kind!r}: transformers' text "
                     f'towers are converted from {tuple(_NAMES)} only.')
  return kind


def _pairs(kind: str, num_layers: int) -> Dict[str, Tuple[str, str]]:
  """transformers' key -> (vit_jax's name, layout) of every parameter."""
  head = (('text_projection', 'head', 'projection') if kind in (
      'clip', 'aimv2') else ('text_model.head', 'head', 'dense'))
  final = (('text_model.rms_norm', 'Encoder_0/encoder_norm', 'rms') if
           kind == 'aimv2' else ('text_model.final_layer_norm',
                                 'Encoder_0/encoder_norm', 'norm'))
  modules = [('text_model.embeddings.token_embedding', 'Embed_0', 'embed'),
             ('text_model.embeddings.position_embedding', 'pos_embedding',
              'posemb'), final, head]
  modules += [(f'text_model.encoder.layers.{i}.{module}',
               f'Encoder_0/encoderblock_{i}/{name}', layout)
              for i in range(num_layers)
              for module, (name, layout) in (
                  _AIMV2_BLOCK if kind == 'aimv2' else _BLOCK).items()]
  # AIMv2's Linears have no biases.
  linear = {'weight': 'kernel'} if kind == 'aimv2' else {
      'weight': 'kernel', 'bias': 'bias'}
  pairs = {}
  for module, name, layout in modules:
    for leaf, target in _LEAVES.get(layout, linear).items():
      pairs[f'{module}.{leaf}'] = ('/'.join(filter(None, (name, target))),
                                   layout)
  return pairs


def _to_flax(value: np.ndarray, layout: str, heads: int) -> np.ndarray:
  """torch's layout of a parameter -> flax's: Linear (out, in) weights to
  (in, out) kernels, split by heads in the attention."""
  if layout == 'posemb':
    return value[None]
  if layout in ('embed', 'norm', 'rms'):
    return value
  if value.ndim == 1:
    return value.reshape(heads, -1) if layout == 'heads' else value
  if layout == 'heads':  # (D, H, D / H)
    return value.T.reshape(value.shape[1], heads, -1)
  if layout == 'out':  # (H, D / H, D)
    return value.T.reshape(heads, -1, value.shape[0])
  return value.T


def _to_torch(value: np.ndarray, layout: str) -> np.ndarray:
  """`_to_flax`'s reverse."""
  if layout == 'posemb':
    return value[0]
  if layout == 'heads' and value.ndim == 2:  # a bias (H, D / H)
    return value.reshape(-1)
  if layout in ('embed', 'norm', 'rms') or value.ndim == 1:
    return value
  if layout == 'heads':
    value = value.reshape(value.shape[0], -1)
  elif layout == 'out':
    value = value.reshape(-1, value.shape[-1])
  return value.T


def _check_keys(kind: str, have, want, what: str) -> None:
  """Raises naming the keys of `have` not in `want` and those missing."""
  unknown = sorted(set(have) - set(want))
  missing = sorted(set(want) - set(have))
  for keys, problem in ((unknown, f'has no counterpart in {what}'),
                        (missing, 'is missing')):
    if keys:
      shown = ', '.join(keys[:6]) + (f' and {len(keys) - 6} more'
                                     if len(keys) > 6 else '')
      raise _error(kind, f'{shown} {problem}.')


def _fuse_swiglu(state: Flat) -> Flat:
  """AIMv2's gate_proj and up_proj weights as one [gate, up] (2 M, D), as
  vit_jax's SwiGLU `Dense_0` computes them."""
  out = {}
  for key, value in state.items():
    if key.endswith('.ffn.gate_proj.weight'):
      up = key.replace('gate_proj', 'up_proj')
      if up not in state:
        raise _error('aimv2', f'{up} is missing.')
      out[key.replace('gate_proj', 'gate_up_proj')] = np.concatenate(
          [value, state[up]])
    elif not key.endswith('.ffn.up_proj.weight'):
      out[key] = value
  return out


def _split_swiglu(state: Flat) -> Flat:
  """`_fuse_swiglu`'s reverse."""
  out = {}
  for key, value in state.items():
    if key.endswith('.ffn.gate_up_proj.weight'):
      gate, up = np.split(value, 2)
      out[key.replace('gate_up_proj', 'gate_proj')] = gate
      out[key.replace('gate_up_proj', 'up_proj')] = up
    else:
      out[key] = value
  return out


def _aimv2_fields(text_config, state: Flat, num_layers: int):
  """AIMv2's `TextTransformer` fields: causal, read at the first end
  token (transformers': argmax of input_ids == eos_token_id)."""
  for key, value in (('hidden_act', 'silu'), ('qkv_bias', False),
                     ('mlp_bias', False)):
    if text_config.get(key, value) != value:
      raise _error('aimv2', f'{key}={text_config[key]!r} is not supported '
                   f'(vit_jax computes {value!r}).')
  vocab_size, width = state[
      'text_model.embeddings.token_embedding.weight'].shape
  return dict(
      width=width, vocab_size=vocab_size, num_layers=num_layers,
      mlp_dim=state['text_model.encoder.layers.0.ffn.gate_up_proj.weight']
      .shape[0] // 2, num_heads=text_config['num_attention_heads'],
      layer_norm_eps=text_config['rms_norm_eps'], gelu_approximate=False,
      quick_gelu=False, causal=True, pool='eos',
      eos_token=text_config['eos_token_id'], norm='rms', swiglu=True,
      qkv_bias='none', out_bias=False, mlp_bias=False)


def _text_fields(kind: str, text_config, state: Flat,
                 num_layers: int) -> Dict[str, Any]:
  """`TextTransformer`'s fields: sizes from the weights, how it computes
  from the config (completed with transformers' defaults:
  `transformers_defaults`)."""
  if kind == 'aimv2':
    return _aimv2_fields(text_config, state, num_layers)
  act, heads = text_config['hidden_act'], text_config['num_attention_heads']
  vocab_size, width = state[
      'text_model.embeddings.token_embedding.weight'].shape
  if width % heads:
    raise _error(kind, f'num_attention_heads={heads} does not divide the '
                 f'width {width}.')
  fields = dict(
      width=width, vocab_size=vocab_size, num_layers=num_layers,
      mlp_dim=state['text_model.encoder.layers.0.mlp.fc1.weight'].shape[0],
      num_heads=heads, layer_norm_eps=text_config['layer_norm_eps'],
      **transformers_config.mlp_of(f'{_NAMES[kind]} text tower',
                                   {'hidden_act': act}),
      causal=kind == 'clip', pool='last', eos_token=None)
  if kind == 'clip' and text_config['eos_token_id'] == 2:
    fields['pool'] = 'argmax'  # transformers' legacy configs: the largest id
  elif kind == 'clip':
    fields.update(pool='eos', eos_token=text_config['eos_token_id'])
  return fields


def text_tower(state: Flat, config: Dict[str, Any]
               ) -> Tuple[Flat, Dict[str, Any], Dict[str, Any]]:
  """A CLIPModel's or SiglipModel's state (numpy, all of it) and its
  config.json -> (the text tower's parameters in `txt/`'s '/'-joined names,
  `TextTransformer`'s fields, extras): extras 't' (1,) log temperature, 'b'
  (1,) bias or None, 'max_len' (the position table's length), 'out_dim'
  (the projection's width)."""
  config = transformers_defaults.complete_config(config)
  kind = _kind(config)
  text = {k: v for k, v in state.items()
          if (k.startswith('text_model.') or k.startswith('text_projection.'))
          and not k.endswith('.position_ids')}  # a buffer, an arange
  if kind == 'aimv2':
    text = _fuse_swiglu(text)
  layers = {int(m[1]) for k in text
            for m in [re.match(r'text_model\.encoder\.layers\.(\d+)\.', k)]
            if m}
  if not layers:
    raise _error(kind, 'no text_model.encoder.layers in the weights.')
  pairs = _pairs(kind, max(layers) + 1)
  _check_keys(kind, text, pairs, 'vit_jax')
  sigmoid = kind in ('siglip', 'siglip2')  # SigLIP's loss has a bias
  for key in ('logit_scale',) + (('logit_bias',) if sigmoid else ()):
    if key not in state:
      raise _error(kind, f'{key} is missing.')
  fields = _text_fields(kind, config.get('text_config', {}), text,
                        max(layers) + 1)
  flat = {pairs[k][0]: _to_flax(np.asarray(v), pairs[k][1],
                                fields['num_heads'])
          for k, v in text.items()}
  if not sigmoid:  # a bias-free text_projection
    flat['head/bias'] = np.zeros(flat['head/kernel'].shape[1],
                                 flat['head/kernel'].dtype)
  extras = {'t': np.reshape(state['logit_scale'], (1,)),
            'b': np.reshape(state['logit_bias'], (1,)) if sigmoid else None,
            'max_len': flat['pos_embedding'].shape[1],
            'out_dim': flat['head/kernel'].shape[1]}
  return flat, fields, extras


def text_to_transformers(flat: Flat, fields: Dict[str, Any],
                         extras: Dict[str, Any], kind: str) -> Flat:
  """`text_tower`'s reverse: the text tower's parameters in transformers'
  names of `kind` ('clip', 'siglip', 'siglip2' or 'aimv2'), with
  `logit_scale` (and SigLIP's `logit_bias`)."""
  if kind not in _NAMES:
    raise ValueError(f'kind={kind!r}; expected one of {tuple(_NAMES)}.')
  pairs = _pairs(kind, fields['num_layers'])
  names = {name: (key, layout) for key, (name, layout) in pairs.items()}
  flat = dict(flat)
  sigmoid = kind in ('siglip', 'siglip2')
  if not sigmoid:
    bias = flat.pop('head/bias', None)
    if bias is not None and np.any(bias):
      raise _error(kind, 'its text_projection has no bias; head/bias is not '
                   'zero.')
  _check_keys(kind, flat, names, 'transformers')
  state = {names[k][0]: _to_torch(np.asarray(v), names[k][1])
           for k, v in flat.items()}
  if kind == 'aimv2':
    state = _split_swiglu(state)
  t = np.asarray(extras['t'])
  state['logit_scale'] = t.reshape(1) if sigmoid else t.reshape(())
  if sigmoid:
    if extras.get('b') is None:
      raise _error(kind, "its logit_bias is missing: extras['b'] is None.")
    state['logit_bias'] = np.reshape(extras['b'], (1,))
  return state

