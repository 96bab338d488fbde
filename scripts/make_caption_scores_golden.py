"""Writes tests/data/cider_golden.json: COCO's own CIDEr-D on a small corpus.

The scores come from pycocoevalcap's `Cider` (the CIDEr-D scorer of the COCO
caption toolkit), which tests/evaluators/test_caption_scores.py compares
`caption_scores.cider_d` with. The captions are already lower case, without
punctuation and space-separated, so pycocoevalcap's PTB tokenizer (Java) is
not needed. Needs pycocoevalcap (`pip install pycocoevalcap`); the tests do
not.

  python scripts/make_caption_scores_golden.py
"""

import importlib.metadata
import json
import os

from pycocoevalcap.cider.cider import Cider

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tests', 'data', 'cider_golden.json')

# (prediction, references): 8 images, 2 to 5 references each.
CORPUS = [
    # Identical to one of its references.
    ('a man riding a horse on a beach',
     ['a man riding a horse on a beach',
      'a person rides a brown horse along the sand',
      'a rider on a horse near the ocean']),
    # Repeated words.
    ('a dog a dog a dog playing',
     ['a dog playing with a ball in the grass',
      'a small dog plays in a park']),
    # No word in common with its references.
    ('purple elephants dancing',
     ['a plate of food on a wooden table',
      'a sandwich and fries on a plate',
      'food served on a white plate',
      'a table with a meal on it']),
    # Much longer than its references.
    ('a cat is sitting on a red couch next to a window in a living room '
     'with a lamp and a book on the table',
     ['a cat on a couch',
      'a cat sitting on a red sofa',
      'a cat resting on furniture']),
    ('two people are walking down a city street',
     ['two people walking on a busy street',
      'a man and a woman walk down a street',
      'people walking in the city',
      'a couple strolling on a sidewalk',
      'pedestrians on a city street']),
    ('a bag',
     ['a bag to the left of a sandal',
      'a black bag next to a shoe']),
    ('an ankle boot to the left of a shirt',
     ['an ankle boot to the left of a shirt to the left of a dress',
      'a boot beside a shirt and a dress',
      'an ankle boot a shirt and a dress']),
    ('a train on the tracks',
     ['a train on the tracks',
      'a red train traveling on the tracks',
      'a train pulling into a station',
      'a long train on railroad tracks']),
]


def main():
  gts = {i: refs for i, (_, refs) in enumerate(CORPUS)}
  res = {i: [prediction] for i, (prediction, _) in enumerate(CORPUS)}
  score, scores = Cider().compute_score(gts, res)
  golden = {
      'source': ('pycocoevalcap.cider.cider.Cider().compute_score, '
                 'pycocoevalcap '
                 f"{importlib.metadata.version('pycocoevalcap')}"),
      'predictions': [prediction for prediction, _ in CORPUS],
      'references': [refs for _, refs in CORPUS],
      'corpus_score': float(score),
      'scores': [float(s) for s in scores],
  }
  with open(OUT, 'w') as f:
    json.dump(golden, f, indent=1)
    f.write('\n')
  print(f'Wrote {OUT}: corpus CIDEr-D {score:.6f}')


if __name__ == '__main__':
  main()
