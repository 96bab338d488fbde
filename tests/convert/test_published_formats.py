"""Hub folders as older transformers versions wrote them, which hub repos
still hold (tests/data/transformers_older, `scripts/make_transformers_
golden.py --older`): feature extractors' preprocessor files, config.json
files that leave defaults out, pytorch_model.bin with its buffers, sharded
safetensors. Each holds the weights of a folder of tests/data/transformers,
so transformers_golden.npz has its outputs; the script checked that
transformers computes them from the older folder too."""

import json
import os
import shutil

import numpy as np
import pytest

from tests import helpers
from vit_jax import pretrained
from vit_jax.convert import converter
from vit_jax.convert import torch_files
from vit_jax.convert import transform
from vit_jax.convert import transformers_config
from vit_jax.convert import transformers_defaults

OLDER = os.path.join(helpers.DATA, 'transformers_older')
GOLDEN = np.load(os.path.join(helpers.DATA, 'transformers_golden.npz'))
PIXELS = np.load(os.path.join(helpers.DATA, 'transformers_older_pixels.npz'))
DEFAULTS = json.loads(open(os.path.join(
    helpers.DATA, 'transformers_defaults.json')).read())


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


def _relative_error(have, want):
  return float(np.abs(np.asarray(have) - want).max() / np.abs(want).max())


def _json(value):
  return json.loads(json.dumps(value))


@pytest.mark.parametrize('model_type', transformers_defaults.CONFIGS)
def test_config_defaults_are_transformers(model_type):
  have = DEFAULTS['configs'][model_type]
  for key, value in transformers_defaults.CONFIGS[model_type].items():
    assert _json(value) == pytest.approx(have[key]), key


@pytest.mark.parametrize('name', transformers_defaults.PROCESSORS)
def test_processor_defaults_are_transformers(name):
  have = DEFAULTS['processors'][name]
  _, defaults = transformers_defaults.PROCESSORS[name]
  for key, value in defaults.items():
    if key == 'do_center_crop':  # transformers says None for no crop
      assert value == bool(have.get(key)), key
    else:
      assert _json(value) == pytest.approx(have.get(key)), key


# Older folder: (image side, its golden outputs' name, the output compared).
IMAGE_MODELS = {
    'vit_feature_extractor': (32, 'vit', 'logits'),
    'deit_feature_extractor': (32, 'deit', 'logits'),
    'siglip_vision_sparse': (32, 'siglip_vision', 'pooler_output'),
    'vit_sharded': (32, 'vit', 'logits'),
}


@pytest.mark.parametrize('name', IMAGE_MODELS)
def test_image_models_give_transformers_outputs(name):
  """Converted with no flags. The sparse SigLIP config's tanh GELU and
  eps 1e-6 are its defaults' (an exact GELU would be off by ~1e-4)."""
  side, base, key = IMAGE_MODELS[name]
  m = pretrained.from_pretrained(os.path.join(OLDER, name), image_size=side)
  got = m.model.apply({'params': m.params}, GOLDEN[f'images/{side}'],
                      train=False)
  assert _relative_error(got, GOLDEN[f'{base}/{key}']) < 1e-4
  now = pretrained.from_pretrained(
      os.path.join(helpers.DATA, 'transformers', base), image_size=side)
  assert m.transform == now.transform
  assert m.model == now.model


@pytest.mark.parametrize('name,base', [('clip_bin', 'clip'),
                                       ('siglip_sparse', 'siglip')])
def test_two_towers_give_transformers_embeddings(name, base, capfd):
  """CLIP from pytorch_model.bin (no torch), its position_ids buffers
  dropped with a note; SigLIP from a config.json of sizes alone."""
  m = pretrained.from_pretrained(os.path.join(OLDER, name))
  zimg, ztxt, _ = m.model.apply({'params': m.params},
                                images=GOLDEN['images/32'],
                                tokens=GOLDEN[f'{base}/input_ids'])
  assert _relative_error(zimg, GOLDEN[f'{base}/image_embeds']) < 1e-4
  assert _relative_error(ztxt, GOLDEN[f'{base}/text_embeds']) < 1e-4
  if name == 'clip_bin':
    assert '2 position_ids buffer(s) dropped' in capfd.readouterr().err


@pytest.mark.parametrize('name,processor', [
    ('vit_feature_extractor', 'ViTImageProcessor'),
    ('deit_feature_extractor', 'DeiTImageProcessor'),
    ('clip_bin', 'CLIPImageProcessor')])
def test_feature_extractors_files_prepare_as_transformers(name, processor):
  """`size` as a number: both sides for ViT's and DeiT's processors, the
  short side for CLIP's, as transformers reads it."""
  with open(os.path.join(OLDER, name, 'preprocessor_config.json')) as f:
    old = json.load(f)
  assert isinstance(old['size'], int) and 'image_processor_type' not in old
  assert transformers_defaults.processor_class(old) == processor
  recorded = transformers_config.eval_transform(old)
  spec = transform.resolve(224, recorded)
  pixels = transform.prepare(os.path.join(helpers.DATA, 'predict_image.jpg'),
                             spec)
  np.testing.assert_allclose(pixels[::8, ::8], PIXELS[name][0], atol=1e-5)


def test_a_number_for_an_unknown_processor_is_refused():
  with pytest.raises(ValueError, match=r"size=224 as a number, whose meaning "
                     r'depends on the processor \(FooImageProcessor\)'):
    transformers_config.eval_transform(
        {'image_processor_type': 'FooImageProcessor', 'size': 224})


def test_a_sparse_two_tower_config_takes_each_towers_defaults():
  """The issue's example: a SigLIP vision_config with its patch alone."""
  config = transformers_defaults.complete_config({
      'model_type': 'siglip', 'architectures': ['SiglipModel'],
      'vision_config': {'patch_size': 14}})
  vision, text = config['vision_config'], config['text_config']
  assert (vision['patch_size'], vision['hidden_size'], vision['hidden_act'],
          vision['layer_norm_eps']) == (14, 768, 'gelu_pytorch_tanh', 1e-6)
  assert text['model_type'] == 'siglip_text_model'
  assert text['max_position_embeddings'] == 64


def test_torch_files_are_read_without_torch(monkeypatch):
  """A transposed view, bfloat16 and an int64 buffer read as torch holds
  them; a file holding a Python object is refused, never unpickled."""
  monkeypatch.setitem(__import__('sys').modules, 'torch', None)
  folder = os.path.join(helpers.DATA, 'torch_files')
  got = torch_files.load(os.path.join(folder, 'state.bin'))
  with np.load(os.path.join(folder, 'state.npz')) as want:
    assert sorted(got) == sorted(want)
    for key in want:
      np.testing.assert_array_equal(np.asarray(got[key], want[key].dtype),
                                    want[key])
  assert got['position_ids'].dtype == np.int64
  with pytest.raises(ValueError, match='unsafe.bin holds .*Unsafe, not only '
                     'tensors'):
    torch_files.load(os.path.join(folder, 'unsafe.bin'))
  with pytest.raises(ValueError, match='is not a zip file of torch.save'):
    torch_files.load(os.path.join(OLDER, 'vit_sharded',
                                  'model.safetensors.index.json'))


def test_a_buffer_that_changes_the_result_is_refused(tmp_path):
  """position_ids other than an arange would change what transformers
  computes: named, not dropped."""
  shutil.copytree(os.path.join(OLDER, 'vit_sharded'), tmp_path / 'vit')
  from safetensors import numpy as safetensors_numpy  # pylint: disable=g-import-not-at-top
  shard = tmp_path / 'vit' / 'model-00001-of-00002.safetensors'
  state = safetensors_numpy.load_file(str(shard))
  state['vit.embeddings.position_ids'] = np.array([[0, 2, 1, 3, 4]])
  safetensors_numpy.save_file(state, str(shard))
  with pytest.raises(ValueError, match=r'the buffer vit\.embeddings\.'
                     r'position_ids is not 0, 1, \.\.\., 4'):
    converter.read_timm(str(shard))


def test_a_shard_the_index_names_must_hold_its_weights(tmp_path):
  shutil.copytree(os.path.join(OLDER, 'vit_sharded'), tmp_path / 'vit')
  index = tmp_path / 'vit' / 'model.safetensors.index.json'
  content = json.loads(index.read_text())
  content['weight_map']['vit.extra.weight'] = 'model-00001-of-00002.safetensors'
  index.write_text(json.dumps(content))
  with pytest.raises(ValueError, match='names 1 weight.s. that its shards '
                     'lack: vit.extra.weight'):
    converter.read_timm(str(index))
