"""Patch n' Pack: a hand-packed batch, the greedy packer's limits, token
dropping and resolution sampling, all against numpy written here."""

import numpy as np
import pytest

from vit_jax.data import packing


def _image(h, w, c=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (h, w, c), np.uint8)


def test_a_hand_packed_sequence():
  # Patch 2: a 4x2 image (2x1 grid), a 2x4 one (1x2) and a 4x4 one (2x2).
  images = [_image(4, 2, seed=1), _image(2, 4, seed=2), _image(4, 4, seed=3)]
  examples = [packing.example(im, label, im.shape[0] // 2, im.shape[1] // 2,
                              2) for im, label in zip(images, (7, 3, 5))]
  batch = packing.pack([examples, examples[2:]], max_tokens=9, max_images=3,
                       patch_dim=12)
  np.testing.assert_array_equal(batch['segment_ids'], [
      [1, 1, 2, 2, 3, 3, 3, 3, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['rows'], [
      [0, 1, 0, 0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['cols'], [
      [0, 0, 0, 1, 0, 1, 0, 1, 0], [0, 1, 0, 1, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['heights'], [
      [2, 2, 1, 1, 2, 2, 2, 2, 0], [2, 2, 2, 2, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['widths'], [
      [1, 1, 2, 2, 2, 2, 2, 2, 0], [2, 2, 2, 2, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(batch['labels'], [[7, 3, 5], [5, -1, -1]])
  # Token 6 of sequence 0: image 3's patch (1, 0), pixels in (p, p, C) order.
  want = images[2][2:4, 0:2].reshape(-1) / 127.5 - 1
  np.testing.assert_allclose(batch['patches'][0, 6], want, atol=1e-6)
  np.testing.assert_array_equal(batch['patches'][:, 8], 0)
  assert batch['patches'].dtype == np.float32
  assert packing.efficiency(batch['segment_ids']) == 12 / 18


def test_pack_refuses_what_does_not_fit():
  ex = packing.example(_image(4, 4), 0, 2, 2, 2)
  with pytest.raises(ValueError, match='max_tokens=7'):
    packing.pack([[ex, ex]], max_tokens=7, max_images=2, patch_dim=12)
  with pytest.raises(ValueError, match='max_images=1'):
    packing.pack([[ex, ex]], max_tokens=8, max_images=1, patch_dim=12)


@pytest.mark.parametrize('max_tokens,max_images,window', [
    (64, 16, 1), (64, 16, 32), (64, 3, 32), (100, 50, 8)])
def test_the_packer_keeps_whole_images_within_the_limits(max_tokens,
                                                         max_images, window):
  sizes = np.random.default_rng(0).integers(1, 50, 500)
  packer = packing.Packer(iter(enumerate(sizes)), max_tokens, max_images,
                          window)
  seen, sequences = [], []
  while (keys := packer.next_sequence()) is not None:
    assert 1 <= len(keys) <= max_images
    assert sum(sizes[k] for k in keys) <= max_tokens
    assert keys == sorted(keys)  # stream order within a sequence
    sequences.append(keys)
    seen += keys
  assert sorted(seen) == list(range(500))  # each image once, whole
  assert packer.pulled == 500
  used = sum(sizes) / (len(sequences) * max_tokens)
  if window >= 8 and max_images > 3:
    assert used > 0.9
  if window == 1:  # next-fit: a sequence closes at the first misfit
    for a, b in zip(sequences, sequences[1:]):
      assert (len(a) == max_images or
              sum(sizes[a]) + sizes[b[0]] > max_tokens)


def test_the_oldest_pending_image_opens_each_sequence():
  sizes = [6, 5, 1, 6, 1, 1]
  packer = packing.Packer(iter(enumerate(sizes)), 8, 4, window=3)
  got = []
  while (keys := packer.next_sequence()) is not None:
    got.append(keys)
  # Window 3, topped up after each image taken: [0 1 2] takes 0 -> [1 2 3]
  # takes 2 -> [1 3 4] takes 4 -> [1 3 5], full; then [1 3 5] -> 1, 5.
  assert got == [[0, 2, 4], [1, 5], [3]]


def test_an_image_larger_than_a_sequence_is_refused():
  packer = packing.Packer(iter([(0, 9)]), 8, 4)
  with pytest.raises(ValueError, match='9 tokens does not fit'):
    packer.next_sequence()


@pytest.mark.parametrize('n,rate,kept', [
    (16, 0.0, 16), (16, 0.5, 8), (9, 0.5, 4), (4, 0.9, 1), (1, 0.5, 1),
    (64, 0.25, 48), (10, 0.3, 7)])
def test_token_dropping_keeps_floor_n_times_one_minus_rate(n, rate, kept):
  assert packing.num_kept(n, rate) == kept
  keep = packing.drop_tokens(np.random.default_rng(0), n, kept)
  assert len(set(keep)) == kept and list(keep) == sorted(keep)
  assert keep.max() < n


def test_training_examples_are_reproducible_from_seed_and_position():
  sampling = packing.Sampling(patch=7, side_range=(14, 56),
                              aspect_range=(0.5, 2.0), drop_rate=(0.2, 0.6))
  book = packing.Recipes(3, sampling)
  image = _image(28, 28, 1)
  make = lambda p, book=book: packing.training_example(
      image, 4, book[p], sampling, seed=3, position=p)
  for p in (0, 5, 1500):
    a, b = make(p), make(p)
    again = make(p, packing.Recipes(3, sampling))
    for x in (b, again):
      for k in a:
        np.testing.assert_array_equal(a[k], x[k])
    n = a['height'] * a['width']
    assert len(a['rows']) == packing.num_kept(n, book[p]['rate'])
    assert len(a['rows']) == book[p]['tokens'] < n
    assert a['patches'].shape == (len(a['rows']), 49)
  kept = [tuple(make(p)['rows'] * 100 + make(p)['cols']) for p in range(40)]
  assert len(set(kept)) > 30  # positions differ


def test_recipes_are_a_pure_function_of_seed_and_position():
  sampling = packing.Sampling(patch=7, side_range=(14, 56),
                              aspect_range=(0.5, 2.0))
  whole = packing.recipes(0, 0, 3000, sampling)
  part = packing.recipes(0, 1000, 2100, sampling)
  for k in whole:
    np.testing.assert_array_equal(whole[k][1000:2100], part[k])
  book = packing.Recipes(0, sampling)
  assert book[2047]['height'] == whole['height'][2047]
  counts = book.token_counts(1022)
  assert [next(counts) for _ in range(4)] == [
      (p, whole['tokens'][p]) for p in range(1022, 1026)]
  other = packing.recipes(1, 0, 3000, sampling)
  assert not np.array_equal(other['height'], whole['height'])
  assert np.all(whole['tokens'] == whole['height'] * whole['width'])


def test_resolution_sampling_keeps_the_aspect_ratio():
  sampling = packing.Sampling(patch=7, side_range=(14, 56),
                              aspect_range=(0.5, 2.0))
  r = packing.recipes(0, 0, 5000, sampling)
  long = np.maximum(r['height'], r['width'])
  short = np.minimum(r['height'], r['width'])
  assert set(long) == set(range(2, 9))  # every side 14..56 px
  ratio = np.maximum(r['aspect'], 1 / r['aspect'])
  assert np.all(np.abs(short - long / ratio) <= 0.5 + 1e-9)
  assert np.all(r['aspect'][r['width'] > r['height']] > 1)
  assert np.all(r['aspect'][r['width'] < r['height']] < 1)
  assert r['aspect'].min() >= 0.5 and r['aspect'].max() <= 2.0
  assert np.isclose(np.median(np.log(r['aspect'])), 0, atol=0.05)
  for a in (0.5, 0.8, 1.0, 1.7):  # the crop has the drawn aspect ratio
    for shape in ((28, 28), (30, 50)):
      y, x, h, w = packing.crop_box(shape, a, 0.99, 0.99)
      assert 0 <= y and y + h <= shape[0] and 0 <= x and x + w <= shape[1]
      assert abs(w / h - a) <= 1 / h + 1e-9
      assert h == shape[0] or w == shape[1]  # the largest such box


def test_grid_of_fixed_sides():
  assert [packing.grid_of(s, 1.0, 7) for s in (14, 28, 42, 56)] == [
      (2, 2), (4, 4), (6, 6), (8, 8)]
  assert packing.grid_of(56, 2.0, 7) == (4, 8)
  assert packing.grid_of(56, 0.5, 7) == (8, 4)


def test_bad_sampling_settings_are_refused():
  with pytest.raises(ValueError, match='no multiple of the patch size 7'):
    packing.Sampling(patch=7, side_range=(8, 13))
  with pytest.raises(ValueError, match='aspect_range'):
    packing.Sampling(patch=7, side_range=(14, 56), aspect_range=(2, 1))
  with pytest.raises(ValueError, match='drop_rate'):
    packing.Sampling(patch=7, side_range=(14, 56), drop_rate=1.0)


def test_a_flipped_recipe_mirrors_the_crop():
  sampling = packing.Sampling(patch=7, side_range=(28, 28), flip=True)
  book = packing.Recipes(0, sampling)
  flips = [p for p in range(64) if book[p]['flip']]
  assert 16 < len(flips) < 48
  image = _image(28, 28, 1)
  for p in (flips[0], next(p for p in range(64) if not book[p]['flip'])):
    got = packing.training_example(image, 0, book[p], sampling, seed=0,
                                   position=p)
    want = packing.example(image[:, ::-1] if book[p]['flip'] else image, 0,
                           4, 4, 7)
    np.testing.assert_array_equal(got['patches'], want['patches'])
  assert not any(packing.Recipes(0, packing.Sampling(
      patch=7, side_range=(28, 28)))[p]['flip'] for p in range(64))
