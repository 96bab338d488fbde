"""transformers' CLIP and SigLIP text towers as a LitModel's `txt`, against
the text embeddings that transformers computed itself, from the folders'
own tokenizers; and back to transformers' names.

The golden folders (tests/data/transformers/{clip,siglip}) and outputs
(tests/data/transformers_golden.npz) come from
scripts/make_transformers_golden.py, with torch and transformers; these
tests need neither.
"""

import json
import os

from flax import traverse_util
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax.convert import transformers_text
from vit_jax.data import tokenizers
from vit_jax.models import lit as models_lit
from vit_jax.models import registry

FOLDERS = os.path.join(helpers.DATA, 'transformers')
GOLDEN = np.load(os.path.join(helpers.DATA, 'transformers_golden.npz'))
# The golden script's prompts (its PROMPTS), tokenized to 16 tokens.
PROMPTS = ['a photo of a Dog.', 'A PICTURE of a cat, sitting!', 'a bird']
KINDS = ('clip', 'siglip')


def _read(kind):
  folder = os.path.join(FOLDERS, kind)
  with open(os.path.join(folder, 'config.json')) as f:
    config = json.load(f)
  return load_file(os.path.join(folder, 'model.safetensors')), config


def _text_embeddings(kind, flat, fields, extras, tokens):
  """A LitModel's normalized text embeddings, with the converted tower."""
  model = models_lit.LitModel(
      image=registry.MODEL_CONFIGS['CLIP-testing-quickgelu'].to_dict(),
      text_model='text_transformer', text=fields,
      out_dim=(None, extras['out_dim']),
      pp={'tokenizer_name': kind, 'max_len': extras['max_len'], 'size': 32},
      bias_init=None if extras['b'] is None else 0.)
  params = {'txt': traverse_util.unflatten_dict(flat, sep='/'),
            't': extras['t']}
  if extras['b'] is not None:
    params['b'] = extras['b']
  _, ztxt, _ = model.apply({'params': params}, tokens=jnp.asarray(tokens))
  return np.asarray(ztxt)


def _assert_close(got, want):
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  relative = np.linalg.norm(got - want) / np.linalg.norm(want)
  assert relative < 1e-5, relative


@pytest.mark.parametrize('kind', KINDS)
def test_text_embeddings_from_text_match_transformers(kind):
  flat, fields, extras = transformers_text.text_tower(*_read(kind))
  assert extras['max_len'] == 16
  tokenizer = tokenizers.tokenizer_from_folder(os.path.join(FOLDERS, kind),
                                               extras['max_len'])
  tokens = tokenizer(PROMPTS)
  np.testing.assert_array_equal(tokens, GOLDEN[f'{kind}/input_ids'])
  _assert_close(_text_embeddings(kind, flat, fields, extras, tokens),
                GOLDEN[f'{kind}/text_embeds'])


def test_fields_and_extras_of_each_tower():
  state, config = _read('clip')
  _, fields, extras = transformers_text.text_tower(state, config)
  assert fields == dict(width=32, vocab_size=521, num_layers=2, mlp_dim=64,
                        num_heads=2, layer_norm_eps=1e-5,
                        gelu_approximate=False, quick_gelu=True, causal=True,
                        pool='argmax', eos_token=None)
  assert extras['out_dim'] == 24 and extras['b'] is None
  # transformers' logit_scale is log(temperature), as LitModel's `t`.
  np.testing.assert_array_equal(extras['t'], [state['logit_scale']])
  state, config = _read('siglip')
  _, fields, extras = transformers_text.text_tower(state, config)
  assert (fields['causal'], fields['pool'], fields['gelu_approximate'],
          fields['layer_norm_eps']) == (False, 'last', True, 1e-6)
  np.testing.assert_array_equal(extras['b'], state['logit_bias'])


def test_clip_pools_the_first_end_token_of_a_current_config():
  # A config of after transformers' fix names the real end token (the
  # largest id here, so the same answer as the legacy argmax).
  state, config = _read('clip')
  config['text_config']['eos_token_id'] = 520
  flat, fields, extras = transformers_text.text_tower(state, config)
  assert (fields['pool'], fields['eos_token']) == ('eos', 520)
  _assert_close(_text_embeddings('clip', flat, fields, extras,
                                 GOLDEN['clip/input_ids']),
                GOLDEN['clip/text_embeds'])


@pytest.mark.parametrize('change', [dict(pool='last'), dict(causal=False)])
def test_clip_tower_computed_otherwise_differs(change):
  flat, fields, extras = transformers_text.text_tower(*_read('clip'))
  got = _text_embeddings('clip', flat, {**fields, **change}, extras,
                         GOLDEN['clip/input_ids'])
  assert np.abs(got - GOLDEN['clip/text_embeds']).max() > 1e-2


@pytest.mark.parametrize('kind', KINDS)
def test_round_trip_gives_transformers_arrays_back(kind):
  state, config = _read(kind)
  back = transformers_text.text_to_transformers(
      *transformers_text.text_tower(state, config), kind)
  want = {k: v for k, v in state.items()
          if not k.startswith(('vision_model.', 'visual_projection.'))}
  assert sorted(back) == sorted(want)
  for key, value in want.items():
    assert back[key].shape == value.shape, key
    np.testing.assert_array_equal(back[key], value, err_msg=key)


def test_unknown_and_missing_keys_are_named():
  state, config = _read('clip')
  extra = {**state, 'text_model.encoder.layers.0.self_attn.q_norm.weight':
           np.ones(32, np.float32)}
  with pytest.raises(ValueError, match=r"CLIP text tower: .*q_norm.weight "
                     'has no counterpart'):
    transformers_text.text_tower(extra, config)
  del state['text_model.encoder.layers.1.mlp.fc2.bias']
  with pytest.raises(ValueError, match=r'layers\.1\.mlp\.fc2\.bias is '
                     'missing'):
    transformers_text.text_tower(state, config)
  state, config = _read('siglip')
  del state['logit_bias']
  with pytest.raises(ValueError, match='SigLIP text tower: logit_bias'):
    transformers_text.text_tower(state, config)


def test_settings_vit_jax_lacks_are_refused():
  state, config = _read('clip')
  with pytest.raises(ValueError, match="hidden_act='relu'"):
    transformers_text.text_tower(
        state, {**config, 'text_config': {**config['text_config'],
                                          'hidden_act': 'relu'}})
  with pytest.raises(ValueError, match="model_type='bert'"):
    transformers_text.text_tower(state, {**config, 'model_type': 'bert'})
  flat, fields, extras = transformers_text.text_tower(state, config)
  flat['head/bias'] = flat['head/bias'] + 1
  with pytest.raises(ValueError, match='text_projection has no bias'):
    transformers_text.text_to_transformers(flat, fields, extras, 'clip')
