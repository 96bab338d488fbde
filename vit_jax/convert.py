r"""Weights in timm's layout <-> the published .npz format.

  python -m vit_jax.convert model.safetensors ViT-B_16.npz   # timm -> .npz
  python -m vit_jax.convert ViT-B_16.npz model.safetensors   # .npz -> timm

The preset is inferred from the shapes (`--model_name` to choose it); it gives
the number of heads, which timm's fused `qkv` does not show. ViTs (class
token or mean pooling), hybrids and MLP-Mixers are converted. timm's
`.safetensors` is read with safetensors' numpy API, a torch `.pth`/`.bin`
with `torch.load(weights_only=True)` (torch and safetensors are optional:
`pip install -e '.[convert]'`).
"""

import os
import re
from typing import Dict

from absl import app
from absl import flags
from flax import traverse_util
import numpy as np

from vit_jax import checkpoint
from vit_jax import models

FLAGS = flags.FLAGS

Flat = Dict[str, np.ndarray]

# (timm key, npz key) regexes of the parameters that map one to one; the
# values are transposed by `_to_npz` / `_to_timm` as their ranks say.
_VIT = [
    (r'cls_token', 'cls'),
    (r'pos_embed', 'Transformer/posembed_input/pos_embedding'),
    (r'patch_embed\.proj\.(weight|bias)', r'embedding/\1'),
    (r'blocks\.(\d+)\.norm1\.(weight|bias)',
     r'Transformer/encoderblock_\1/LayerNorm_0/\2'),
    (r'blocks\.(\d+)\.norm2\.(weight|bias)',
     r'Transformer/encoderblock_\1/LayerNorm_2/\2'),
    (r'blocks\.(\d+)\.mlp\.fc1\.(weight|bias)',
     r'Transformer/encoderblock_\1/MlpBlock_3/Dense_0/\2'),
    (r'blocks\.(\d+)\.mlp\.fc2\.(weight|bias)',
     r'Transformer/encoderblock_\1/MlpBlock_3/Dense_1/\2'),
    (r'norm\.(weight|bias)', r'Transformer/encoder_norm/\1'),
    (r'head\.(weight|bias)', r'head/\1'),
]
# The hybrids' ResNet (timm's ResNetV2 in `patch_embed.backbone`).
_BACKBONE = r'patch_embed\.backbone\.'
_UNIT = _BACKBONE + r'stages\.(\d+)\.blocks\.(\d+)\.'
_HYBRID = [
    (_BACKBONE + r'stem\.conv\.weight', 'conv_root/weight'),
    (_BACKBONE + r'stem\.norm\.(weight|bias)', r'gn_root/\1'),
    (_UNIT + r'downsample\.conv\.weight',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/conv_proj/weight'),
    (_UNIT + r'downsample\.norm\.(weight|bias)',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/gn_proj/{m[3]}'),
    (_UNIT + r'conv(\d)\.weight',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/conv{m[3]}/weight'),
    (_UNIT + r'norm(\d)\.(weight|bias)',
     lambda m: f'block{int(m[1]) + 1}/unit{int(m[2]) + 1}/gn{m[3]}/{m[4]}'),
]
_MIXER = [
    (r'stem\.proj\.(weight|bias)', r'stem/\1'),
    (r'blocks\.(\d+)\.norm1\.(weight|bias)', r'MixerBlock_\1/LayerNorm_0/\2'),
    (r'blocks\.(\d+)\.norm2\.(weight|bias)', r'MixerBlock_\1/LayerNorm_1/\2'),
    (r'blocks\.(\d+)\.mlp_tokens\.fc(\d)\.(weight|bias)',
     lambda m: f'MixerBlock_{m[1]}/token_mixing/Dense_{int(m[2]) - 1}/{m[3]}'),
    (r'blocks\.(\d+)\.mlp_channels\.fc(\d)\.(weight|bias)',
     lambda m: f'MixerBlock_{m[1]}/channel_mixing/Dense_{int(m[2]) - 1}/'
     f'{m[3]}'),
    (r'norm\.(weight|bias)', r'pre_head_layer_norm/\1'),
    (r'head\.(weight|bias)', r'head/\1'),
]
_ATTENTION = re.compile(r'blocks\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)')
_BLOCK_NPZ = 'Transformer/encoderblock_{}/MultiHeadDotProductAttention_1/'


def _leaf_to_npz(value: np.ndarray) -> np.ndarray:
  """torch's (out, in[, kh, kw]) weights -> flax's ([kh, kw,] in, out)."""
  if value.ndim == 4:
    return value.transpose(2, 3, 1, 0)
  return value.T if value.ndim == 2 else value


def _leaf_to_timm(value: np.ndarray) -> np.ndarray:
  if value.ndim == 4:
    return value.transpose(3, 2, 0, 1)
  return value.T if value.ndim == 2 else value


def _rules(mixer: bool) -> list:
  return _MIXER if mixer else _VIT + _HYBRID


def _attention_to_npz(state: Flat, heads: int) -> Flat:
  """The fused qkv and proj of each block -> query/key/value/out."""
  out = {}
  for key, value in state.items():
    match = _ATTENTION.fullmatch(key)
    if not match:
      continue
    prefix = _BLOCK_NPZ.format(match[1])
    if match[2] == 'qkv':
      for name, part in zip(('query', 'key', 'value'), np.split(value, 3)):
        if match[3] == 'weight':  # (H K, D) -> (D, H, K)
          out[f'{prefix}{name}/kernel'] = part.T.reshape(
              part.shape[1], heads, -1)
        else:
          out[f'{prefix}{name}/bias'] = part.reshape(heads, -1)
    elif match[3] == 'weight':  # (D, H K) -> (H, K, D)
      out[f'{prefix}out/kernel'] = value.T.reshape(heads, -1, value.shape[0])
    else:
      out[f'{prefix}out/bias'] = value
  return out


def _npz_name(key: str, rules) -> str:
  """The published name of timm's `key`, or None."""
  for pattern, target in rules:
    match = re.fullmatch(pattern, key)
    if match:
      name = match.expand(target) if isinstance(target, str) else target(
          match)
      norm = re.search(r'(LayerNorm_\d|encoder_norm|pre_head_layer_norm|'
                       r'gn\w*)/weight$', name)
      return re.sub(r'/weight$', '/scale' if norm else '/kernel', name)
  return None


def timm_to_npz(state: Flat, heads: int) -> Flat:
  """A timm state dict (numpy) -> '/'-joined published names."""
  rules = _rules(mixer=any(k.startswith('stem.') for k in state))
  out = _attention_to_npz(state, heads)
  for key, value in state.items():
    if _ATTENTION.fullmatch(key):
      continue
    name = _npz_name(key, rules)
    if name is None:
      raise ValueError(f'timm key {key!r} has no counterpart in vit_jax (a '
                       'norm or head that vit_jax does not have).')
    out[name] = _leaf_to_npz(np.asarray(value))
  return out


def _timm_keys(flat: Flat) -> list:
  """Every one-to-one timm key that a model with these npz names has."""
  blocks = {int(m[1]) for k in flat
            for m in [re.search(r'(?:encoderblock|MixerBlock)_(\d+)/', k)] if m}
  if any(k.startswith('MixerBlock_') for k in flat):
    top, inner = ['stem.proj', 'norm', 'head'], [
        'norm1', 'norm2', 'mlp_tokens.fc1', 'mlp_tokens.fc2',
        'mlp_channels.fc1', 'mlp_channels.fc2']
  else:
    top = ['patch_embed.proj', 'norm', 'head']
    inner = ['norm1', 'norm2', 'mlp.fc1', 'mlp.fc2']
  modules = top + [f'blocks.{i}.{n}' for i in sorted(blocks) for n in inner]
  keys = ['cls_token', 'pos_embed'] + [f'{m}.{w}' for m in modules
                                       for w in ('weight', 'bias')]
  backbone = 'patch_embed.backbone.'
  keys += [backbone + 'stem.conv.weight', backbone + 'stem.norm.weight',
           backbone + 'stem.norm.bias']
  for key in flat:  # the ResNet's units, as the .npz has them
    match = re.match(r'block(\d+)/unit(\d+)/(conv|gn)(\w+)/', key)
    if match:
      unit = f'{backbone}stages.{int(match[1]) - 1}.blocks.{int(match[2]) - 1}.'
      layer = ('downsample.' + ('conv' if match[3] == 'conv' else 'norm')
               if match[4] == '_proj' else f'{match[3].replace("gn", "norm")}'
               f'{match[4]}')
      keys += [f'{unit}{layer}.weight'] + (
          [f'{unit}{layer}.bias'] if match[3] == 'gn' else [])
  return keys


def npz_to_timm(flat: Flat) -> Flat:
  """'/'-joined published names -> a timm state dict (numpy)."""
  rules = _rules(mixer=any(k.startswith('MixerBlock_') for k in flat))
  names = {_npz_name(key, rules): key for key in _timm_keys(flat)}
  out, attention = {}, {}
  for key, value in flat.items():
    match = re.fullmatch(r'Transformer/encoderblock_(\d+)/'
                         r'MultiHeadDotProductAttention_1/(\w+)/(\w+)', key)
    if match:
      attention[match[1], match[2], match[3]] = value
    elif key in names:
      out[names[key]] = _leaf_to_timm(value)
    else:
      raise ValueError(f'{key!r} has no counterpart in timm (a pre_logits '
                       'or MAP head, or another position scheme).')
  for (block, name, kind), value in attention.items():
    if name != 'out':
      continue
    prefix = f'blocks.{block}.attn.'
    qkv = [attention[block, n, kind] for n in ('query', 'key', 'value')]
    if kind == 'kernel':  # (D, H, K) x 3 -> (3 H K, D); (H, K, D) -> (D, H K)
      out[prefix + 'qkv.weight'] = np.concatenate(
          [q.reshape(q.shape[0], -1).T for q in qkv])
      out[prefix + 'proj.weight'] = value.reshape(-1, value.shape[-1]).T
    else:
      out[prefix + 'qkv.bias'] = np.concatenate([q.reshape(-1) for q in qkv])
      out[prefix + 'proj.bias'] = value
  return out


def _resnet_layers(flat: Flat):
  """Units per stage of a hybrid's ResNet, None for a plain ViT."""
  if 'conv_root/kernel' not in flat:
    return None
  units = {}
  for key in flat:
    match = re.match(r'block(\d+)/unit(\d+)/', key)
    if match:
      units[int(match[1])] = max(units.get(int(match[1]), 0), int(match[2]))
  return tuple(units[i] for i in sorted(units))


def infer_preset(flat: Flat) -> str:
  """The preset whose shapes these published names have."""
  def dims(name):
    config = models.MODEL_CONFIGS[name]
    if name.startswith('Mixer-'):
      return ('mixer', config.hidden_dim, config.num_blocks,
              config.patches.size[0], config.tokens_mlp_dim)
    resnet = config.get('resnet')
    return ('vit', config.hidden_size, config.transformer.num_layers,
            config.patches.size[0], config.transformer.mlp_dim,
            config.classifier, tuple(resnet.num_layers) if resnet else None)
  blocks = {m[1] for k in flat
            for m in [re.search(r'(?:encoderblock|MixerBlock)_(\d+)/', k)] if m}
  if 'stem/kernel' in flat:
    kernel = flat['stem/kernel']
    want = ('mixer', kernel.shape[-1], len(blocks), kernel.shape[0],
            flat['MixerBlock_0/token_mixing/Dense_0/kernel'].shape[-1])
  else:
    kernel = flat['embedding/kernel']
    want = ('vit', kernel.shape[-1], len(blocks), kernel.shape[0],
            flat['Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel'].shape[
                -1], 'token' if 'cls' in flat else 'gap', _resnet_layers(flat))
  found = [name for name in models.MODEL_CONFIGS
           if not name.startswith('LiT-') and dims(name) == want]
  if not found:
    raise ValueError(f'No preset has these shapes ({want}); give '
                     '--model_name.')
  return found[0]


def read_timm(path: str) -> Flat:
  """A timm checkpoint file as numpy arrays; never unpickles objects."""
  if path.endswith('.safetensors'):
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    return load_file(path)
  if not path.endswith(('.pth', '.bin', '.pt')):
    raise ValueError(f'{path}: expected a .safetensors, .pth or .bin file.')
  import pickle  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except pickle.UnpicklingError as e:
    raise ValueError(
        f'{path} holds pickled Python objects besides tensors, which are '
        'never loaded here: save its state_dict() as .safetensors.') from e
  state = state.get('state_dict', state)
  return {k: v.float().numpy() for k, v in state.items()}


def fetch(name: str, timeout: float = 5.) -> str:
  """Downloads the hub checkpoint `name` (e.g. timm/vit_base_patch16_224.
  augreg_in21k) into huggingface_hub's cache; fails in seconds offline."""
  import socket  # pylint: disable=g-import-not-at-top
  try:
    socket.create_connection(('huggingface.co', 443), timeout=timeout).close()
  except OSError as e:
    raise ConnectionError(
        f'Cannot reach huggingface.co to fetch {name} ({e}). Download its '
        'model.safetensors where there is network, then convert the file.'
    ) from e
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  return huggingface_hub.hf_hub_download(name, 'model.safetensors')


def convert(src: str, dst: str, model_name: str = None) -> str:
  """Converts `src` to `dst`, by their extensions; returns the preset."""
  if src.endswith('.npz'):
    flat = checkpoint.published_flat(checkpoint.load(src))
    model_name = model_name or infer_preset(flat)
    from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
    save_file({k: np.ascontiguousarray(v, np.float32)
               for k, v in npz_to_timm(flat).items()}, dst)
    return model_name
  if not os.path.exists(src) and re.fullmatch(r'[\w.-]+/[\w.-]+', src):
    src = fetch(src)
  state = read_timm(src)
  model_name = model_name or infer_preset(timm_to_npz(state, heads=1))
  heads = models.MODEL_CONFIGS[model_name].get('transformer', {}).get(
      'num_heads', 1)
  flat = timm_to_npz(state, heads)
  checkpoint.save(traverse_util.unflatten_dict(flat, sep='/'), dst)
  return model_name


def main(argv):
  if len(argv) != 3:
    raise app.UsageError('Usage: python -m vit_jax.convert SRC DST')
  name = convert(argv[1], argv[2], FLAGS.model_name)
  print(f'{argv[1]} -> {argv[2]} ({name})')


if __name__ == '__main__':
  # Defined here, not on import, so that other modules may define theirs.
  flags.DEFINE_string('model_name', None,
                      'Preset (default: inferred from the shapes).')
  app.run(main)
