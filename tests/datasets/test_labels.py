"""ImageNet ReaL: a prediction is right if it is in the image's label set."""

import ml_collections
import numpy as np
import tensorflow as tf

from vit_jax.configs import common
from vit_jax.data import pipeline as input_pipeline
from vit_jax.evaluators import classification


def test_label_sets_become_multi_hot_and_empty_sets_are_not_counted():
  info = input_pipeline.DatasetInfo(builder=None, num_classes=5, num_train=1,
                                    num_test=1, channels=3)
  pp = ml_collections.ConfigDict(dict(crop=8, label='imagenet2012_real'))
  png = tf.io.encode_png(np.zeros((8, 8, 3), np.uint8))
  for labels, hot, mask in (([1, 3], [0, 1, 0, 1, 0], 1), ([], [0] * 5, 0)):
    out = input_pipeline.eval_example(
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
