"""LiT models: the original's parameter counts, its published .npz layout,
and the BERT tower against a numpy reference of BERT's equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from vit_jax.checkpoints import files
from vit_jax.checkpoints import loading
from vit_jax import models
from vit_jax.models import lit as models_lit

def _init_shapes(model, image_size=224, max_len=16):
  return jax.eval_shape(lambda: model.init(
      jax.random.key(0), images=jnp.zeros((1, image_size, image_size, 3)),
      tokens=jnp.zeros((1, max_len), jnp.int32)))['params']


def test_get_model_returns_lit_model():
  model = models.get_model('LiT-L16Ti')
  assert isinstance(model, models_lit.LitModel)
  assert model.pp['tokenizer_name'] == 'sentencepiece'
  assert models.get_model('LiT-B16B').pp['tokenizer_name'] == 'bert'


# A small LiT in the published layout: keys written out by hand, as the
# original's code names them (flaxformer's BertEncoder; the ViT's blocks
# pre-Linen, as the published ViT files, or Linen).
D, F, H, V, L = 16, 32, 2, 64, 2  # BERT 'testing'
OUT = 12


def _published_layout(linen_vit_names):
  ln, mha, ln2, mlp = (
      ('LayerNorm_0', 'MultiHeadDotProductAttention_0', 'LayerNorm_1',
       'MlpBlock_0') if linen_vit_names else
      ('LayerNorm_0', 'MultiHeadDotProductAttention_1', 'LayerNorm_2',
       'MlpBlock_3'))
  blk = 'img/Transformer/encoderblock_0'
  shapes = {
      'img/embedding/kernel': (16, 16, 3, 10), 'img/embedding/bias': (10,),
      'img/cls': (1, 1, 10),
      'img/Transformer/posembed_input/pos_embedding': (1, 5, 10),
      f'{blk}/{ln}/scale': (10,), f'{blk}/{ln}/bias': (10,),
      f'{blk}/{ln2}/scale': (10,), f'{blk}/{ln2}/bias': (10,),
      f'{blk}/{mlp}/Dense_0/kernel': (10, 10), f'{blk}/{mlp}/Dense_0/bias': (10,),
      f'{blk}/{mlp}/Dense_1/kernel': (10, 10), f'{blk}/{mlp}/Dense_1/bias': (10,),
      f'{blk}/{mha}/out/kernel': (2, 5, 10), f'{blk}/{mha}/out/bias': (10,),
      'img/Transformer/encoder_norm/scale': (10,),
      'img/Transformer/encoder_norm/bias': (10,),
      'img/head/kernel': (10, OUT), 'img/head/bias': (OUT,),
      'txt/head/kernel': (D, OUT), 'txt/head/bias': (OUT,),
      't': (1,),
  }
  for x in ('query', 'key', 'value'):
    shapes[f'{blk}/{mha}/{x}/kernel'] = (10, 2, 5)
    shapes[f'{blk}/{mha}/{x}/bias'] = (2, 5)
  bert = 'txt/BertEncoder_0'
  for x, rows in (('token_ids', V), ('position_ids', 16), ('segment_ids', 2)):
    shapes[f'{bert}/embedder/embedders_{x}/embedding'] = (rows, D)
  shapes[f'{bert}/layer_norm/scale'] = shapes[f'{bert}/layer_norm/bias'] = (D,)
  for i in range(L):
    layer = f'{bert}/encoder_block/layer_sequence/layers_{i}'
    for x in ('query', 'key', 'value'):
      shapes[f'{layer}/attention_block/attention_layer/{x}/kernel'] = (D, D)
      shapes[f'{layer}/attention_block/attention_layer/{x}/bias'] = (D,)
    shapes[f'{layer}/attention_block/dense_layer/kernel'] = (D, D)
    shapes[f'{layer}/mlp_block/mlp/dense_layer/kernel'] = (D, F)
    shapes[f'{layer}/mlp_block/mlp/dense_layer/bias'] = (F,)
    shapes[f'{layer}/mlp_block/dense_layer/kernel'] = (F, D)
    for x in ('attention_block/dense_layer/bias', 'attention_block/layer_norm/'
              'scale', 'attention_block/layer_norm/bias', 'mlp_block/'
              'dense_layer/bias', 'mlp_block/layer_norm/scale',
              'mlp_block/layer_norm/bias'):
      shapes[f'{layer}/{x}'] = (D,)
  rng = np.random.default_rng(0)
  return {k: rng.normal(0, 0.5, s).astype(np.float32)
          for k, s in shapes.items()}


def _small_lit():
  return models.get_model('LiT-B16B', image=_testing_image(),
                          text={'config': 'testing'}, out_dim=(OUT, OUT))


def _testing_image():
  from vit_jax.models import registry  # pylint: disable=g-import-not-at-top
  return registry.MODEL_CONFIGS['testing'].to_dict()


def _bert_reference(p, tokens):
  """BERT's CLS output: embeddings, LN, post-LN blocks over unpadded keys."""
  e = p['embedder']
  n, length = tokens.shape
  x = (e['embedders_token_ids']['embedding'][tokens] +
       e['embedders_position_ids']['embedding'][np.arange(length)] +
       e['embedders_segment_ids']['embedding'][0])
  x = helpers.layernorm(x, p['layer_norm'], eps=1e-12)
  keep = (tokens != 0)[:, None, None, :]
  for i in range(L):
    layer = p['encoder_block']['layer_sequence'][f'layers_{i}']
    a = layer['attention_block']
    q, k, v = ((x @ a['attention_layer'][y]['kernel'] +
                a['attention_layer'][y]['bias']).reshape(n, length, H, D // H)
               for y in ('query', 'key', 'value'))
    logits = np.einsum('bqhd,bkhd->bhqk', q, k) / np.sqrt(D // H)
    logits = np.where(keep, logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    y = np.einsum('bhqk,bkhd->bqhd', w, v).reshape(n, length, D)
    y = y @ a['dense_layer']['kernel'] + a['dense_layer']['bias']
    x = helpers.layernorm(x + y, a['layer_norm'], eps=1e-12)
    m = layer['mlp_block']
    h = helpers.gelu(x @ m['mlp']['dense_layer']['kernel'] +
                     m['mlp']['dense_layer']['bias'])
    y = h @ m['dense_layer']['kernel'] + m['dense_layer']['bias']
    x = helpers.layernorm(x + y, m['layer_norm'], eps=1e-12)
  return x[:, 0]


@pytest.mark.parametrize('linen_vit_names', [False, True])
def test_published_layout_loads_and_matches_bert_reference(
    tmp_path, linen_vit_names):
  flat = _published_layout(linen_vit_names)
  path = tmp_path / 'LiT-small.npz'
  np.savez(path, **flat)
  model = _small_lit()
  expected = _init_shapes(model, image_size=32, max_len=8)
  variables = {'params': loading.load_params(
      path, init_params=expected, model_config={})}
  assert (jax.tree.structure(variables['params']) ==
          jax.tree.structure(expected))
  assert jax.tree.map(np.shape, variables['params']) == jax.tree.map(
      lambda x: x.shape, expected)

  tokens = np.array([[5, 9, 17, 3, 0, 0, 0, 0], [7, 2, 60, 61, 8, 4, 1, 0]],
                    np.int32)
  images = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3))
  zimg, ztxt, out = model.apply(variables, images=images, tokens=tokens)
  bert = variables['params']['txt']['BertEncoder_0']
  want = _bert_reference(jax.tree.map(np.asarray, bert), tokens)
  want = want @ flat['txt/head/kernel'] + flat['txt/head/bias']
  want /= np.linalg.norm(want, axis=1, keepdims=True)
  np.testing.assert_allclose(ztxt, want, atol=2e-5)
  np.testing.assert_allclose(np.linalg.norm(zimg, axis=1), 1, atol=1e-5)
  np.testing.assert_allclose(out['t'], np.exp(flat['t']), rtol=1e-6)


def test_saved_lit_reloads_exactly(tmp_path):
  flat = _published_layout(False)
  np.savez(tmp_path / 'a.npz', **flat)
  params = files.load(tmp_path / 'a.npz')
  files.save(params, tmp_path / 'b.npz')
  with np.load(tmp_path / 'b.npz') as saved:
    assert sorted(saved.files) == sorted(flat)
    for key in flat:
      np.testing.assert_array_equal(saved[key], flat[key])


def test_text_transformer_names_and_last_token():
  model = models.get_model('LiT-L16Ti', image=_testing_image(),
                           out_dim=(None, 10),
                           text=dict(width=8, num_layers=1, mlp_dim=16,
                                     num_heads=2, vocab_size=20))
  params = _init_shapes(model, image_size=32, max_len=6)['txt']
  assert sorted(params) == ['Embed_0', 'Encoder_0', 'head', 'pos_embedding']
  assert params['pos_embedding'].shape == (1, 6, 8)
  assert sorted(params['Encoder_0']) == ['encoder_norm', 'encoderblock_0']
  tokens = jnp.array([[3, 4, 5, 6, 7, 2]])
  variables = model.init(jax.random.key(0), tokens=tokens)
  (_, _, out), state = model.apply(variables, tokens=tokens,
                                   capture_intermediates=True)
  encoded = state['intermediates']['txt']['Encoder_0']['__call__'][0]
  np.testing.assert_array_equal(out['txt/pre_logits'], encoded[:, -1])


@pytest.mark.parametrize('pool,eos_token', [('argmax', None), ('eos', 9)])
def test_text_transformer_causal_end_token(pool, eos_token):
  # CLIP's tower: the end token (9, the largest id) read where it is; with
  # causal attention the tokens after it (padding) cannot change it.
  tower = models_lit.TextTransformer(width=8, num_layers=1, mlp_dim=16,
                                     num_heads=2, vocab_size=20, causal=True,
                                     pool=pool, eos_token=eos_token)
  tokens = jnp.array([[3, 4, 9, 5, 6], [3, 9, 1, 1, 1]])
  params = {'params': helpers.random_params(tower, tokens)}
  padded = tokens.at[:, 3:].set(7)
  pooled, _ = tower.apply(params, tokens)
  np.testing.assert_array_equal(pooled, tower.apply(params, padded)[0])
  _, state = tower.apply(params, tokens, capture_intermediates=True)
  encoded = state['intermediates']['Encoder_0']['__call__'][0]
  np.testing.assert_array_equal(pooled, encoded[[0, 1], [2, 1]])
  bidirectional, _ = tower.clone(causal=False).apply(params, padded)
  assert np.abs(bidirectional - pooled).max() > 1e-3
  with pytest.raises(ValueError, match='eos_token'):
    tower.clone(pool='eos', eos_token=None).apply(params, tokens)


def test_sigmoid_bias_and_temperature_inits():
  model = models.get_model('LiT-L16Ti', image=_testing_image(),
                           text=dict(width=8, num_layers=1, mlp_dim=16,
                                     num_heads=2, vocab_size=20),
                           temperature_init=10., bias_init=-10.)
  variables = model.init(jax.random.key(0), tokens=jnp.ones((1, 4), jnp.int32))
  _, _, out = model.apply(variables, tokens=jnp.ones((1, 4), jnp.int32))
  np.testing.assert_allclose(out['t'], [10.], rtol=1e-6)
  np.testing.assert_allclose(out['b'], [-10.])


def test_bad_inputs_name_the_problem():
  model = _small_lit()
  with pytest.raises(ValueError, match='tokens must be'):
    model.init(jax.random.key(0), tokens=jnp.zeros((2, 8)))
  with pytest.raises(ValueError, match='exceed'):
    model.init(jax.random.key(0), tokens=jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match='Unknown text_model'):
    models.get_model('LiT-B16B', text_model='gpt').init(
        jax.random.key(0), tokens=jnp.zeros((1, 4), jnp.int32))
