r"""Writes a small SigLIP two-tower checkpoint in big_vision's published
layout, and the image and text embeddings that big_vision's own model code
computes for it.

Needs a checkout of google-research/big_vision (its code is run, never
copied here); the tests need neither.

  python scripts/make_big_vision_siglip_golden.py --big_vision=/path/to/big_vision

writes tests/data/big_vision_siglip.npz: `params/img/...`, `params/txt/...`,
`params/t`, `params/b`, as big_vision's `utils.save_checkpoint` flattens
them; the image tower's blocks stacked (`scan=True`), the text tower's per
block, every parameter moved off its init by N(0, 0.3) and the embedding
tables stored as bfloat16. And tests/data/big_vision_siglip_golden.npz: 32
px images in [-1, 1], token ids (each row ending in the EOS id 1), and
big_vision's `zimg`, `ztxt`, `t` and `b`.
"""

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data')
IMAGE = dict(width=32, depth=2, mlp_dim=64, num_heads=2, patch_size=(16, 16),
             pool_type='map', posemb='learn', scan=True)
TEXT = dict(width=32, depth=2, mlp_dim=64, num_heads=2, vocab_size=64)


def _flat(tree, prefix='params'):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}/{key}'))
    else:
      out[f'{prefix}/{key}'] = np.asarray(value)
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--big_vision', required=True,
                      help='a checkout of google-research/big_vision')
  args = parser.parse_args()
  sys.path.insert(0, args.big_vision)
  from big_vision.models.proj.image_text import two_towers  # pylint: disable=g-import-not-at-top

  model = two_towers.Model(image=IMAGE, text=TEXT, out_dim=(None, 32),
                           temperature_init=10.0, bias_init=-10.0)
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (2, 32, 32, 3)).astype(np.float32)
  tokens = rng.integers(2, TEXT['vocab_size'], (2, 8)).astype(np.int32)
  tokens[:, -1] = 1  # big_vision's text tower reads the last (EOS) token
  params = model.init(jax.random.key(0), images, tokens)['params']
  params = jax.tree.map(
      lambda p: p + 0.3 * rng.normal(size=p.shape).astype(p.dtype), params)
  # As published: some arrays bfloat16, read back (and here run) as such.
  flat = _flat(jax.device_get(params))
  for key in ('params/txt/Embed_0/embedding', 'params/img/pos_embedding'):
    flat[key] = flat[key].astype(ml_dtypes.bfloat16)
  params = jax.tree.map(jnp.asarray, _unflat(flat))
  zimg, ztxt, out = model.apply({'params': params}, images, tokens)
  np.savez(os.path.join(OUT, 'big_vision_siglip.npz'), **flat)
  np.savez(os.path.join(OUT, 'big_vision_siglip_golden.npz'), images=images,
           tokens=tokens, zimg=np.asarray(zimg), ztxt=np.asarray(ztxt),
           t=np.asarray(out['t']), b=np.asarray(out['b']))
  print('wrote', sorted(flat)[:3], '...', len(flat), 'arrays')


def _unflat(flat):
  tree = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split('/')[1:]
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = np.asarray(value, np.float32) if value.dtype == (
        ml_dtypes.bfloat16) else value
  return tree


if __name__ == '__main__':
  main()
