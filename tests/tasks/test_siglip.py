"""SigLIP and CLIP with both towers trained (configs/siglip_fmnist.py); the
sigmoid loss chunked over the devices against its all-gathered form and
numpy written from the paper's equation; big_vision's SigLIP checkpoints."""

import json
import os

import jax
import numpy as np
import pytest

from tests import helpers

from vit_jax.checkpoints import files
from vit_jax import losses
from vit_jax import launch
from vit_jax.configs import siglip_fmnist
from vit_jax.data import captions
from vit_jax.data import tokenizers
from vit_jax.models import lit as models_lit
from vit_jax.models import registry


def _embeddings(batch, width=8, seed=0):
  rng = np.random.default_rng(seed)
  z = rng.normal(size=(2, batch, width))
  z /= np.linalg.norm(z, axis=-1, keepdims=True)
  return z.astype(np.float32)


def _numpy_loss_and_grads(zimg, ztxt, t, b):
  """SigLIP (Zhai et al., 2023, Algorithm 1): logits = t zimg ztxt^T + b,
  labels 2 I - 1, loss = -sum log sigmoid(labels logits) / n; and its
  gradients, with dL/dlogits = -labels sigmoid(-labels logits) / n."""
  zimg, ztxt = zimg.astype(np.float64), ztxt.astype(np.float64)
  n = zimg.shape[0]
  logits = t * zimg @ ztxt.T + b
  labels = 2 * np.eye(n) - 1
  loss = np.sum(np.logaddexp(0, -labels * logits)) / n
  g = -labels / (1 + np.exp(labels * logits)) / n
  return loss, (t * g @ ztxt, t * g.T @ zimg, np.sum(g * (zimg @ ztxt.T)),
                np.sum(g))


@pytest.mark.parametrize('devices', [1, 2, 8])
def test_chunked_sigmoid_loss_is_the_papers(devices):
  zimg, ztxt = _embeddings(16)
  t, b = np.float32(10.), np.float32(-10.)
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:devices]), ('data',))
  chunked = jax.jit(jax.value_and_grad(
      lambda *a: losses.sigmoid_loss_chunked(*a, mesh=mesh),
      argnums=(0, 1, 2, 3)))
  gathered = jax.jit(jax.value_and_grad(losses.sigmoid_loss,
                                        argnums=(0, 1, 2, 3)))
  want, want_grads = _numpy_loss_and_grads(zimg, ztxt, t, b)
  for value, grads in (chunked(zimg, ztxt, t, b), gathered(zimg, ztxt, t, b)):
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for got, ref in zip(grads, want_grads):
      np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)


def _config(fmnist_dirs, arg='siglip', **changes):
  config = helpers.tiny_image_text(siglip_fmnist.get_config(arg), fmnist_dirs)
  config.update(dict(total_steps=20, warmup_steps=0, batch=16, batch_eval=8,
                     shuffle_buffer=100, progress_every=10,
                     checkpoint_every=0, optimizer='sgd', weight_decay=0.0),
                **changes)
  config.evals.zeroshot.every = 0
  return config


def test_chunked_and_gathered_runs_end_alike(fmnist_dirs, tmp_path):
  """20 SGD steps of both towers on 8 devices: the same parameters by either
  form of the loss, exported under the same name, with a zero-shot
  accuracy in results.json."""
  assert len(jax.devices()) == 8
  params = {}
  for chunked in (True, False):
    workdir = tmp_path / str(chunked)
    config = _config(fmnist_dirs, siglip_chunked=chunked)
    launch.train_and_evaluate(config, str(workdir))
    results = json.loads((workdir / 'results.json').read_text())
    assert 0 <= results['zeroshot_accuracy'] <= 1
    params[chunked] = files.load(workdir / 'LiT-fmnist-siglip-scratch.npz')
  assert set(params[True]) == {'img', 'txt', 't', 'b'}
  diffs = jax.tree.map(lambda a, b: np.abs(a - b).max(), params[True],
                       params[False])
  assert max(jax.tree.leaves(diffs)) < 1e-5
  # Both towers learned: the image tower moved off its initialization.
  fresh = launch.make_task(_config(fmnist_dirs), str(tmp_path / 'f')
                          ).init_params(jax.random.key(0))
  assert np.abs(params[True]['img']['embedding']['kernel'] -
                fresh['img']['embedding']['kernel']).max() > 1e-3


def test_big_vision_two_towers_give_big_vision_embeddings():
  """big_vision's SigLIP .npz as published (both towers, the image tower's
  blocks scanned, bfloat16 tables) against the embeddings that big_vision's
  own model code computed (scripts/make_big_vision_siglip_golden.py)."""
  data = helpers.DATA
  golden = np.load(os.path.join(data, 'big_vision_siglip_golden.npz'))
  image = registry.MODEL_CONFIGS['SigLIP-testing'].to_dict()
  model = models_lit.LitModel(
      image=image, text_model='text_transformer',
      text=dict(width=32, num_layers=2, mlp_dim=64, num_heads=2,
                vocab_size=64), out_dim=(None, 32), temperature_init=10.0,
      bias_init=-10.0)
  params = files.load(os.path.join(data, 'big_vision_siglip.npz'))
  zimg, ztxt, out = model.apply({'params': params}, images=golden['images'],
                                tokens=golden['tokens'])
  np.testing.assert_allclose(zimg, golden['zimg'], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ztxt, golden['ztxt'], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['t'], golden['t'], rtol=1e-6)
  np.testing.assert_allclose(out['b'], golden['b'], rtol=1e-6)


def test_zeroshot_with_big_vision_checkpoint(fmnist_dirs, tmp_path):
  """trainer='zeroshot' on big_vision's SigLIP .npz with a SentencePiece
  vocabulary file: the zero-shot evaluator over every test image."""
  data = helpers.DATA
  vocab = str(tmp_path / 'vocab.model')
  tokenizers.train_sentencepiece(
      captions.all_captions(siglip_fmnist.get_config()), vocab, 64)
  config = _config(fmnist_dirs, trainer='zeroshot')
  with config.unlocked():
    config.model.image = registry.MODEL_CONFIGS['SigLIP-testing'].to_dict()
    config.model.text = dict(width=32, num_layers=2, mlp_dim=64, num_heads=2,
                             vocab_size=64)
    config.model.out_dim = (None, 32)
  config.lit.vocab_path = vocab
  config.pretrained_path = os.path.join(data, 'big_vision_siglip.npz')
  result = launch.evaluate(config, str(tmp_path / 'wd'))
  assert result['count'] == 37 and 0 <= result['zeroshot_accuracy'] <= 1
