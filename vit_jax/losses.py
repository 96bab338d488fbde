"""The training losses: classification's, segmentation's, image-text's and
DINO's.

Classification: per-example softmax or sigmoid cross-entropy of logits
against (soft) label vectors; segmentation: per pixel, some ignored;
relative depth: Depth Anything's affine-invariant loss
(`affine_invariant_depth`).

Image-text, on L2-normalized embeddings of matching pairs. Row i of `zimg` and of `ztxt` come from the same (image, caption) pair; every
other pairing in the batch is a negative.

softmax (CLIP, LiT): InfoNCE in both directions, each image classifying its
  caption among the batch's captions and each caption its image:
  logits = t zimg ztxt^T, loss = mean_i (CE(row i, i) + CE(column i, i)) / 2.
sigmoid (SigLIP, Zhai et al., ICCV 2023): every pair is a binary problem,
  label +1 on the diagonal and -1 off it: logits = t zimg ztxt^T + b,
  loss = -sum_ij log sigmoid(label_ij logits_ij) / batch; chunked over the
  devices by `sigmoid_loss_chunked`.

Self-distillation (DINO, Caron et al., 2021; iBOT; DINOv2), on scores over
K prototypes: the teacher's scores become targets, sharpened by a low
temperature and centred (`centered_softmax`, or DINOv2's `sinkhorn_knopp`);
the student's scores at temperature 0.1 are fitted by cross-entropy
between different views (`dino_loss`), from local views to the global one
(`silc_loss`) or at masked patches (`ibot_loss`);
`koleo_loss` spreads features apart.
"""

import jax
import jax.numpy as jnp
import optax

try:
  from jax import shard_map  # jax >= 0.6.1
except ImportError:  # jax 0.5.3 - 0.6.0
  from jax.experimental.shard_map import shard_map


CLASSIFICATION = ('softmax_xent', 'sigmoid_xent')


def classification(logits, labels, kind: str):
  """Per-example loss: softmax or sigmoid cross-entropy."""
  if kind == 'sigmoid_xent':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  return optax.softmax_cross_entropy(logits, labels)


def pixel_cross_entropy(logits, labels, ignore_label: int):
  """Mean softmax cross-entropy over the pixels whose label is not
  `ignore_label`: `logits` (batch, H, W, K), `labels` (batch, H, W) ints."""
  valid = labels != ignore_label
  per_pixel = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), jnp.where(valid, labels, 0))
  return jnp.sum(per_pixel * valid) / jnp.maximum(jnp.sum(valid), 1)


def masked_median(x, valid):
  """The median of each row of `x` (batch, n) over its `valid` entries
  (numpy's: the mean of the two middle ones of an even count; 0 where none
  is valid)."""
  count = jnp.sum(valid, -1, keepdims=True)
  ordered = jnp.sort(jnp.where(valid, x, jnp.inf), -1)
  middle = lambda i: jnp.take_along_axis(ordered, jnp.maximum(i, 0), -1)
  median = (middle((count - 1) // 2) + middle(count // 2)) / 2
  return jnp.where(count > 0, median, 0.)[:, 0]


def _affine_normalized(d, valid, eps):
  """(d - t(d)) / s(d) per row: t the median, s the mean absolute deviation
  from it, both over the valid entries."""
  t = masked_median(d, valid)[:, None]
  count = jnp.maximum(jnp.sum(valid, -1, keepdims=True), 1)
  s = jnp.sum(jnp.abs(d - t) * valid, -1, keepdims=True) / count
  return (d - t) / jnp.maximum(s, eps)


def affine_invariant_depth(prediction, target, valid, eps: float = 1e-6):
  """Depth Anything's affine-invariant loss (Yang et al., 2024, Sec. 3.1:
  MiDaS's scale-and-shift-invariant L_ssimae, Ranftl et al., 2020, Sec. 5,
  without its trimming).

  Each map d, predicted and true, is normalized over the image's valid
  pixels as d^ = (d - t(d)) / s(d), t(d) = median(d), s(d) = mean |d - t(d)|
  (so the loss ignores the scale and shift of either); the loss is
  mean |d^_pred - d^_true| over those pixels, per image, then the mean
  over the images with any valid pixel. Relative depth is disparity
  (inverse depth), as both papers train it.

  Args:
    prediction, target: (batch, H, W) maps.
    valid: (batch, H, W) where the target is known.
    eps: the least s(d) (a flat map normalizes to 0, not to infinity).
  """
  batch = prediction.shape[0]
  valid = valid.reshape(batch, -1)
  pred = _affine_normalized(prediction.reshape(batch, -1).astype(jnp.float32),
                            valid, eps)
  true = _affine_normalized(target.reshape(batch, -1).astype(jnp.float32),
                            valid, eps)
  count = jnp.sum(valid, -1)
  per_image = jnp.sum(jnp.abs(pred - true) * valid, -1) / jnp.maximum(count,
                                                                      1)
  has_pixels = count > 0
  return jnp.sum(per_image * has_pixels) / jnp.maximum(jnp.sum(has_pixels), 1)


def token_cross_entropy(logits, targets, weights):
  """Softmax cross-entropy per token, summed with `weights` and divided by
  their sum (big_vision's `weighted_softmax_xent(normalize=True)`):
  `logits` (batch, L, V), `targets` (batch, L) ints, `weights` (batch, L)."""
  per_token = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), targets)
  return jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1)


def softmax_loss(zimg, ztxt, t, b=None):
  """Symmetric InfoNCE; `b` is ignored (a softmax is shift-invariant)."""
  del b
  logits = t * zimg @ ztxt.T
  labels = jnp.arange(logits.shape[0])
  i2t = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  t2i = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels)
  return jnp.mean(i2t + t2i) / 2


def sigmoid_loss(zimg, ztxt, t, b):
  """SigLIP: a sum over all pairs of binary log-losses, per example."""
  logits = t * zimg @ ztxt.T + b
  labels = 2 * jnp.eye(logits.shape[0]) - 1
  return -jnp.sum(jax.nn.log_sigmoid(labels * logits)) / logits.shape[0]


def sigmoid_loss_chunked(zimg, ztxt, t, b, *, mesh, axis='data'):
  """`sigmoid_loss` without the global batch x batch logits (SigLIP's
  chunked form, Sec. 3.3): each device scores its images against its own
  captions (the positives), then passes its captions on around the ring of
  `axis` and adds each chunk's negatives. Rows of `zimg` and `ztxt` are
  sharded over `axis`; the largest product is local x local."""
  devices = mesh.shape[axis]
  ring = [(i, (i + 1) % devices) for i in range(devices)]

  def local(zimg, ztxt, t, b):
    # Recomputed in the backward pass: it keeps each chunk's captions, not
    # its local x local logits (all of them would be local x global again).
    @jax.checkpoint
    def chunk(ztxt, labels):
      logits = t * zimg @ ztxt.T + b
      return -jnp.sum(jax.nn.log_sigmoid(labels * logits))

    n = zimg.shape[0]
    loss = chunk(ztxt, 2 * jnp.eye(n) - 1)

    def next_chunk(carry, _):
      ztxt, loss = carry
      ztxt = jax.lax.ppermute(ztxt, axis, ring)
      return (ztxt, loss + chunk(ztxt, -1.)), None

    (_, loss), _ = jax.lax.scan(next_chunk, (ztxt, loss), None,
                                length=devices - 1)
    return jax.lax.psum(loss, axis) / (n * devices)

  spec = jax.sharding.PartitionSpec(axis)
  replicated = jax.sharding.PartitionSpec()
  return shard_map(local, mesh=mesh, out_specs=replicated,
                   in_specs=(spec, spec, replicated, replicated))(
                       zimg, ztxt, t, b)


CONTRASTIVE = {'softmax': softmax_loss, 'sigmoid': sigmoid_loss}


def retrieval_accuracy(zimg, ztxt):
  """Fraction of images whose own caption is the nearest one in the batch."""
  return jnp.mean(jnp.argmax(zimg @ ztxt.T, axis=1) ==
                  jnp.arange(zimg.shape[0]))


# Self-distillation.


def centered_softmax(teacher, center, temperature):
  """DINO's targets: softmax((teacher - center) / temperature)."""
  return jax.nn.softmax((teacher - center) / temperature, axis=-1)


def sinkhorn_knopp(teacher, temperature, iterations: int = 3, valid=None):
  """DINOv2's targets: exp(teacher / temperature) (n, K) scaled, in turn,
  so that each prototype holds 1/K of the mass and each row 1/n
  (`iterations` times), then rows times n (each sums to 1). `valid` (n,)
  leaves padding rows out (zero targets). Sums run over the whole global
  batch, as DINOv2's all-reduce."""
  valid = jnp.ones(teacher.shape[:1]) if valid is None else valid
  valid = valid.astype(jnp.float32)[:, None]
  # The maximum cancels in the first normalization; it keeps exp finite.
  q = jnp.exp((teacher - jnp.max(teacher)) / temperature) * valid
  n, k = jnp.sum(valid), teacher.shape[-1]
  q = q / jnp.sum(q)
  for _ in range(iterations):
    q = q / jnp.sum(q, axis=0, keepdims=True) / k
    q = q / (jnp.sum(q, axis=1, keepdims=True) + (1 - valid)) / n
  return q * n


def dino_loss(student, teacher, temperature):
  """DINO's loss: the mean over pairs of views (teacher view t, student view
  v != t) of the batch mean of -sum_k p_t log softmax(s_v / temperature).

  `student` (V, B, K): scores of V views, the teacher's T views first, in
  the same order; `teacher` (T, B, K): target distributions.
  """
  log_p = jax.nn.log_softmax(student / temperature, axis=-1)
  ce = -jnp.einsum('tbk,vbk->tv', teacher, log_p) / student.shape[1]
  t, v = ce.shape
  pairs = 1. - jnp.eye(t, v)
  return jnp.sum(ce * pairs) / jnp.sum(pairs)


def silc_loss(student, teacher, temperature):
  """SILC's local-to-global loss: the mean over local views v and images b
  of -sum_k p_bk log softmax(s_vb / temperature)_k. `student` (V, B, K):
  the local views' scores; `teacher` (B, K): target distributions of the
  global view."""
  log_p = jax.nn.log_softmax(student / temperature, axis=-1)
  return -jnp.mean(jnp.sum(teacher[None] * log_p, -1))


def ibot_loss(student, teacher, weight, temperature):
  """iBOT's loss at masked patches: -sum weight * sum_k p log softmax(s / T),
  over the batch's images (masked or not). `student`, `teacher` (B, m, K);
  `weight` (B, m): 1 / (patches masked in the image), 0 on padding."""
  log_p = jax.nn.log_softmax(student / temperature, axis=-1)
  return -jnp.sum(weight * jnp.sum(teacher * log_p, -1)) / student.shape[0]


def koleo_loss(x, eps: float = 1e-8):
  """KoLeo (Sablayrolles et al., 2019; DINOv2): -mean_i log(distance from
  L2-normalized x_i to its nearest neighbour x_j, j != i)."""
  x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)
  dots = x @ x.T - 3. * jnp.eye(x.shape[0])  # never one's own neighbour
  nearest = x[jnp.argmax(dots, axis=-1)]
  return -jnp.mean(jnp.log(jnp.linalg.norm(x - nearest + eps, axis=-1) + eps))
