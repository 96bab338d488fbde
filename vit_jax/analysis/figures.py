"""The paper's Figure 6 and 7 panels, DINO's class-token attention, LiT's
similarity matrix and MAE's reconstructions.

Each function returns a matplotlib figure. The backend is the caller's: a
notebook's inline one shows them, the command line picks Agg for files.
"""

from etils import epath
import matplotlib.pyplot as plt
import numpy as np

DPI = 90
MARKER_AREA = 14  # points^2, of the attention-distance dots
MASK_GRAY = 0.5  # how a patch that MAE removed is shown


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
    ax.scatter(np.arange(1, layers + 1), distance[:, h], s=MARKER_AREA,
               label=f'head {h + 1}' if heads <= 8 else None)
  if uniform is not None:
    ax.axhline(uniform, color='gray', ls='--', lw=1, label='uniform')
  ax.set_xlabel('network depth (layer)')
  ax.set_ylabel('mean attention distance (pixels)')
  ax.set_xticks(np.arange(1, layers + 1))
  # From 0, with room above the highest dot (or line) for its whole marker.
  top = max(np.max(distance), uniform or 0)
  ax.set_ylim(0, 1.08 * top if top > 0 else 1)
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


def _frame(ax):
  """No ticks, a thin gray frame: white images keep their edges."""
  ax.set_xticks([])
  ax.set_yticks([])
  for spine in ax.spines.values():
    spine.set_color('0.7')


def rollout(images, maps):
  """Fig. 6: the images; their rollout maps alone; the maps over the images.

  The map alone reads on any image; the overlay darkens the image first so
  that the colours stand out on white backgrounds too.
  """
  n = len(images)
  fig, axes = plt.subplots(3, n, figsize=(1.1 * n, 3.4), dpi=DPI,
                           squeeze=False)
  for k, (image, heat) in enumerate(zip(_to_rgb(images), maps)):
    axes[0, k].imshow(image)
    axes[1, k].imshow(heat, cmap='inferno', vmin=0, vmax=1)
    axes[2, k].imshow(0.4 * image)
    axes[2, k].imshow(heat, cmap='inferno', alpha=0.6, vmin=0, vmax=1)
    for ax in axes[:, k]:
      _frame(ax)
  for ax, title in zip(axes[:, 0], ('input', 'attention rollout',
                                    'rollout over the input')):
    ax.set_title(title, fontsize=7, loc='left')
  fig.tight_layout()
  return fig


def class_token_attention(images, maps):
  """DINO's Fig. 1: a row per image, the image then each head's map.

  Args:
    images: (n, height, width, 3) model inputs in [-1, 1].
    maps: (n, heads, height, width), e.g. `attention.class_token_maps`.

  Each map is scaled to its own maximum, as DINO saves each head's: heads
  differ in how peaked they are, and a shared scale would hide the flat ones.
  """
  n, heads = maps.shape[:2]
  fig, axes = plt.subplots(n, heads + 1, figsize=(1.1 * (heads + 1),
                                                  1.1 * n + .3),
                           dpi=DPI, squeeze=False)
  for k, (image, row) in enumerate(zip(_to_rgb(images), maps)):
    axes[k, 0].imshow(image)
    for h, heat in enumerate(row, start=1):
      axes[k, h].imshow(heat / max(heat.max(), 1e-12), cmap='inferno',
                        vmin=0, vmax=1)
  for ax in axes.ravel():
    _frame(ax)
  for h, ax in enumerate(axes[0]):
    ax.set_title(f'head {h}' if h else 'input', fontsize=7, loc='left')
  fig.tight_layout()
  return fig


def similarity_matrix(similarity, texts, image_labels):
  """LiT: the cosine similarity of each image (row) with each text."""
  fig, ax = plt.subplots(figsize=(6, 5), dpi=DPI)
  image = ax.imshow(similarity, cmap='viridis')
  ax.set_xticks(range(len(texts)), texts, rotation=90)
  ax.set_yticks(range(len(image_labels)), image_labels)
  ax.set_xlabel('texts')
  ax.set_ylabel('images (true class)')
  fig.colorbar(image, ax=ax, label='cosine similarity')
  fig.tight_layout()
  return fig


def mae_reconstructions(images, mask, recon):
  """MAE's Figure 2 grid: rows of images, masked images, reconstructions, each
  in [0, 1]; removed patches gray."""
  masked = np.where(mask > 0, MASK_GRAY, images)
  rows = (('image', images), ('masked', masked), ('reconstruction', recon))
  n = len(images)
  fig = plt.figure(figsize=(1.2 * n + 1.2, 3.8), dpi=DPI)
  axes = fig.subplots(3, n, squeeze=False)
  for i, (label, row) in enumerate(rows):
    for j in range(n):
      axes[i, j].imshow(row[j], vmin=0, vmax=1, interpolation='nearest')
      axes[i, j].set_xticks([])
      axes[i, j].set_yticks([])
    axes[i, 0].set_ylabel(label, fontsize=9)
  fig.tight_layout()
  return fig


def save(fig, path):
  """Writes `fig` to `path` (local or in a bucket), in its suffix's format."""
  path = epath.Path(path)
  with path.open('wb') as f:
    fig.savefig(f, dpi=DPI, format=path.suffix[1:])
  plt.close(fig)


# The figures a run's task leaves as arrays (`{workdir}/NAME.npz`, e.g. MAE's
# `finish`), drawn as `{workdir}/NAME.png` once the run ends.
RUN_FIGURES = {'mae_reconstructions': mae_reconstructions}


def draw_run_figures(workdir) -> None:
  """Draws each of `RUN_FIGURES` whose arrays the run wrote (process 0)."""
  for name, draw in RUN_FIGURES.items():
    arrays = epath.Path(workdir) / f'{name}.npz'
    if arrays.exists():
      with arrays.open('rb') as f:
        data = dict(np.load(f))
      path = arrays.with_suffix('.png')
      save(draw(**data), path)
      print(f'{name}: {path}', flush=True)
