"""The training losses: classification's, and image-text's.

Classification: per-example softmax or sigmoid cross-entropy of logits
against (soft) label vectors.

Image-text, on L2-normalized embeddings of matching pairs. Row i of `zimg` and of `ztxt` come from the same (image, caption) pair; every
other pairing in the batch is a negative.

softmax (CLIP, LiT): InfoNCE in both directions, each image classifying its
  caption among the batch's captions and each caption its image:
  logits = t zimg ztxt^T, loss = mean_i (CE(row i, i) + CE(column i, i)) / 2.
sigmoid (SigLIP, Zhai et al., ICCV 2023): every pair is a binary problem,
  label +1 on the diagonal and -1 off it: logits = t zimg ztxt^T + b,
  loss = -sum_ij log sigmoid(label_ij logits_ij) / batch; chunked over the
  devices by `sigmoid_loss_chunked`.
"""

import jax
import jax.numpy as jnp
import optax


CLASSIFICATION = ('softmax_xent', 'sigmoid_xent')


def classification(logits, labels, kind: str):
  """Per-example loss: softmax or sigmoid cross-entropy."""
  if kind == 'sigmoid_xent':
    return optax.sigmoid_binary_cross_entropy(logits, labels).sum(-1)
  return optax.softmax_cross_entropy(logits, labels)


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
  return jax.shard_map(local, mesh=mesh, out_specs=replicated,
                       in_specs=(spec, spec, replicated, replicated))(
                           zimg, ztxt, t, b)


CONTRASTIVE = {'softmax': softmax_loss, 'sigmoid': sigmoid_loss}


def retrieval_accuracy(zimg, ztxt):
  """Fraction of images whose own caption is the nearest one in the batch."""
  return jnp.mean(jnp.argmax(zimg @ ztxt.T, axis=1) ==
                  jnp.arange(zimg.shape[0]))
