"""Every kind of export the loop writes, each from a one- or two-step run
of its config on the tests' tiny data (the matrix of `test_exports_*.py`).

`KINDS[kind](fmnist_dirs, root, made)` trains in `root / kind` and returns
(workdir, the config it ran); `made` gives the workdir of a kind it starts
from (the fine-tuning's, the student's teacher, LiT's image tower).
"""

import copy
import os
import re

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from tests import conftest
from tests import helpers
from tests.tasks import test_beit
from tests.tasks import test_captioning
from tests.tasks import test_dino
from tests.tasks import test_lit
from tests.tasks import test_mae
from tests.tasks import test_navit
from tests.tasks import test_segmentation
from tests.tasks import test_siglip
from tests.tasks import test_video
from vit_jax import caption
from vit_jax import features
from vit_jax import launch
from vit_jax import models
from vit_jax import predict
from vit_jax import run_config
from vit_jax.analysis import paper_figures
from vit_jax.checkpoints import record
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.configs import default
from vit_jax.configs import dino_fmnist
from vit_jax.configs import mae_fmnist
from vit_jax.data import local_datasets
from vit_jax.models import lit as lit_models
from vit_jax.tasks import captioning as captioning_task


def _short(config, steps=1):
  """`config` as a run of `steps` steps whose evaluators never run (they
  are the `evaluate` trainer's)."""
  config = config.unlock() if config.is_locked else config
  config.total_steps, config.warmup_steps = steps, 0
  config.checkpoint_every, config.progress_every = 0, 1
  for settings in config.evals.values():
    settings.every = None
  return config


def _default(fmnist_dirs, workdir):
  """The default job (a custom model, no preset), one block."""
  config = default.get_config().unlock()
  config.tfds_manual_dir, config.tfds_data_dir = fmnist_dirs
  config.batch, config.batch_eval, config.shuffle_buffer = 8, 8, 100
  config.model.transformer.num_layers = 1
  return _short(config, 2)


def run(config, workdir, patches=()):
  """Trains `config` in `workdir` with `patches` ((object, name, value))."""
  with pytest.MonkeyPatch.context() as patch:
    for target, name, value in patches:
      patch.setattr(target, name, value)
    launch.train_and_evaluate(config, str(workdir))
  return str(workdir), config


def default_job(dirs, root, made):
  del made
  return run(_default(dirs, root), root)


def finetune(dirs, root, made):
  """The default job again, from the default job's workdir."""
  config = _default(dirs, root)
  config.pretrained_path = made('default')
  return run(run_config.resolve(config), root)  # as `vit_jax.main` does


def preset(dirs, root, made):
  del made
  config = _short(conftest.make_tiny_config(dirs))
  return run(config, root)


def distill(dirs, root, made):
  config = _short(conftest.make_tiny_config(dirs))
  config.trainer = 'distill'
  config.distill.teacher_path = os.path.join(made('preset'), 'testing.npz')
  config.distill.teacher_model = 'testing'
  return run(config, root)


def navit(dirs, root, made):
  del made
  config = test_navit._config(dirs, 'navit', steps=1)  # pylint: disable=protected-access
  return run(_short(config), root)


def mae(dirs, root, made):
  del made
  return run(_short(test_mae._small(mae_fmnist.get_config(), dirs)), root)  # pylint: disable=protected-access


def dino(dirs, root, made):
  del made
  return run(_short(test_dino._small(dino_fmnist.get_config(), dirs)), root)  # pylint: disable=protected-access


def beit(dirs, root, made):
  del made
  tokenizer = _short(test_beit._small('dvae_tokenizer', dirs))  # pylint: disable=protected-access
  run(tokenizer, root / 'tokenizer')
  config = test_beit._small('dvae', dirs, tokenizer_path=str(root / 'tokenizer'))  # pylint: disable=protected-access
  return run(_short(config), root / 'beit')


def lit(dirs, root, made):
  image = os.path.join(made('preset'), 'testing.npz')
  return run(_short(test_lit._config(dirs, image)), root)  # pylint: disable=protected-access


def siglip(dirs, root, made):
  del made
  return run(_short(test_siglip._config(dirs)), root)  # pylint: disable=protected-access


def captioning(dirs, root, made):
  del made
  config = test_captioning._config('cappa', dirs)  # pylint: disable=protected-access
  return run(_short(config), root)


def segmentation(dirs, root, made):
  """A linear probe of the converted golden DINOv2 on 8 + 4 scenes."""
  del made
  config = test_segmentation.probe_config(dirs, root)
  config.update(batch=8, batch_eval=8, shuffle_buffer=8)
  scenes = local_datasets.FashionMnistScenes
  return run(_short(config), root / 'probe',
             [(scenes, 'NUM_TRAIN', 8), (scenes, 'NUM_TEST', 4)])


def vivit(dirs, root, made):
  del made
  clips = local_datasets.MovingFashionMnist
  config = _short(test_video._small('scratch', dirs))  # pylint: disable=protected-access
  return run(config, root, [(clips, 'NUM_TRAIN', 16), (clips, 'NUM_TEST', 6)])


KINDS = {'default': default_job, 'finetune': finetune, 'preset': preset,
         'distill': distill, 'navit': navit, 'mae': mae, 'dino': dino,
         'beit': beit, 'lit': lit, 'siglip': siglip,
         'captioning': captioning, 'segmentation': segmentation,
         'vivit': vivit}


class Made:
  """Each kind's run, made once when first asked for (and the kinds it
  starts from)."""

  def __init__(self, fmnist_dirs, tmp_path_factory):
    self.dirs, self.factory, self.runs = fmnist_dirs, tmp_path_factory, {}

  def __call__(self, kind):
    return self.run(kind)[0]

  def run(self, kind):
    if kind not in self.runs:
      root = self.factory.mktemp(kind)
      self.runs[kind] = KINDS[kind](self.dirs, root, self)
    return self.runs[kind]


# The consumers: each opens a workdir by its path alone, as its command
# line does, and computes what the command would (shapes only where the
# numbers are other tests' business).

IMAGE = os.path.join(helpers.DATA, 'predict_image.jpg')


def define_command_flags():
  """features' and predict's flags, as their commands define them; once
  per process (test_features.py reads them too)."""
  if 'out' not in flags.FLAGS:
    features.define_flags()


define_command_flags()


def _parsed_flags(workdir, tmp_path):
  """The command lines' flags, parsed as `--checkpoint=WORKDIR` alone."""
  flags.FLAGS(['command', f'--checkpoint={workdir}',
               f'--out={tmp_path}/f.npz'])


def _abstract_apply(model, params, size, frames=None):
  images = jax.ShapeDtypeStruct((1, *([frames] if frames else []), size,
                                 size, 3), jnp.float32)
  if isinstance(model, lit_models.LitModel):
    tokens = jax.ShapeDtypeStruct((1, model.pp['max_len']), jnp.int32)
    return jax.eval_shape(lambda p, x, t: model.apply(
        {'params': p}, images=x, tokens=t), params, images, tokens)
  return jax.eval_shape(lambda p, x: model.apply(
      {'params': p}, x, train=False), params, images)


def from_pretrained(workdir, config, tmp_path):
  """The workdir and its export give one model; it applies (a video
  model to a clip of the run's frames)."""
  del tmp_path
  loaded = models.from_pretrained(workdir)
  npz, _ = record.resolve(workdir)
  again = models.from_pretrained(npz)
  jax.tree.map(np.testing.assert_array_equal, loaded.params, again.params)
  assert loaded.model == again.model
  assert jax.tree.leaves(_abstract_apply(
      loaded.model, loaded.params, loaded.transform.size,
      config.video.frames if config.get('video') else None))


def predict_classes(workdir, config, tmp_path):
  """`python -m vit_jax.predict --checkpoint=WORKDIR image`'s steps."""
  _parsed_flags(workdir, tmp_path)
  checkpoint, recorded = converter.checkpoint_and_record(workdir)
  model, params, size = predict.load_classifier(
      None, checkpoint, transform.recorded_size(recorded), recorded)
  spec = predict.transform_for(checkpoint, recorded, size,
                               recorded['model_name'])
  assert spec.size == config.pp.crop
  if getattr(model, 'TAKES_CLIPS', False):  # a GIF of the image moving
    image = Image.open(IMAGE).convert('RGB')
    frames = [image.rotate(5 * i) for i in range(config.video.frames + 3)]
    frames[0].save(tmp_path / 'clip.gif', save_all=True,
                   append_images=frames[1:])
    inputs = [predict.read_clip(tmp_path / 'clip.gif', spec, recorded)]
    assert inputs[0].shape == (config.video.test_views, config.video.frames,
                               spec.size, spec.size, 3)
  else:
    inputs = [predict.read_image(IMAGE, spec)]
  probs = predict.predict(model, params, inputs)
  assert probs.shape == (1, params['head']['kernel'].shape[-1])
  np.testing.assert_allclose(probs.sum(), 1, rtol=1e-5)


def features_of(workdir, config, tmp_path):
  """`python -m vit_jax.features --checkpoint=WORKDIR`'s model: its last
  block's tokens."""
  del config
  _parsed_flags(workdir, tmp_path)
  module, params, spec = features.load(workdir)
  image = jax.ShapeDtypeStruct((1, spec.size, spec.size, 3), jnp.float32)
  shapes = jax.eval_shape(lambda p, x: module.apply(
      {'params': p}, x, method='forward_intermediates', indices=1,
      intermediates_only=True), params, image)
  assert len(shapes) == 1


def analysis_model(workdir, config, tmp_path):
  """`python -m vit_jax.analysis --checkpoint=WORKDIR`'s model."""
  del config, tmp_path
  checkpoint, recorded = converter.checkpoint_and_record(workdir)
  model_config = transform.preset_settings(None, recorded,
                                           source=checkpoint)[0]
  model, params, size = paper_figures.load_model(model_config, checkpoint)
  assert size == recorded['input_size'][-1]
  assert jax.tree.leaves(_abstract_apply(model, params, size))


def convert_layouts(workdir, config, tmp_path):
  """`python -m vit_jax.convert WORKDIR DST` in both layouts; an image
  model's transformers folder reads back to the same outputs (a custom
  model's too, as `ViT-custom`)."""
  del config
  converter.convert(workdir, str(tmp_path / 'timm.safetensors'))
  converter.convert(workdir, str(tmp_path / 'hf'), None, 'transformers')
  assert (tmp_path / 'timm.safetensors').stat().st_size
  exported = models.from_pretrained(workdir)
  if isinstance(exported.model, lit_models.LitModel):
    return  # the folder holds its image tower alone
  again = models.from_pretrained(str(tmp_path / 'hf'))
  assert again.transform == exported.transform
  size = exported.transform.size
  images = np.random.default_rng(0).normal(size=(2, size, size, 3))
  outputs = [m.model.apply({'params': m.params}, images, train=False)
             for m in (exported, again)]
  np.testing.assert_allclose(*outputs, rtol=1e-5, atol=1e-6)


def caption_model(workdir, config, tmp_path):
  """`python -m vit_jax.caption --checkpoint=WORKDIR`'s captioner."""
  del config, tmp_path
  model, params, _, _ = captioning_task.load_captioner(caption.export(workdir))
  assert 'encoder' in params and model.encoder is not None


def evaluate_run(workdir, config, tmp_path):
  """`--config.trainer=evaluate --config.pretrained_path=WORKDIR` of the
  run's own config: its evaluators' metrics."""
  config = copy.deepcopy(config)
  config.trainer, config.pretrained_path = 'evaluate', workdir
  for settings in config.evals.values():
    settings.every = 0
    if 'shots' in settings:  # the tiny splits have 10 images a class
      settings.update(shots=(2,), seeds=1)
  config = run_config.resolve(config)
  result = launch.evaluate(config, str(tmp_path))
  assert result and all(np.isfinite(v) for v in result.values()
                        if isinstance(v, float))


CONSUMERS = {'from_pretrained': from_pretrained, 'predict': predict_classes,
             'features': features_of, 'analysis': analysis_model,
             'convert': convert_layouts, 'caption': caption_model,
             'evaluate': evaluate_run}

# The cells that cannot apply, and the start of the one line that says why.
ENCODERS = ('mae', 'dino', 'beit', 'captioning')
TOWERS = ('lit', 'siglip')
NOT_IMAGE_MODELS = {'navit': 'which no registered family builds',
                    'segmentation': 'is a segmentation probe',
                    'vivit': 'is a video model'}
REFUSED = {
    **{(k, 'predict'): 'has no `head`: it cannot classify' for k in ENCODERS},
    **{(k, 'predict'): 'is a two-tower model' for k in TOWERS},
    **{(k, 'analysis'): 'is not a ViT' for k in TOWERS},
    **{(k, c): why for k, why in NOT_IMAGE_MODELS.items()
       for c in ('from_pretrained', 'predict', 'features', 'analysis')
       if (k, c) not in (('vivit', 'from_pretrained'),
                         ('vivit', 'predict'))},  # clips
    **{(k, 'convert'): 'which has no timm or transformers layout'
       for k in NOT_IMAGE_MODELS},
    **{(k, 'caption'): 'is not a captioner export'
       for k in KINDS if k != 'captioning'},
}


def check(made, kind, consumer, tmp_path):
  """The cell (kind, consumer): it opens the workdir by its path, or says
  in one line, naming the workdir or its export, why it cannot."""
  workdir, config = made.run(kind)
  why = REFUSED.get((kind, consumer))
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))  # conversions
    if why is None:
      CONSUMERS[consumer](workdir, config, tmp_path)
      return
    with pytest.raises(ValueError, match=re.escape(why)) as error:
      CONSUMERS[consumer](workdir, config, tmp_path)
  message = str(error.value)
  assert '\n' not in message and workdir in message, message
