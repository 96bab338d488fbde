"""AIMv2: timm's `aimv2_*`, transformers' Aimv2VisionModel and Aimv2Model
converted with no flags, against the outputs they computed themselves, and
written back.

The golden folders and outputs (tests/data/aimv2) come from
scripts/make_aimv2_golden.py, with torch, timm and transformers; these
tests need neither.
"""

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import transform
from vit_jax.convert import transformers_text
from vit_jax.data import tokenizers

FOLDER = os.path.join(helpers.DATA, 'aimv2')
GOLDEN = np.load(os.path.join(FOLDER, 'golden.npz'))
IMAGES = GOLDEN['images']
# timm.data's OPENAI_CLIP_MEAN/STD: AIMv2's pretrained_cfg.
CLIP = ([0.48145466, 0.4578275, 0.40821073],
        [0.26862954, 0.26130258, 0.27577711])


@pytest.fixture(scope='module')
def timm_npz(tmp_path_factory):
  npz = str(tmp_path_factory.mktemp('aimv2') / 'timm.npz')
  assert convert.convert(os.path.join(FOLDER, 'timm'), npz) == 'AIMv2-testing'
  return npz


def _apply(pretrained, images, **kw):
  return np.asarray(pretrained.model.apply(
      {'params': pretrained.params}, images, train=False, **kw))


def test_timm_gives_timms_features(timm_npz):
  """No flags: the preset from timm's architecture and the shapes, nothing
  to add to it; CLIP's mean and std; timm's pooled features."""
  recorded = transform.load_transform(timm_npz)
  assert recorded.get('model') is None
  assert (recorded['mean'], recorded['std']) == CLIP
  pretrained = models.from_pretrained(timm_npz)
  assert pretrained.transform.size == 56
  np.testing.assert_allclose(_apply(pretrained, IMAGES), GOLDEN['timm'],
                             rtol=1e-5, atol=1e-5)


def test_timm_scanned_blocks(timm_npz):
  """The published per-block names (LayerNorm_0, LayerNorm_2, RMSNorms) load into the
  scanned, rematerialized encoder, which computes the same."""
  pretrained = models.from_pretrained(
      timm_npz, transformer={'scan': True, 'remat_policy': 'full'})
  np.testing.assert_allclose(_apply(pretrained, IMAGES), GOLDEN['timm'],
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('norm', [False, True])
def test_timm_intermediates(timm_npz, norm):
  """timm's `forward_intermediates` of both blocks (NCHW there, NHWC
  here), with and without the final RMSNorm."""
  pretrained = models.from_pretrained(timm_npz)
  got = pretrained.model.apply(
      {'params': pretrained.params}, IMAGES, method='forward_intermediates',
      indices=2, norm=norm, intermediates_only=True)
  key = 'timm/blocks_norm' if norm else 'timm/blocks'
  assert len(got) == 2
  for i, maps in enumerate(got):
    np.testing.assert_allclose(maps, GOLDEN[f'{key}/{i}'], rtol=1e-5,
                               atol=1e-4)


def test_timm_back_bit_for_bit(timm_npz, tmp_path):
  """.npz -> timm gives timm's own state dict: fc1_g/fc1_x apart, the
  norms' weights without biases, patch_embed.norm."""
  back = str(tmp_path / 'back.safetensors')
  assert convert.convert(timm_npz, back) == 'AIMv2-testing'
  want = load_file(os.path.join(FOLDER, 'timm', 'model.safetensors'))
  got = load_file(back)
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)


def test_timm_without_pooling_gives_every_token(tmp_path):
  """global_pool='': every patch token after the final norm (timm's last
  block's normalized map, from its forward_intermediates)."""
  folder = tmp_path / 'timm'
  shutil.copytree(os.path.join(FOLDER, 'timm'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['global_pool'] = config['model_args']['global_pool'] = ''
  (folder / 'config.json').write_text(json.dumps(config))
  npz = str(tmp_path / 'w.npz')
  convert.convert(str(folder), npz)
  assert transform.load_transform(npz)['model'] == {'classifier': 'unpooled'}
  tokens = _apply(models.from_pretrained(npz), IMAGES)
  np.testing.assert_allclose(tokens, GOLDEN['timm/blocks_norm/1'].reshape(
      tokens.shape), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize('setting,value,message', [
    ('qkv_bias', True, 'qkv_bias=True'),
    ('class_token', True, 'class_token=True'),
    ('global_pool', 'token', "global_pool='token'"),
    ('qk_norm', True, 'qk_norm=True'),
    ('reg_tokens', 4, 'reg_tokens=4'),
])
def test_timm_settings_that_change_the_computation_are_refused(
    tmp_path, setting, value, message):
  folder = tmp_path / 'timm'
  shutil.copytree(os.path.join(FOLDER, 'timm'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['model_args'][setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'w.npz'))


@pytest.fixture(scope='module')
def transformers_npz(tmp_path_factory):
  """transformers' Aimv2VisionModel folders, with and without the head,
  converted with no flags."""
  folder = tmp_path_factory.mktemp('aimv2_transformers')
  out = {}
  for name in ('vision', 'vision_nohead'):
    out[name] = str(folder / f'{name}.npz')
    assert convert.convert(os.path.join(FOLDER, name),
                           out[name]) == 'AIMv2-testing'
  return out


@pytest.mark.parametrize('name,classifier,output', [
    ('vision', 'kv_pool', 'pooler_output'),
    ('vision_nohead', 'unpooled', 'last_hidden_state'),
])
def test_transformers_gives_its_outputs(transformers_npz, name, classifier,
                                        output):
  """use_head: the attention pooling's pooler_output ('kv_pool'); without
  it, last_hidden_state; preprocessor_config.json's CLIP mean and std."""
  npz = transformers_npz[name]
  recorded = transform.load_transform(npz)
  assert recorded['model'] == {'classifier': classifier}
  assert (recorded['mean'], recorded['std']) == CLIP
  pretrained = models.from_pretrained(npz)
  np.testing.assert_allclose(_apply(pretrained, IMAGES),
                             GOLDEN[f'{name}/{output}'], rtol=1e-5, atol=1e-5)
  if name == 'vision':  # every token: the final tokens of the blocks
    tokens, _ = pretrained.model.apply(
        {'params': pretrained.params}, IMAGES, method='forward_intermediates',
        indices=1)
    np.testing.assert_allclose(tokens, GOLDEN['vision/last_hidden_state'],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', ['vision', 'vision_nohead'])
def test_transformers_back_bit_for_bit(transformers_npz, tmp_path, name):
  """--layout=transformers writes the Aimv2VisionModel it came from: its
  weights (the head's too) and the settings of its config.json."""
  dst = tmp_path / name
  convert.convert(transformers_npz[name], str(dst), layout='transformers')
  want = load_file(os.path.join(FOLDER, name, 'model.safetensors'))
  got = load_file(str(dst / 'model.safetensors'))
  assert sorted(got) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value, err_msg=key)
  config = json.loads((dst / 'config.json').read_text())
  original = json.loads(open(os.path.join(FOLDER, name,
                                          'config.json')).read())
  for key in ('architectures', 'model_type', 'hidden_size',
              'intermediate_size', 'num_hidden_layers', 'num_attention_heads',
              'patch_size', 'image_size', 'rms_norm_eps', 'hidden_act',
              'qkv_bias', 'mlp_bias', 'use_head', 'is_native'):
    assert config[key] == original[key], key


def test_timm_written_as_transformers(timm_npz, tmp_path):
  """timm's AIMv2 as an Aimv2VisionModel without head: timm's features
  are the mean of its last_hidden_state (scripts/make_aimv2_golden.py
  --check runs it with transformers)."""
  dst = tmp_path / 'hf'
  convert.convert(timm_npz, str(dst), layout='transformers')
  config = json.loads((dst / 'config.json').read_text())
  assert config['architectures'] == ['Aimv2VisionModel']
  assert (config['use_head'], config['image_size']) == (False, 56)
  back = str(tmp_path / 'back.npz')
  assert convert.convert(str(dst), back) == 'AIMv2-testing'
  tokens = _apply(models.from_pretrained(back), IMAGES)
  np.testing.assert_allclose(tokens.mean(axis=1), GOLDEN['timm'], rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize('setting,value,message', [
    ('is_native', True, 'is_native=True .* sin-cos'),
    ('qkv_bias', True, 'qkv_bias=True'),
    ('hidden_act', 'gelu', "hidden_act='gelu'"),
])
def test_transformers_settings_that_change_the_computation_are_refused(
    tmp_path, setting, value, message):
  folder = tmp_path / 'vision'
  shutil.copytree(os.path.join(FOLDER, 'vision'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config[setting] = value
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=message):
    convert.convert(str(folder), str(tmp_path / 'w.npz'))


# The golden script's prompts (make_transformers_golden.py's PROMPTS).
PROMPTS = ['a photo of a Dog.', 'A PICTURE of a cat, sitting!', 'a bird']


def test_two_towers_give_transformers_embeddings(tmp_path):
  """Aimv2Model with no flags: both towers (the image tower's attention
  pooling and projection, the causal text tower read at its end token),
  the folder's CLIP tokenizer's ids, transformers' embeddings and
  logits."""
  npz = str(tmp_path / 'towers.npz')
  assert convert.convert(os.path.join(FOLDER, 'towers'),
                         npz) == 'AIMv2-testing-towers'
  recorded = transform.load_transform(npz)
  assert recorded['model']['text'] == {'vocab_size': 521, 'eos_token': 520}
  pretrained = models.from_pretrained(npz)
  tokenizer = tokenizers.tokenizer_from_folder(
      os.path.join(FOLDER, 'towers'), pretrained.model.pp['max_len'])
  tokens = tokenizer(PROMPTS)
  np.testing.assert_array_equal(tokens, GOLDEN['towers/input_ids'])
  zimg, ztxt, out = pretrained.model.apply(
      {'params': pretrained.params}, images=IMAGES, tokens=tokens)
  np.testing.assert_allclose(zimg, GOLDEN['towers/image_embeds'], atol=1e-5)
  np.testing.assert_allclose(ztxt, GOLDEN['towers/text_embeds'], atol=1e-5)
  np.testing.assert_allclose(out['t'] * zimg @ ztxt.T,
                             GOLDEN['towers/logits_per_image'], atol=1e-4)


def test_text_tower_back_to_transformers_names():
  """The text tower's parameters back in transformers' names and layout:
  gate_proj and up_proj apart again, no biases, the scalar logit_scale."""
  state = load_file(os.path.join(FOLDER, 'towers', 'model.safetensors'))
  config = json.loads(open(os.path.join(FOLDER, 'towers',
                                        'config.json')).read())
  flat, fields, extras = transformers_text.text_tower(state, config)
  assert fields['mlp_dim'] == 64 and fields['norm'] == 'rms'
  back = transformers_text.text_to_transformers(flat, fields, extras, 'aimv2')
  want = {k: v for k, v in state.items()
          if k.startswith(('text_model.', 'text_projection.', 'logit_scale'))}
  assert sorted(back) == sorted(want)
  for key, value in want.items():
    np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_bare_weights_need_config(tmp_path):
  """timm's state dict alone does not say its RMSNorms' eps: one line
  asks for config.json."""
  bare = tmp_path / 'aimv2.safetensors'
  shutil.copy(os.path.join(FOLDER, 'timm', 'model.safetensors'), bare)
  with pytest.raises(ValueError, match="patch_embed.norm.weight.*AIMv2.*"
                     "config.json"):
    convert.convert(str(bare), str(tmp_path / 'w.npz'))
