"""Mixup, CutMix and label smoothing of a training batch, on the device.

Each example is mixed with its neighbour in the batch (`jnp.roll` by one
along the batch axis, as big_vision's `utils.mixup`), with one weight and
one box per batch. Under `jax.jit` the roll is over the global batch, so a
mixed batch is the same on 1 or 8 devices. All randomness comes from the
key passed in.

  * Mixup (Zhang et al. 2018), as big_vision: a ~ Beta(p, p), a = max(a,
    1 - a); images and labels are a * x + (1 - a) * roll(x).
  * CutMix (Yun et al. 2019), as timm: lam ~ Beta(alpha, alpha); a box of
    area (1 - lam) of the image, centred uniformly and clipped to it, is
    pasted from the rolled batch; the labels take the pasted area of the
    clipped box exactly as the rolled examples' weight.
  * Both: CutMix with probability `switch_prob`, else Mixup, per batch (DeiT:
    timm's `Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5)`).
  * Label smoothing: y * (1 - eps) + eps * sum(y) / K, timm's y * (1 - eps)
    + eps / K for one-hot and mixed labels (sum 1). A multi-hot row keeps
    its mass: softmax cross-entropy's normalized target is then the smoothed
    normalized labels. Mixing and smoothing commute.

Config (`configs/common.py`): `mixup.p`, `mixup.cutmix_alpha`,
`mixup.switch_prob`, `label_smoothing`; all off by default.
"""

import jax
import jax.numpy as jnp

# Folded into the step's key for the mixing draws (the dropout key is the
# step's key itself, unchanged from runs without mixing).
STREAM = 0x6D6978


def check_config(config):
  """Raises ValueError on a mixing setting out of range."""
  p, alpha, switch, eps = _settings(config)
  for name, value in (('mixup.p', p), ('mixup.cutmix_alpha', alpha)):
    if value < 0:
      raise ValueError(f'config.{name}={value}; expected >= 0 (0: off).')
  if not 0 <= switch <= 1:
    raise ValueError(f'config.mixup.switch_prob={switch}; expected a '
                     'probability in [0, 1].')
  if not 0 <= eps <= 1:
    raise ValueError(f'config.label_smoothing={eps}; expected in [0, 1] '
                     '(0: off).')


def _settings(config):
  """(p, cutmix_alpha, switch_prob, label_smoothing); absent keys are off."""
  mixup = config.get('mixup') or {}
  return (float(mixup.get('p', 0.0)), float(mixup.get('cutmix_alpha', 0.0)),
          float(mixup.get('switch_prob', 0.5)),
          float(config.get('label_smoothing', 0.0)))


def augment(step_rng, images, labels, config):
  """`images`, `labels` mixed and smoothed as `config` says; themselves
  when it says nothing. `step_rng` is the step's key."""
  check_config(config)
  p, alpha, switch, eps = _settings(config)
  if p or alpha:
    images, labels = mix(jax.random.fold_in(step_rng, STREAM), images, labels,
                         p=p, cutmix_alpha=alpha, switch_prob=switch)
  if eps:
    labels = smooth_labels(labels, eps)
  return images, labels


def mix(rng, images, labels, *, p=0.0, cutmix_alpha=0.0, switch_prob=0.5):
  """Mixup (`p` > 0), CutMix (`cutmix_alpha` > 0), or either per batch
  (both > 0: CutMix with probability `switch_prob`).

  images: (batch, height, width, channels); labels: (batch, classes).
  """
  if p <= 0 and cutmix_alpha <= 0:
    raise ValueError('Nothing to mix: set p or cutmix_alpha > 0.')
  k_mixup, k_cutmix, k_switch = jax.random.split(rng, 3)
  if cutmix_alpha <= 0:
    a = mixup_weight(k_mixup, p)
    return _blend(images, labels, a, a)
  box = cutmix_box(k_cutmix, cutmix_alpha, images.shape[1:3])
  keep = 1.0 - box.astype(jnp.float32)  # own pixels 1, pasted 0
  own_label = keep.mean()  # exactly 1 - the pasted area fraction
  if p <= 0:
    return _blend(images, labels, keep[:, :, None], own_label)
  a = mixup_weight(k_mixup, p)
  use_cutmix = jax.random.uniform(k_switch) < switch_prob
  return _blend(images, labels,
                jnp.where(use_cutmix, keep[:, :, None], a),
                jnp.where(use_cutmix, own_label, a))


def mixup_weight(rng, p):
  """big_vision's weight of each example itself: max(a, 1 - a), a ~ Beta(p,
  p); at least 0.5, so every example stays the larger part of its mix."""
  a = jax.random.beta(rng, p, p)
  return jnp.maximum(a, 1.0 - a)


def cutmix_box(rng, alpha, size):
  """(height, width) booleans: True inside the pasted box.

  lam ~ Beta(alpha, alpha); the box has sides int(side * sqrt(1 - lam)) and
  a centre uniform over the image (timm's `rand_bbox`, which also rounds an
  odd side down to even), and is clipped to the image.
  """
  height, width = size
  k_lam, k_y, k_x = jax.random.split(rng, 3)
  ratio = jnp.sqrt(1.0 - jax.random.beta(k_lam, alpha, alpha))

  def span(key, side):
    cut = (side * ratio).astype(jnp.int32)
    start = jax.random.randint(key, (), 0, side) - cut // 2
    pixels = jnp.arange(side)
    return (pixels >= start) & (pixels < start + cut)

  return span(k_y, height)[:, None] & span(k_x, width)[None, :]


def _blend(images, labels, image_weight, label_weight):
  """weight * x + (1 - weight) * roll(x, 1) of images and of labels."""
  def blend(x, weight):
    weight = jnp.asarray(weight, x.dtype)
    return weight * x + (1 - weight) * jnp.roll(x, 1, axis=0)

  return blend(images, image_weight), blend(labels, label_weight)


def smooth_labels(labels, eps):
  """labels * (1 - eps) + eps * (each row's sum) / num_classes."""
  mass = labels.sum(-1, keepdims=True)
  return labels * (1 - eps) + eps * mass / labels.shape[-1]
