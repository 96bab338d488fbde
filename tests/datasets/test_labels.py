"""Derived labels (`labels.py`): ImageNet ReaL (a prediction is right if it
is in the image's label set) and VTAB's structured tasks' labels."""

import ml_collections
import numpy as np
import tensorflow as tf

from vit_jax.configs import common
from vit_jax.data import labels as task_labels
from vit_jax.data import pipeline
from vit_jax.evaluators import classification


def test_label_sets_become_multi_hot_and_empty_sets_are_not_counted():
  info = pipeline.DatasetInfo(builder=None, num_classes=5, num_train=1,
                                    num_test=1, channels=3)
  pp = ml_collections.ConfigDict(dict(crop=8, label='imagenet2012_real'))
  png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8))
  for labels, hot, mask in (([1, 3], [0, 1, 0, 1, 0], 1), ([], [0] * 5, 0)):
    out = pipeline.eval_example(
        {'image': png, 'real_label': tf.constant(labels, tf.int64)},
        info=info, pp=pp)
    np.testing.assert_array_equal(out['label'], hot)
    assert float(out['mask']) == mask


def test_eval_step_scores_sets_against_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 5)).astype(np.float32)
  labels = (rng.random((6, 5)) < 0.4).astype(np.float32)
  labels[0] = 0  # no right answer (masked, as the pipeline does)
  mask = (labels.sum(-1) > 0).astype(np.float32)
  out = classification.eval_step(
      None, {'image': None, 'label': labels, 'mask': mask},
      apply_fn=lambda variables, images, train: logits, loss='softmax_xent')
  top = logits.argmax(-1)
  expected = sum(labels[i, top[i]] > 0 for i in range(6) if mask[i])
  assert int(out['accuracy'].total) == expected
  assert int(out['accuracy'].count) == mask.sum()
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  target = labels / np.maximum(labels.sum(-1, keepdims=True), 1)
  np.testing.assert_allclose(out['loss'].total, -(target * logp).sum(-1) @ mask,
                             rtol=1e-5)


def test_real_preset():
  config = common.with_dataset(common.get_config(), 'imagenet2012_real')
  assert config.pp.label == 'imagenet2012_real'
  assert config.pp.test == 'validation'


def _label(name, **features):
  image = tf.ones((2, 2, 1), tf.uint8)
  image, label = task_labels.apply(name, image, features)
  return int(label), np.asarray(image)


def test_structured_labels_by_hand():
  # 5 objects: count class 5 - 3.
  assert _label('clevr_count_all', objects={'size': tf.zeros(5)})[0] == 2
  # Nearest depth 8.7 lies between the thresholds 8.5 and 9: bin 2.
  coords = tf.constant([[0., 0, 9.9], [0, 0, 8.7]])
  assert _label('clevr_closest_object_distance',
                objects={'pixel_coords': coords})[0] == 2
  # Vehicles (types 0-2) at 30 and 15 m; the pedestrian (3) at 5 m is not
  # one: 15 m is in the bin [8, 20).
  objects = {'type': tf.constant([3, 0, 1]),
             'location': tf.constant([[0., 0, 5], [0, 0, 30], [0, 0, 15]])}
  assert _label('kitti_closest_vehicle_distance', objects=objects)[0] == 1
  objects = {'type': tf.constant([3]), 'location': tf.constant([[0., 0, 5]])}
  assert _label('kitti_closest_vehicle_distance', objects=objects)[0] == 3
  # 40 orientations in 16 bins of 2.5: 39 -> 15, 5 -> 2; the mask -> 255.
  label, image = _label('dsprites_orientation', label_orientation=39)
  assert label == 15 and image.max() == 255
  assert _label('dsprites_orientation', label_orientation=5)[0] == 2
  assert _label('dsprites_x_position', label_x_position=31)[0] == 15
  assert _label('smallnorb_azimuth', label_azimuth=17)[0] == 17
  assert _label('', label=tf.constant(4, tf.int64))[0] == 4
