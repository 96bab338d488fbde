r"""Writes the ImageNet class names that `vit_jax.predict` ships with.

Reads timm's WordNet synset lists (timm must be installed): ImageNet-1k in
the order of its labels (sorted synset ids, as the published i1k heads) and
ImageNet-21k in the order of the published i21k heads (21,843 classes). One
line per class: the synset's lemmas, as the original release's
`ilsvrc2012_wordnet_lemmas.txt`.

  python scripts/make_class_names.py
"""

import os

import timm

INFO = os.path.join(os.path.dirname(timm.__file__), 'data', '_info')
OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'vit_jax', 'data')
LISTS = {'imagenet2012_labels.txt': 'imagenet_synsets.txt',
         'imagenet21k_labels.txt': 'imagenet21k_goog_synsets.txt'}


def _read(name):
  with open(os.path.join(INFO, name)) as f:
    return [line.rstrip('\n') for line in f if line.strip()]


def main():
  lemmas = dict(line.split('\t', 1) for line in _read(
      'imagenet_synset_to_lemma.txt'))
  for out, synsets in LISTS.items():
    names = [lemmas[synset] for synset in _read(synsets)]
    with open(os.path.join(OUT, out), 'w') as f:
      f.write('\n'.join(names) + '\n')
    print(f'{out}: {len(names)} classes')


if __name__ == '__main__':
  main()
