"""The paper's Figure 6 and 7 panels, drawn with matplotlib (Agg)."""

from etils import epath
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
import numpy as np

DPI = 90


def _to_rgb(images):
  """[-1, 1] model inputs -> [0, 1] for display."""
  return np.clip((np.asarray(images) + 1) / 2, 0, 1)


def attention_distance(distance, uniform=None, title=''):
  """Fig. 7 right: one dot per head at each layer's depth.

  Args:
    distance: (layers, heads) mean attention distance in pixels.
    uniform: the distance of uniform attention, drawn as a dashed line.
    title: of the axes.
  """
  fig, ax = plt.subplots(figsize=(4, 3.2), dpi=DPI)
  layers, heads = distance.shape
  for h in range(heads):
    ax.scatter(np.arange(1, layers + 1), distance[:, h], s=14,
               label=f'head {h}' if heads <= 8 else None)
  if uniform is not None:
    ax.axhline(uniform, color='gray', ls='--', lw=1, label='uniform')
  ax.set_xlabel('network depth (layer)')
  ax.set_ylabel('mean attention distance (pixels)')
  ax.set_xticks(np.arange(1, layers + 1))
  ax.set_ylim(bottom=0)
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=6, loc='lower right')
  fig.tight_layout()
  return fig


def position_similarity(similarity):
  """Fig. 7 centre: for each patch (row, column), its cosine similarity
  map over all patches; (h, w, h, w) input."""
  h, w = similarity.shape[:2]
  fig, axes = plt.subplots(h, w, figsize=(0.55 * w + 1.4, 0.55 * h + 0.5),
                           dpi=DPI, squeeze=False)
  for i in range(h):
    for j in range(w):
      image = axes[i, j].imshow(similarity[i, j], vmin=-1, vmax=1,
                                cmap='viridis')
      axes[i, j].set_xticks([])
      axes[i, j].set_yticks([])
  for j in range(w):
    axes[-1, j].set_xlabel(str(j + 1), fontsize=7)
  for i in range(h):
    axes[i, 0].set_ylabel(str(i + 1), fontsize=7)
  fig.supxlabel('input patch column', fontsize=8)
  fig.supylabel('input patch row', fontsize=8)
  fig.colorbar(image, ax=axes, shrink=0.8, label='cosine similarity')
  return fig


def filters(components, variance):
  """Fig. 7 left: principal components of the patch filters, each scaled
  to [0, 1]; (count, ph, pw, channels) input."""
  count = len(components)
  cols = min(count, 7)
  rows = -(-count // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(cols * 0.8, rows * 0.8 + .3),
                           dpi=DPI, squeeze=False)
  for ax in axes.ravel():
    ax.axis('off')
  for k, (c, v) in enumerate(zip(components, variance)):
    c = (c - c.min()) / max(c.max() - c.min(), 1e-12)
    ax = axes.ravel()[k]
    ax.imshow(c if c.shape[-1] == 3 else c[..., 0], cmap='gray',
              interpolation='nearest')
    ax.set_title(f'{v:.0%}', fontsize=6)
  fig.suptitle('principal components of the patch filters', fontsize=8)
  return fig


def rollout(images, maps):
  """Fig. 6: the images, then the rollout maps overlaid on them."""
  n = len(images)
  fig, axes = plt.subplots(2, n, figsize=(1.1 * n, 2.3), dpi=DPI,
                           squeeze=False)
  for k, (image, heat) in enumerate(zip(_to_rgb(images), maps)):
    axes[0, k].imshow(image)
    axes[1, k].imshow(image)
    # A colour overlay, not the paper's masking: dark images stay readable.
    axes[1, k].imshow(heat, cmap='inferno', alpha=0.6, vmin=0, vmax=1)
    axes[0, k].axis('off')
    axes[1, k].axis('off')
  axes[0, 0].set_title('input', fontsize=7, loc='left')
  axes[1, 0].set_title('attention rollout', fontsize=7, loc='left')
  fig.tight_layout()
  return fig


def save(fig, path):
  """Writes `fig` to `path` (local or in a bucket), in its suffix's format."""
  path = epath.Path(path)
  with path.open('wb') as f:
    fig.savefig(f, dpi=DPI, format=path.suffix[1:])
  plt.close(fig)
