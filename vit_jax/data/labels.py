"""Labels that VTAB's structured tasks derive from tfds features; ReaL's
sets; segmentation masks and depth maps.

Each task maps a decoded example (uint8 image, tfds features) to (image,
label), as google-research/task_adaptation's data classes define them; the
config names one with `pp.label` ('' reads the feature 'label').
"""

from __future__ import annotations  # tf.* annotations: TensorFlow loads lazily

from etils import epy

with epy.lazy_imports():  # TensorFlow loads when first used
  import tensorflow as tf  # pylint: disable=g-import-not-at-top


def _threshold_index(value, thresholds):
  """Index of the last threshold below `value`."""
  below = tf.cast(tf.constant(thresholds, tf.float32) < value, tf.int64)
  return tf.reduce_sum(below) - 1


def _clevr_count_all(image, features):
  return image, tf.size(features['objects']['size'], tf.int64) - 3


def _clevr_closest_object_distance(image, features):
  depth = tf.reduce_min(features['objects']['pixel_coords'][:, 2])
  return image, _threshold_index(depth, [0., 8., 8.5, 9., 9.5, 10., 100.])


def _kitti_closest_vehicle_distance(image, features):
  """Car, Van or Truck (types 0-2); 'no vehicle' beyond the last bin."""
  objects = features['objects']
  depth = tf.boolean_mask(objects['location'][:, 2], objects['type'] < 3)
  nearest = tf.reduce_min(tf.concat([depth, [1000.]], 0))
  return image, _threshold_index(nearest, [-100., 8., 20., 999.])


def _grouped(feature, original, classes, scale=1):
  """Label `feature` with `original` values grouped into `classes` bins."""
  def fn(image, features):
    label = tf.cast(features[feature], tf.float32) // (original / classes)
    return image * scale, tf.cast(label, tf.int64)
  return fn


def _real_labels(image, features):
  """ImageNet ReaL (Beyer et al., 2020): the set of labels raters accepted."""
  return image, features['real_label']


def _segmentation_mask(image, features):
  """A class per pixel: the (H, W, 1) `segmentation_mask` feature."""
  return image, features['segmentation_mask']


def _depth(image, features):
  """A relative depth per pixel: the (H, W, 1) `depth` feature (disparity,
  0 where unknown; `fashion_mnist_scenes`')."""
  return image, features['depth']


# name: (function, number of classes).
TASKS = {
    'clevr_count_all': (_clevr_count_all, 8),
    'clevr_closest_object_distance': (_clevr_closest_object_distance, 6),
    'kitti_closest_vehicle_distance': (_kitti_closest_vehicle_distance, 4),
    # dSprites' images are 0/1 masks.
    'dsprites_x_position': (_grouped('label_x_position', 32, 16, 255), 16),
    'dsprites_orientation': (_grouped('label_orientation', 40, 16, 255), 16),
    'smallnorb_azimuth': (_grouped('label_azimuth', 18, 18), 18),
    'smallnorb_elevation': (_grouped('label_elevation', 9, 9), 9),
    'imagenet2012_real': (_real_labels, 1000),
    # As many classes as the mask feature's labels.
    'segmentation_mask': (_segmentation_mask, None),
    'depth': (_depth, 1),  # one value per pixel
}


def check(name):
  if name and name not in TASKS:
    raise ValueError(f'Unknown pp.label {name!r}; known: {sorted(TASKS)} '
                     "(or '' for the feature 'label').")


def num_classes(name, builder):
  check(name)
  if name == 'segmentation_mask':
    return builder.info.features[name].num_classes
  if name:
    return TASKS[name][1]
  return builder.info.features['label'].num_classes


def apply(name, image, features):
  """(image, label) of a decoded example."""
  if not name:
    return image, features['label']
  image, label = TASKS[name][0](image, features)
  return tf.cast(image, tf.uint8), label
