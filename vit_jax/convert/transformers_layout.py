"""Hugging Face transformers' vision checkpoints <-> timm's names.

A transformers folder holds `config.json` (`model_type`, `architectures`),
`model.safetensors` (or `pytorch_model.bin`) and `preprocessor_config.json`.
Its image tower is read as the timm model that computes the same thing:
the weights renamed to timm's (`to_timm`), the settings and the eval
transform as `transformers_config` says; `converter` takes it from there,
as for a timm folder. `from_timm` goes back, for `--layout=transformers`.

What each architecture becomes (docs/checkpoints.md lists the names):
- `ViTForImageClassification`, `ViTModel` (its pooler is the original's
  `pre_logits`), `DeiTForImageClassificationWithTeacher`, `ViTMAEModel`
  and `ViTMAEForPreTraining` (the encoder; the decoder is dropped):
  separate query/key/value, fused as timm's `qkv`.
- `Dinov2Model`, `Dinov2WithRegistersModel`: LayerScale, registers; the
  registers' table has the class token's entry, which is folded into the
  class token (a constant either way), so vit_jax's table has no prefix;
  written back as a zero entry.
- `CLIPVisionModel[WithProjection]`, `SiglipVisionModel` and the image
  towers of `CLIPModel` and `SiglipModel`: CLIP's `class_embedding` (D,),
  `pre_layrnorm`, `post_layernorm` (on the pooled token: the same as on
  every token) and bias-free `visual_projection` (the head, bias zero);
  SigLIP's MAP head, whose `in_proj` fuses query, key and value.
- `Siglip2VisionModel`, `Siglip2Model`: SigLIP 2's NaFlex tower, SigLIP's
  but for its patch embedding, an nn.Linear of patches flattened in
  (p, p, C) order (timm's conv kernel (D, C, p, p) reordered), and its
  table of a 16 x 16 grid, which the model resizes to each image's.
- `SwinForImageClassification`: its patch merging ends each stage (the
  original release's layout, which `convert.swin` reads).
- `InternVLVisionModel`: InternViT (`convert.internvit`): separate
  projections, LayerScale `lambda_1`, `lambda_2`, query/key norms across
  the heads (`q_norm`, `k_norm`); `layernorm` only without mean pooling.
- `Aimv2VisionModel` and the image tower of `Aimv2Model`: timm's AIMv2
  (`convert.aimv2`: RMSNorm, SwiGLU gate/up as fc1_g/fc1_x, no biases)
  and, with `use_head`, its attention-pooling head (`KVPoolHead_0`, which
  timm lacks: published names beside timm's); `Aimv2Model`'s bias-free
  `visual_projection` is the head, as CLIP's.
- `VivitForVideoClassification`, `VivitModel`,
  `VideoMAEForVideoClassification`, `VideoMAEModel` and
  `VideoMAEForPreTraining` (the encoder; the decoder is dropped): ViT's
  names, but for the 3-D tubelet kernel and VideoMAE's `q_bias`, `v_bias`
  (no key bias); `convert.transformers_video` reads them as a ViViT.
"""

import re
from typing import Any, Dict, Optional, Tuple

import numpy as np

from vit_jax.convert import swin as convert_swin

Flat = Dict[str, np.ndarray]

# architecture: (kind, the prefix of the image tower's names).
ARCHITECTURES = {
    'ViTForImageClassification': ('vit', 'vit.'),
    'ViTModel': ('vit', ''),
    'DeiTForImageClassificationWithTeacher': ('deit', 'deit.'),
    'Dinov2Model': ('dinov2', ''),
    'Dinov2WithRegistersModel': ('dinov2', ''),
    'ViTMAEModel': ('mae', ''),
    'ViTMAEForPreTraining': ('mae', 'vit.'),
    'CLIPVisionModel': ('clip', ''),
    'CLIPVisionModelWithProjection': ('clip', 'vision_model.'),
    'CLIPModel': ('clip', 'vision_model.'),
    'SiglipVisionModel': ('siglip', ''),
    'SiglipModel': ('siglip', 'vision_model.'),
    'Siglip2VisionModel': ('siglip2', ''),
    'Siglip2Model': ('siglip2', 'vision_model.'),
    'SwinForImageClassification': ('swin', 'swin.'),
    'InternVLVisionModel': ('internvl', ''),
    'Aimv2VisionModel': ('aimv2', ''),
    'Aimv2Model': ('aimv2', 'vision_model.'),
    'VivitForVideoClassification': ('vivit', 'vivit.'),
    'VivitModel': ('vivit', ''),
    'VideoMAEForVideoClassification': ('videomae', 'videomae.'),
    'VideoMAEModel': ('videomae', ''),
    'VideoMAEForPreTraining': ('videomae', 'videomae.'),
    # Video: renamed by `convert.timesformer` (timm has no TimeSformer).
    'TimesformerForVideoClassification': ('timesformer', 'timesformer.'),
    'TimesformerModel': ('timesformer', ''),
}
TWO_TOWERS = ('CLIPModel', 'SiglipModel', 'Siglip2Model', 'Aimv2Model')

# (transformers module, timm module) of the modules that map one to one,
# their leaves (weight, bias, ...) alike; {i} is a block's index. Reading
# takes every group of a kind; writing (`from_timm`) the groups of the
# architecture, the first pair that names a timm module.
_VIT_COMMON = [
    ('embeddings.cls_token', 'cls_token'),
    ('embeddings.distillation_token', 'dist_token'),
    ('embeddings.register_tokens', 'reg_token'),
    ('embeddings.position_embeddings', 'pos_embed'),
    ('embeddings.patch_embeddings.projection', 'patch_embed.proj'),
    ('encoder.layer.{i}.attention.output.dense', 'blocks.{i}.attn.proj'),
    ('layernorm', 'norm'),
]
_VIT_BLOCKS = [
    ('encoder.layer.{i}.layernorm_before', 'blocks.{i}.norm1'),
    ('encoder.layer.{i}.layernorm_after', 'blocks.{i}.norm2'),
    ('encoder.layer.{i}.intermediate.dense', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.output.dense', 'blocks.{i}.mlp.fc2'),
    ('classifier', 'head'),
]
_DEIT_HEADS = [
    ('cls_classifier', 'head'),
    ('distillation_classifier', 'head_dist'),
]
_DINOV2_BLOCKS = [
    ('encoder.layer.{i}.norm1', 'blocks.{i}.norm1'),
    ('encoder.layer.{i}.norm2', 'blocks.{i}.norm2'),
    ('encoder.layer.{i}.mlp.fc1', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.mlp.fc2', 'blocks.{i}.mlp.fc2'),
    ('encoder.layer.{i}.layer_scale1.lambda1', 'blocks.{i}.ls1.gamma'),
    ('encoder.layer.{i}.layer_scale2.lambda1', 'blocks.{i}.ls2.gamma'),
]
_SWIGLU = [
    ('encoder.layer.{i}.mlp.weights_in', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.mlp.weights_out', 'blocks.{i}.mlp.fc2'),
]
_VIT = _VIT_COMMON + _VIT_BLOCKS + _DEIT_HEADS + _DINOV2_BLOCKS + _SWIGLU
_CLIP = [
    ('embeddings.patch_embedding', 'patch_embed.proj'),
    ('pre_layrnorm', 'norm_pre'),
    ('encoder.layers.{i}.layer_norm1', 'blocks.{i}.norm1'),
    ('encoder.layers.{i}.layer_norm2', 'blocks.{i}.norm2'),
    ('encoder.layers.{i}.self_attn.out_proj', 'blocks.{i}.attn.proj'),
    ('encoder.layers.{i}.mlp.fc1', 'blocks.{i}.mlp.fc1'),
    ('encoder.layers.{i}.mlp.fc2', 'blocks.{i}.mlp.fc2'),
    ('post_layernorm', 'norm'),
    ('head.probe', 'attn_pool.latent'),
    ('head.attention.out_proj', 'attn_pool.proj'),
    ('head.layernorm', 'attn_pool.norm'),
    ('head.mlp.fc1', 'attn_pool.mlp.fc1'),
    ('head.mlp.fc2', 'attn_pool.mlp.fc2'),
]
_SWIN = [
    ('embeddings.patch_embeddings.projection', 'patch_embed.proj'),
    ('embeddings.norm', 'patch_embed.norm'),
    ('encoder.layers.{i}.blocks.{j}.layernorm_before',
     'layers.{i}.blocks.{j}.norm1'),
    ('encoder.layers.{i}.blocks.{j}.layernorm_after',
     'layers.{i}.blocks.{j}.norm2'),
    ('encoder.layers.{i}.blocks.{j}.attention.self',
     'layers.{i}.blocks.{j}.attn'),
    ('encoder.layers.{i}.blocks.{j}.attention.output.dense',
     'layers.{i}.blocks.{j}.attn.proj'),
    ('encoder.layers.{i}.blocks.{j}.intermediate.dense',
     'layers.{i}.blocks.{j}.mlp.fc1'),
    ('encoder.layers.{i}.blocks.{j}.output.dense',
     'layers.{i}.blocks.{j}.mlp.fc2'),
    # At the end of stage i, as the original release's (`convert.swin`).
    ('encoder.layers.{i}.downsample.reduction',
     'layers.{i}.downsample.reduction'),
    ('encoder.layers.{i}.downsample.norm', 'layers.{i}.downsample.norm'),
    ('layernorm', 'norm'),
    ('classifier', 'head'),
]
_INTERNVL = [
    ('embeddings.cls_token', 'cls_token'),
    ('embeddings.position_embeddings', 'pos_embed'),
    ('embeddings.patch_embeddings.projection', 'patch_embed.proj'),
    ('encoder.layer.{i}.attention.projection_layer', 'blocks.{i}.attn.proj'),
    ('encoder.layer.{i}.attention.q_norm', 'blocks.{i}.attn.q_norm'),
    ('encoder.layer.{i}.attention.k_norm', 'blocks.{i}.attn.k_norm'),
    ('encoder.layer.{i}.layernorm_before', 'blocks.{i}.norm1'),
    ('encoder.layer.{i}.layernorm_after', 'blocks.{i}.norm2'),
    ('encoder.layer.{i}.mlp.fc1', 'blocks.{i}.mlp.fc1'),
    ('encoder.layer.{i}.mlp.fc2', 'blocks.{i}.mlp.fc2'),
    ('encoder.layer.{i}.lambda_1', 'blocks.{i}.ls1.gamma'),
    ('encoder.layer.{i}.lambda_2', 'blocks.{i}.ls2.gamma'),
    ('layernorm', 'norm'),
]
_AIMV2 = [
    ('embeddings.patch_embed', 'patch_embed.proj'),
    ('embeddings.rms_norm', 'patch_embed.norm'),
    ('encoder.layers.{i}.rms_norm1', 'blocks.{i}.norm1'),
    ('encoder.layers.{i}.rms_norm2', 'blocks.{i}.norm2'),
    ('encoder.layers.{i}.attention.out_proj', 'blocks.{i}.attn.proj'),
    ('encoder.layers.{i}.ffn.gate_proj', 'blocks.{i}.mlp.fc1_g'),
    ('encoder.layers.{i}.ffn.up_proj', 'blocks.{i}.mlp.fc1_x'),
    ('encoder.layers.{i}.ffn.down_proj', 'blocks.{i}.mlp.fc2'),
    ('rms_norm', 'norm'),
]
_RULES = {'vit': _VIT, 'deit': _VIT, 'dinov2': _VIT, 'mae': _VIT,
          'clip': _CLIP, 'siglip': _CLIP, 'siglip2': _CLIP, 'swin': _SWIN,
          'internvl': _INTERNVL, 'aimv2': _AIMV2, 'vivit': _VIT,
          'videomae': _VIT + [('fc_norm', 'fc_norm')]}
# Separate projections (transformers' module, its parts in timm's order)
# and timm's fused one.
_QKV = {'vit': ('encoder.layer.{i}.attention.attention.{part}',
                ('query', 'key', 'value'), 'blocks.{i}.attn.qkv'),
        'clip': ('encoder.layers.{i}.self_attn.{part}_proj', ('q', 'k', 'v'),
                 'blocks.{i}.attn.qkv'),
        'swin': ('encoder.layers.{i}.blocks.{j}.attention.self.{part}',
                 ('query', 'key', 'value'), 'layers.{i}.blocks.{j}.attn.qkv'),
        'internvl': ('encoder.layer.{i}.attention.{part}_proj', ('q', 'k', 'v'),
                     'blocks.{i}.attn.qkv'),
        'aimv2': ('encoder.layers.{i}.attention.{part}_proj', ('q', 'k', 'v'),
                  'blocks.{i}.attn.qkv')}
# AIMv2's attention-pooling head: transformers' module -> vit_jax's
# published name, and the layout of its weight (`_head_to_npz`).
_KV_POOL = {'head.k_proj': ('KVPoolHead_0/key', 'heads'),
            'head.v_proj': ('KVPoolHead_0/value', 'heads'),
            'head.output_proj': ('KVPoolHead_0/out', 'out')}
# Parameters that only pre-training uses, or the text side of two towers,
# dropped with a note.
_DROPPED = (r'(\w+\.)?embeddings\.mask_token', r'decoder\..*',
            r'encoder_to_decoder\.weight', 'mask_token',
            r'text_model\..*', 'text_projection.weight', 'logit_scale',
            'logit_bias')


def is_transformers(config: Dict[str, Any]) -> bool:
  """Whether a config.json is transformers' (timm's names `architecture`)."""
  return 'architecture' not in config and (
      'model_type' in config or 'architectures' in config)


def looks_like_transformers(names) -> bool:
  """Whether state dict keys are transformers' (for a bare weights file)."""
  return any(re.match(r'(\w+\.)?(embeddings\.|encoder\.layers?\.\d)', k) or
             k.startswith('vision_model.') for k in names)


def architecture(config: Dict[str, Any]) -> str:
  """The supported architecture a transformers config.json names."""
  names = config.get('architectures') or []
  if not names:
    raise ValueError(
        f"transformers' config.json (model_type "
        f"{config.get('model_type')!r}) names no architectures: vit_jax "
        f'reads {", ".join(ARCHITECTURES)}.')
  if names[0] not in ARCHITECTURES:
    raise ValueError(f"transformers' {names[0]} is not supported (supported: "
                     f'{", ".join(ARCHITECTURES)}).')
  return names[0]


def kind(config: Dict[str, Any]) -> str:
  """'vit', 'deit', 'dinov2', 'mae', 'clip', 'siglip', 'siglip2', 'swin',
  'internvl', 'aimv2', 'vivit' or 'videomae'."""
  return ARCHITECTURES[architecture(config)][0]


def vision_config(config: Dict[str, Any]) -> Dict[str, Any]:
  """The image tower's settings (a two-tower model's `vision_config`)."""
  return config.get('vision_config') or config


def _indices(template: str) -> str:
  """`template` as a regex: '{i}' an index (group i), the rest literally."""
  parts = re.split(r'\{(\w)\}', template)
  return ''.join(re.escape(p) if k % 2 == 0 else rf'(?P<{p}>\d+)'
                 for k, p in enumerate(parts))


def _pattern(template: str) -> re.Pattern:
  return re.compile(_indices(template) + r'(?:\.(?P<leaf>\w+))?')


def _fields(match: re.Match) -> Dict[str, str]:
  """The indices that a match of `_indices` found, by name."""
  return {k: v for k, v in match.groupdict().items()
          if k not in ('part', 'leaf')}


def _rename(key: str, rules, source: int) -> Optional[str]:
  """The other side's name of `key` (source 0: transformers, 1: timm)."""
  for pair in rules:
    match = _pattern(pair[source]).fullmatch(key)
    if match:
      leaf = match['leaf']
      return pair[1 - source].format(**_fields(match)) + (
          f'.{leaf}' if leaf else '')
  return None


def _image_tower(state: Flat, prefix: str) -> Tuple[Flat, list]:
  """The image tower's names without `prefix` (its heads have none); what
  is dropped: pre-training's parts, a two-tower model's text side."""
  tower, dropped = {}, []
  for key, value in state.items():
    if any(re.fullmatch(p, key) for p in _DROPPED):
      dropped.append(key)
    else:
      tower[key[len(prefix):] if prefix and key.startswith(prefix) else
            key] = value
  return tower, dropped


def _qkv(family: str):
  """(transformers' module, its parts, timm's module) of the projections."""
  return _QKV[{'clip': 'clip', 'siglip': 'clip', 'siglip2': 'clip',
               'swin': 'swin', 'internvl': 'internvl',
               'aimv2': 'aimv2'}.get(family, 'vit')]


def _fuse(state: Flat, family: str) -> Tuple[Flat, Flat]:
  """(timm's fused qkv by name, the rest) of separate projections."""
  module, parts, fused = _qkv(family)
  before, after = module.split('{part}')
  pattern = re.compile(_indices(before) + f'(?P<part>{"|".join(parts)})' +
                       re.escape(after) + r'\.(?P<leaf>weight|bias)')
  found, rest = {}, {}
  for key, value in state.items():
    match = pattern.fullmatch(key)
    if match is None:
      rest[key] = value
    else:
      name = f"{fused.format(**_fields(match))}.{match['leaf']}"
      found.setdefault(name, [None] * 3)[parts.index(match['part'])] = value
  for name, values in found.items():
    if any(v is None for v in values):
      raise ValueError(f'{name}: query, key and value are not all there.')
  return {name: np.concatenate(v) for name, v in found.items()}, rest


def _split(state: Flat, family: str) -> Tuple[Flat, Flat]:
  """(transformers' separate projections, the rest) of timm's fused qkv."""
  module, parts, fused = _qkv(family)
  pattern = _pattern(fused)
  out, rest = {}, {}
  for key, value in state.items():
    match = pattern.fullmatch(key)
    if match is None or match['leaf'] is None:
      rest[key] = value
      continue
    for part, piece in zip(parts, np.split(value, 3)):
      out[f"{module.format(part=part, **_fields(match))}."
          f"{match['leaf']}"] = piece
  return out, rest


def to_timm(state: Flat, config: Dict[str, Any]) -> Tuple[Flat, Flat, list]:
  """(timm's state dict of the image tower, published names that timm has
  no name for (ViTModel's pooler: `pre_logits`), dropped names)."""
  arch = architecture(config)
  family, prefix = ARCHITECTURES[arch]
  tower, dropped = _image_tower(state, prefix)
  if family == 'siglip2':
    tower = _patches_as_conv(tower, vision_config(config)['patch_size'])
  if family == 'videomae':
    tower = _videomae_biases(tower)
  fused, tower = _fuse(tower, family)
  out, extra, unknown = dict(fused), {}, []
  for key, value in tower.items():
    name = _rename(key, _RULES[family], 0)
    if name is not None:
      out[name] = value
    elif key == 'embeddings.class_embedding':  # CLIP's (D,)
      out['cls_token'] = value.reshape(1, 1, -1)
    elif key == 'embeddings.position_embedding.weight':  # an nn.Embedding
      out['pos_embed'] = value[None]
    elif key.startswith('head.attention.in_proj_'):  # torch's fused MHA
      leaf = 'weight' if key.endswith('weight') else 'bias'
      q, kv = np.split(value, [value.shape[0] // 3])
      out[f'attn_pool.q.{leaf}'], out[f'attn_pool.kv.{leaf}'] = q, kv
    elif key == 'visual_projection.weight':  # CLIP's, bias-free
      out['head.weight'] = value
      out['head.bias'] = np.zeros(value.shape[0], value.dtype)
    elif key.startswith('pooler.dense.'):  # ViTModel's tanh pooler
      leaf = 'kernel' if key.endswith('weight') else 'bias'
      extra[f'pre_logits/{leaf}'] = value.T if leaf == 'kernel' else value
    elif family == 'aimv2' and key.startswith('head.'):
      extra.update(_head_to_npz(key, value, vision_config(config)[
          'num_attention_heads']))
    else:
      unknown.append(prefix + key)
  if unknown:
    raise ValueError(f"transformers' {arch}: {len(unknown)} name(s) have no "
                     f'counterpart in vit_jax: {", ".join(unknown[:6])}.')
  if arch == 'Dinov2WithRegistersModel':
    out = _fold_class_entry(out)
  return out, extra, dropped


def _videomae_biases(tower: Flat) -> Flat:
  """VideoMAE's query and value biases (`q_bias`, `v_bias`; transformers
  5 reads them as `query.bias`, `value.bias` too) as ViT's, and a zero key
  bias, which it lacks (`transformers_video` drops it again)."""
  out = {}
  for key, value in tower.items():
    match = re.fullmatch(r'(.*\.attention\.attention\.)([qv])_bias', key)
    out[f'{match[1]}{"query" if match[2] == "q" else "value"}.bias'
        if match else key] = value
  for key, value in list(out.items()):
    match = re.fullmatch(r'(.*\.attention\.attention\.)query\.bias', key)
    if match:
      out[f'{match[1]}key.bias'] = np.zeros_like(value)
  return out


def _video_biases(out: Flat, config: Dict[str, Any]) -> Flat:
  """The projection biases that a video config's attention has (`export`
  wrote zeros for those it lacks): ViViT's three or none, VideoMAE's
  query and value (`q_bias`, `v_bias`) or none."""
  videomae = config['model_type'] == 'videomae'
  keep = config['qv_bias'] if videomae else config['qkv_bias']
  renamed = {}
  for key, value in out.items():
    match = re.fullmatch(r'(.*\.attention\.attention\.)(query|key|value)'
                         r'\.bias', key)
    if match is None:
      renamed[key] = value
    elif keep and not videomae:
      renamed[key] = value
    elif keep and match[2] != 'key':
      renamed[f'{match[1]}{match[2][0]}_bias'] = value
  return renamed


def _head_to_npz(key: str, value: np.ndarray, heads: int) -> Flat:
  """AIMv2's head parameter `key` (torch's layout) by its published name:
  the probe (1, 1, D); key and value kernels (D, H, K), out's (H, K, D)."""
  if key == 'head.cls_token':
    return {'KVPoolHead_0/probe': value}
  module, leaf = key.rsplit('.', 1)
  if module not in _KV_POOL:
    raise ValueError(f"transformers' AIMv2 head: {key} has no counterpart "
                     'in vit_jax.')
  name, layout = _KV_POOL[module]
  if leaf == 'bias':
    return {f'{name}/bias': value}
  kernel = (value.T.reshape(value.shape[1], heads, -1) if layout == 'heads'
            else value.T.reshape(heads, -1, value.shape[0]))
  return {f'{name}/kernel': kernel}


def _head_from_npz(extra: Flat) -> Flat:
  """`_head_to_npz`'s reverse, of the published names in `extra`."""
  out = {}
  if 'KVPoolHead_0/probe' in extra:
    out['head.cls_token'] = extra['KVPoolHead_0/probe']
  for module, (name, layout) in _KV_POOL.items():
    kernel = extra.get(f'{name}/kernel')
    if kernel is not None and layout == 'heads':  # (D, H, K) -> (H K, D)
      out[f'{module}.weight'] = kernel.reshape(kernel.shape[0], -1).T
    elif kernel is not None:  # (H, K, D) -> (D, H K)
      out[f'{module}.weight'] = kernel.reshape(-1, kernel.shape[-1]).T
    if f'{name}/bias' in extra:
      out[f'{module}.bias'] = extra[f'{name}/bias']
  return out


_PATCH_LINEAR = 'embeddings.patch_embedding.weight'


def _patches_as_conv(tower: Flat, patch: int) -> Flat:
  """SigLIP 2's patch embedding, a Linear (D, p * p * C) of patches
  flattened in (p, p, C) order, as the conv kernel (D, C, p, p) of the
  same sums."""
  weight = tower[_PATCH_LINEAR]
  width = weight.shape[0]
  kernel = weight.reshape(width, patch, patch, -1).transpose(0, 3, 1, 2)
  return dict(tower, **{_PATCH_LINEAR: kernel})


def _patches_as_linear(out: Flat) -> Flat:
  """`_patches_as_conv`'s reverse."""
  kernel = out[_PATCH_LINEAR]
  return dict(out, **{_PATCH_LINEAR: kernel.transpose(0, 2, 3, 1).reshape(
      kernel.shape[0], -1)})


def _fold_class_entry(state: Flat) -> Flat:
  """The class token's table entry added to it: the table then covers the
  patches only (timm's no_embed_class), as the registers have none."""
  table = state['pos_embed']
  return dict(state, cls_token=state['cls_token'] + table[:, :1],
              pos_embed=table[:, 1:])


def _unfold_class_entry(state: Flat) -> Flat:
  """The registers' table with its class entry back, of zeros: the token
  as it is plus a zero entry is the sum that `_fold_class_entry` made, so
  the outputs are equal."""
  table = state['pos_embed']
  return dict(state, pos_embed=np.concatenate(
      [np.zeros_like(table[:, :1]), table], axis=1))


# Top-level modules outside the image tower's prefix: its heads.
_OUTSIDE = ('classifier', 'cls_classifier', 'distillation_classifier',
            'visual_projection', 'fc_norm')


def _written_rules(arch: str, config: Dict[str, Any]) -> list:
  """The rules that write `arch`, the preferred name first."""
  family = ARCHITECTURES[arch][0]
  if family == 'dinov2':
    swiglu = _SWIGLU if config.get('use_swiglu_ffn') else []
    return _VIT_COMMON + swiglu + _DINOV2_BLOCKS
  if family == 'deit':
    return _DEIT_HEADS + _VIT_COMMON + _VIT_BLOCKS
  if family in ('vit', 'mae', 'vivit'):
    return _VIT_COMMON + _VIT_BLOCKS
  if family == 'videomae':
    return _VIT_COMMON + _VIT_BLOCKS + [('fc_norm', 'fc_norm')]
  return _RULES[family]


def _special_from_timm(state: Flat, extra: Flat,
                       family: str) -> Tuple[Flat, Flat]:
  """(transformers' names of what `to_timm` reads case by case, the rest
  of `state`)."""
  state, out = dict(state), {}
  if family in ('clip', 'siglip', 'siglip2'):  # an nn.Embedding
    out['embeddings.position_embedding.weight'] = state.pop('pos_embed')[0]
  if family == 'clip':
    out['embeddings.class_embedding'] = state.pop('cls_token').reshape(-1)
    if 'head.weight' in state:  # bias-free: `export_architecture` checks
      out['visual_projection.weight'] = state.pop('head.weight')
      state.pop('head.bias')
  for leaf in ('weight', 'bias'):
    if f'attn_pool.q.{leaf}' in state:  # torch's fused MHA
      out[f'head.attention.in_proj_{leaf}'] = np.concatenate(
          [state.pop(f'attn_pool.q.{leaf}'), state.pop(f'attn_pool.kv.{leaf}')])
  if 'pre_logits/kernel' in extra:  # ViTModel's tanh pooler
    out['pooler.dense.weight'] = extra['pre_logits/kernel'].T
    out['pooler.dense.bias'] = extra['pre_logits/bias']
  if family == 'aimv2':
    out.update(_head_from_npz(extra))
    if 'pos_embed' in state:  # an nn.Embedding
      out['embeddings.position_embedding.weight'] = state.pop('pos_embed')[0]
  return out, state


def from_timm(state: Flat, extra: Flat, config: Dict[str, Any]) -> Flat:
  """transformers' state dict of `config` (`config_json`'s) from timm's of
  the image tower and the published names that timm has no name for
  (`pre_logits`, the pooler): the inverse of `to_timm`."""
  arch = architecture(config)
  family, prefix = ARCHITECTURES[arch]
  if family == 'swin':
    state = convert_swin.to_original(state)
  if arch == 'Dinov2WithRegistersModel':
    state = _unfold_class_entry(state)
  out, state = _special_from_timm(state, extra, family)
  split, state = _split(state, family)
  out.update(split)
  rules, unknown = _written_rules(arch, config), []
  for key, value in state.items():
    name = _rename(key, rules, 1)
    if name is None:
      unknown.append(key)
    else:
      out[name] = value
  if unknown:
    raise ValueError(f"transformers' {arch} has no counterpart of timm's "
                     f'{", ".join(unknown[:6])}.')
  if family == 'siglip2':
    out = _patches_as_linear(out)
  if family == 'internvl' and not config['attention_bias']:
    # `export` wrote zeros for names.npz_to_timm: transformers has none.
    out = {k: v for k, v in out.items()
           if not re.fullmatch(r'encoder\.layer\.\d+\.attention\.[qkv]_proj'
                               r'\.bias', k)}
  if family in ('vivit', 'videomae'):
    out = _video_biases(out, config)
  if arch == 'Dinov2WithRegistersModel':
    # Its embeddings always hold one, which only masked image modeling
    # uses; zeros are transformers' own init.
    out['embeddings.mask_token'] = np.zeros((1, config['hidden_size']),
                                            np.float32)
  return {k if k.split('.')[0] in _OUTSIDE else prefix + k: v
          for k, v in out.items()}
