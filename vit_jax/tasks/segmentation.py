"""Dense probing (`trainer='segmentation'`): a head trained on the maps of
a frozen encoder, its output upsampled bilinearly to the labels' size.

The head (`config.segmentation.head`): 'linear', DINOv2's linear head
(BatchNorm and a 1x1 convolution, `models.segmentation`), or 'dpt'. The
target (`pp.label`): 'segmentation_mask', classes by per-pixel
cross-entropy, pixels of `segmentation.ignore_label` left out (metrics:
the 'segmentation' evaluator's); or 'depth', relative depth (disparity) by
Depth Anything's affine-invariant loss over the known pixels, one output
channel (metrics: the 'depth' evaluator's).

The encoder is any checkpoint that `config.model` (a preset, by
`--config.model_name`) loads from `pretrained_path`, at `pp.crop`; none:
the model at initialization (a baseline). Its parameters are an argument
of the jitted step (as a teacher's), never updated and with no optimizer
state; its maps are computed inside the step. The head's BatchNorm
statistics ride in the state beside its parameters, labelled frozen for
the optimizer and replaced by the step. The run exports the whole model
(encoder and head).
"""

import jax
import jax.numpy as jnp

from vit_jax import losses
from vit_jax.checkpoints import files
from vit_jax.checkpoints import record
from vit_jax.data import pipeline
from vit_jax.data import segmentation as segmentation_data
from vit_jax.models import dpt
from vit_jax.models import segmentation
from vit_jax.platform import sharding
from vit_jax.run import optim
from vit_jax.tasks import base
from vit_jax.tasks import classification
from vit_jax.tasks import encoders
from vit_jax.tasks import registry

CLASSES = 'segmentation_mask'  # pp.label of classes, a `data.labels` task
HEADS = ('linear', 'dpt')


@registry.register
class Task(base.Task):
  """A segmentation or depth head on a frozen encoder."""

  trainers = ('segmentation',)

  @classmethod
  def check_config(cls, config, data_devices):
    super().check_config(config, data_devices)
    label = config.pp.get('label')
    if label not in segmentation_data.TARGETS:
      raise ValueError(f"trainer='segmentation' reads pp.label in "
                       f'{sorted(segmentation_data.TARGETS)}, got {label!r}.')
    settings = config.get('segmentation')
    if settings is None or (label == CLASSES and not isinstance(
        settings.get('ignore_label'), int)):
      raise ValueError("trainer='segmentation' needs config.segmentation "
                       'with an integer ignore_label (and indices, norm).')
    if head_of(config) not in HEADS:
      raise ValueError(f'config.segmentation.head={settings.head!r}; '
                       f'expected one of {HEADS}.')
    if head_of(config) == 'dpt' and settings.get('dpt') is None:
      raise ValueError("config.segmentation.head='dpt' needs "
                       "config.segmentation.dpt (dpt.DPTHead's settings).")

  @classmethod
  def evaluates(cls, config):
    """A segmentation config evaluates a probe's exported .npz."""
    return config.get('segmentation') is not None

  def __init__(self, config, workdir, mesh, *, training=True, info=None):
    del workdir
    self.config, self.mesh = config, mesh
    self.info = info or pipeline.dataset_info(pipeline.get_builder(config),
                                              config)
    if training:
      encoder, params = encoders.load_encoder(config)
    else:  # the checkpoint holds the encoder (`checkpoint`)
      encoder, params = classification.make_model(config, None), None
    self.model = make_model(config, encoder, self.info.num_classes)
    if params is None:
      return
    # On the mesh once: the step's argument and the evaluators' view.
    self.frozen = {'backbone': params}
    self.frozen = jax.device_put(self.frozen, sharding.tree_shardings(
        self.frozen, mesh, config.sharding_rules, config.sharding_strategy))
    # Fails here, before anything compiles, on indices the encoder lacks.
    self._maps = jax.eval_shape(self.features, self.frozen, jnp.zeros(
        (1, config.pp.crop, config.pp.crop, 3)))

  def features(self, frozen, images):
    """The encoder's maps that the head reads."""
    return self.model.apply({'params': frozen}, images, method='features')

  def init_params(self, rng):
    """The head's parameters and BatchNorm statistics."""
    maps = jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), self._maps)
    return self.model.init(rng, maps, method='classify', train=False)

  @staticmethod
  def param_labels(variables):
    """Only the head's parameters train; its statistics are the step's."""
    return {kind: jax.tree.map(lambda _, k=kind: (
        optim.TRAINED if k == 'params' else optim.FROZEN), tree)
            for kind, tree in variables.items()}

  def train_step(self, state, batch, *, rng, frozen):
    """One micro-batch: the frozen maps, the head's loss and update."""
    labels = batch[segmentation_data.target_key(self.config.pp.label)]
    maps = jax.lax.stop_gradient(self.features(frozen, batch['image']))

    def compute_loss(variables):
      logits, updates = self.model.apply(
          variables, maps, method='classify', train=True,
          mutable=['batch_stats'], rngs={'dropout': rng})  # DPT's
      logits = segmentation.upsample(logits, labels.shape[1:])
      return self.loss(logits, labels), updates

    (value, updates), grads = jax.value_and_grad(
        compute_loss, has_aux=True)(state.params)
    state = state.apply_gradients(grads=grads)
    return state.replace(params={**state.params, **updates}), {'loss': value}

  def loss(self, logits, labels):
    """The target's loss of the upsampled output."""
    if self.config.pp.label == CLASSES:
      return losses.pixel_cross_entropy(
          logits, labels, self.config.segmentation.ignore_label)
    return losses.affine_invariant_depth(logits[..., 0], labels, labels > 0)

  def batches(self, *, batch_size, rows, start_step):
    return segmentation_data.train_iterator(
        self.info, self.config, batch_size=batch_size, rows=rows,
        start_step=start_step)

  def checkpoint(self, path):
    """(the segmenter, its variables) of a probe's exported .npz."""
    variables = files.load(path)
    if 'params' not in variables:  # read as big_vision's 'params/...'
      variables = {'params': variables}
    if 'backbone' not in variables['params']:
      raise files.CheckpointError(
          f'{path} is not a segmentation probe (its export holds params/'
          'backbone, the head and its batch_stats); probe an encoder with '
          "trainer='segmentation'.")
    return self.model, variables

  def exported_records(self):
    """The backbone's record, and the probe's settings (`segmentation`)."""
    settings = self.config.segmentation
    return {'': {**record.of_run(self.config, self.model.backbone),
                 'model_class': type(self.model).__name__,
                 'segmentation': {'num_classes': self.model.num_classes,
                                  'indices': list(settings.indices),
                                  'norm': settings.norm,
                                  'head': head_of(self.config),
                                  'target': self.config.pp.label}}}

  def exported_params(self, params):
    """The whole model's variables: the encoder's and the head's (and its
    BatchNorm statistics, where it has any)."""
    return {**params, 'params': {**params['params'], **self.frozen}}


def head_of(config):
  """`config.segmentation.head`; 'linear' where a config names none."""
  return config.segmentation.get('head', 'linear')


def make_model(config, encoder, num_classes):
  """The dense model of `config.segmentation` on `encoder`: the linear
  head, or DPT's (`segmentation.dpt`, `dpt.DPTHead`'s settings), its output
  at the images' size."""
  settings = config.segmentation
  indices = tuple(settings.indices)
  if head_of(config) == 'linear':
    return segmentation.LinearSegmenter(encoder, num_classes, indices,
                                        settings.norm)
  kind = 'segmentation' if config.pp.label == CLASSES else 'depth'
  options = settings.dpt.to_dict()
  options['out_channels'] = tuple(options['out_channels'])
  head = dpt.DPTHead(**options, head=kind, num_classes=(
      num_classes if kind == 'segmentation' else None))
  return segmentation.DPTSegmenter(encoder, head, indices, settings.norm,
                                   size=(config.pp.crop, config.pp.crop))
