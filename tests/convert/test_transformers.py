"""Hugging Face transformers' checkpoints -> vit_jax, against transformers'
own outputs: tests/data/transformers/NAME, saved by transformers 5.23 (tiny
random models), and their outputs in transformers_golden.npz
(scripts/make_transformers_golden.py)."""

import json
import os
import shutil

import numpy as np
import pytest

from vit_jax import checkpoint  # the original's module name
from vit_jax.convert import converter
from vit_jax.convert import transform
from vit_jax.convert import transformers_config
from vit_jax import pretrained

DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'data')
FOLDERS = os.path.join(DATA, 'transformers')
GOLDEN = np.load(os.path.join(DATA, 'transformers_golden.npz'))

# name: (image side, golden output, what vit_jax's output is compared as).
IMAGE_MODELS = {
    'vit': (32, 'logits', 'same'),
    'vit_model': (32, 'pooler_output', 'same'),
    'deit': (32, 'logits', 'same'),
    'dinov2': (70, 'pooler_output', 'same'),
    'dinov2_registers': (70, 'pooler_output', 'same'),
    'mae': (32, 'last_hidden_state', 'class token'),
    'mae_pretraining': (32, 'last_hidden_state', 'class token'),
    'clip_vision': (32, 'pooler_output', 'same'),
    'clip_vision_projection': (32, 'image_embeds', 'same'),
    'clip': (32, 'image_embeds', 'normalized'),  # the image tower alone
    'siglip_vision': (32, 'pooler_output', 'same'),
    'siglip': (32, 'image_embeds', 'normalized'),
    'swin': (32, 'logits', 'same'),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
  monkeypatch.setenv('VIT_JAX_CACHE', str(tmp_path / 'cache'))


def _relative_error(have, want):
  return float(np.abs(np.asarray(have) - want).max() / np.abs(want).max())


def _outputs(m, images, how):
  out = np.asarray(m.model.apply({'params': m.params}, images, train=False))
  if how == 'normalized':
    out = out / np.linalg.norm(out, axis=-1, keepdims=True)
  return out


@pytest.mark.parametrize('name', IMAGE_MODELS)
def test_image_towers_give_transformers_outputs(name):
  """Each folder converted with no flags (a two-tower one's image tower by
  its image preset; both towers: the test below)."""
  side, key, how = IMAGE_MODELS[name]
  image_tower = {'clip': 'CLIP-testing-quickgelu', 'siglip': 'SigLIP-testing'}
  m = pretrained.from_pretrained(os.path.join(FOLDERS, name),
                                 image_size=side,
                                 model_name=image_tower.get(name))
  want = GOLDEN[f'{name}/{key}']
  if how == 'class token':  # the encoder's, after its final norm
    want = want[:, 0]
  got = _outputs(m, GOLDEN[f'images/{side}'], how)
  assert got.shape == want.shape
  assert _relative_error(got, want) < 1e-5


@pytest.mark.parametrize('name', ['clip', 'siglip'])
def test_two_towers_give_transformers_embeddings_and_logits(name):
  m = pretrained.from_pretrained(os.path.join(FOLDERS, name))
  assert m.model.__class__.__name__ == 'LitModel'
  zimg, ztxt, out = m.model.apply({'params': m.params},
                                  images=GOLDEN['images/32'],
                                  tokens=GOLDEN[f'{name}/input_ids'])
  assert _relative_error(zimg, GOLDEN[f'{name}/image_embeds']) < 1e-5
  assert _relative_error(ztxt, GOLDEN[f'{name}/text_embeds']) < 1e-5
  logits = zimg @ ztxt.T * out['t'] + (out['b'] if 'b' in out else 0)
  assert _relative_error(logits, GOLDEN[f'{name}/logits_per_image']) < 1e-5
  assert m.transform.mean == (
      (0.5,) * 3 if name == 'siglip' else (0.48145466, 0.4578275, 0.40821073))


def test_mae_gives_every_token_when_asked():
  m = pretrained.from_pretrained(os.path.join(FOLDERS, 'mae'), image_size=32,
                                 classifier='token_unpooled')
  got = m.model.apply({'params': m.params}, GOLDEN['images/32'], train=False)
  assert _relative_error(got, GOLDEN['mae/last_hidden_state']) < 1e-5


@pytest.mark.parametrize('name', ['dinov2', 'dinov2_registers'])
@pytest.mark.parametrize('side', [42, 98])
def test_dinov2_table_resized_as_transformers_does(name, side):
  """The 5 x 5 table at 3 x 3 and 7 x 7: torch's plain bicubic for DINOv2,
  antialiased for its registers' twin."""
  folder = os.path.join(FOLDERS, name)
  m = pretrained.from_pretrained(folder, image_size=side)
  want = GOLDEN[f'{name}/pooler_output@{side}']
  got = _outputs(m, GOLDEN[f'images/{side}'], 'same')
  assert _relative_error(got, want) < 1e-5
  if name == 'dinov2':  # the record's method matters: another one is off
    path = converter.as_npz(folder)
    record = transform.load_transform(path)
    assert record['posemb_resize'] == 'bicubic_torch'
    record['posemb_resize'] = 'bicubic'
    transform.save_transform(path, record)
    other = pretrained.from_pretrained(folder, image_size=side)
    assert _relative_error(_outputs(other, GOLDEN[f'images/{side}'], 'same'),
                           want) > 1e-5


def test_settings_carried_from_config_json(tmp_path):
  """ViT's exact GELU and eps 1e-12 are recorded over the 'testing' preset;
  the pooler is the original's pre_logits."""
  dst = str(tmp_path / 'vit_model.npz')
  assert converter.convert(os.path.join(FOLDERS, 'vit_model'), dst) == (
      'testing')
  record = transform.load_transform(dst)
  assert record['model'] == {'transformer': {'gelu_approximate': False,
                                             'layer_norm_eps': 1e-12}}
  assert record['model_name'] == 'testing'
  assert set(np.load(dst)) >= {'pre_logits/kernel', 'pre_logits/bias'}


@pytest.mark.parametrize('processor,folder', [
    ('vit', 'vit'), ('deit', 'deit'), ('dinov2', 'dinov2'), ('clip', 'clip'),
    ('siglip', 'siglip'), ('mae', 'mae'), ('swin', 'swin')])
def test_preprocessor_config_prepares_as_transformers(processor, folder):
  """The recorded eval transform gives the processor's pixels (every 8th
  row and column of its 224 x 224 output)."""
  with open(os.path.join(FOLDERS, folder, 'preprocessor_config.json')) as f:
    recorded = transformers_config.eval_transform(json.load(f))
  spec = transform.resolve(224, recorded)
  pixels = transform.prepare(os.path.join(DATA, 'predict_image.jpg'), spec)
  np.testing.assert_allclose(pixels[::8, ::8], GOLDEN[f'{processor}/pixels'][0],
                             atol=1e-5)


def test_an_unsupported_architecture_is_named(tmp_path):
  folder = tmp_path / 'dinov2_classifier'
  shutil.copytree(os.path.join(FOLDERS, 'dinov2'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['architectures'] = ['Dinov2ForImageClassification']
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"^transformers' "
                     r'Dinov2ForImageClassification is not supported '
                     r'\(supported: ViTForImageClassification, '):
    converter.convert(str(folder), str(tmp_path / 'out.npz'))
  assert not (tmp_path / 'out.npz').exists()


def test_bare_weights_are_called_transformers(tmp_path):
  shutil.copy(os.path.join(FOLDERS, 'vit', 'model.safetensors'),
              tmp_path / 'model.safetensors')
  with pytest.raises(ValueError, match="in transformers' layout.*config.json"):
    converter.convert(str(tmp_path / 'model.safetensors'),
                      str(tmp_path / 'out.npz'))


def test_a_timm_folder_is_not_called_transformers(tmp_path):
  folder = tmp_path / 'timm'
  shutil.copytree(os.path.join(DATA, 'timm_hf', 'token'), folder)
  config = json.loads((folder / 'config.json').read_text())
  config['architecture'] = 'vit_unknown_patch16_224'
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError) as error:
    converter.convert(str(folder), str(tmp_path / 'out.npz'))
  assert 'timm architecture' in str(error.value)
  assert 'transformers' not in str(error.value)


def test_conversion_is_cached_until_the_files_change(tmp_path):
  folder = tmp_path / 'vit'
  shutil.copytree(os.path.join(FOLDERS, 'vit'), folder)
  first = converter.as_npz(str(folder))
  assert converter.as_npz(str(folder)) == first
  processor = folder / 'preprocessor_config.json'
  processor.write_text(processor.read_text().replace('"resample": 2',
                                                     '"resample": 3'))
  second = converter.as_npz(str(folder))
  assert second != first
  assert transform.load_transform(second)['interpolation'] == 'bicubic'


def test_from_pretrained_on_a_converted_npz(tmp_path):
  """The .npz with its record gives what the folder gives; the published
  name alone says the preset of a file without a record."""
  dst = str(tmp_path / 'deit.npz')
  converter.convert(os.path.join(FOLDERS, 'deit'), dst)
  m = pretrained.from_pretrained(dst, image_size=32)
  got = m.model.apply({'params': m.params}, GOLDEN['images/32'], train=False)
  assert _relative_error(got, GOLDEN['deit/logits']) < 1e-5
  assert m.transform.crop_pct == 0.875
  os.remove(transform.transform_path(dst))
  renamed = str(tmp_path / 'DeiT-testing-distilled.npz')
  os.rename(dst, renamed)
  m = pretrained.from_pretrained(renamed)
  assert m.model.classifier == 'distilled'
  assert m.transform.size == 32  # the table's, without a record
  # The preset's eps (1e-6), not the record's 1e-12, without the record.
  assert 'layer_norm_eps' not in m.model.transformer
  with pytest.raises(ValueError, match='pass model_name='):
    os.rename(renamed, str(tmp_path / 'weights.npz'))
    pretrained.from_pretrained(str(tmp_path / 'weights.npz'))


def test_readme_python_example_runs(monkeypatch, capsys):
  """The README's Python example, as shown, on the golden ViT folder and
  the test image in place of the hub name and cat.jpg."""
  with open(os.path.join(DATA, '..', '..', 'README.md')) as f:
    readme = f.read()
  code = readme.split('```python\n', 1)[1].split('```', 1)[0]
  assert "models.from_pretrained('google/vit-base-patch16-224')" in code
  code = code.replace("'google/vit-base-patch16-224'",
                      repr(os.path.join(FOLDERS, 'vit'))).replace(
                          "'cat.jpg'",
                          repr(os.path.join(DATA, 'predict_image.jpg')))
  scope = {}
  exec(code, scope)  # pylint: disable=exec-used
  assert scope['logits'].shape == (1, 5)
  assert scope['m'].transform.interpolation == 'bilinear'


def test_original_load_notes_a_record_that_changes_the_model(tmp_path,
                                                            capsys):
  dst = str(tmp_path / 'vit.npz')
  converter.convert(os.path.join(FOLDERS, 'vit'), dst)
  capsys.readouterr()
  params = checkpoint.load(dst)
  assert 'head' in params
  err = capsys.readouterr().err
  assert 'changes the model of testing (transformer)' in err
  assert 'from_pretrained' in err


def test_from_pretrained_on_big_vision_two_towers():
  """big_vision's SigLIP .npz (scanned blocks, bfloat16 tables): the preset
  named, the text length, vocabulary and image size from the file; the
  embeddings big_vision's own code computed."""
  golden = np.load(os.path.join(DATA, 'big_vision_siglip_golden.npz'))
  m = pretrained.from_pretrained(os.path.join(DATA, 'big_vision_siglip.npz'),
                                 model_name='SigLIP-testing-towers')
  assert m.model.pp['max_len'] == golden['tokens'].shape[1]
  zimg, ztxt, out = m.model.apply({'params': m.params},
                                  images=golden['images'],
                                  tokens=golden['tokens'])
  np.testing.assert_allclose(zimg, golden['zimg'], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ztxt, golden['ztxt'], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out['b'], golden['b'], rtol=1e-6)


def test_from_pretrained_on_a_timm_folder():
  """A timm folder (save_for_hf's) the same way: timm's logits."""
  golden = np.load(os.path.join(DATA, 'timm_families_golden.npz'))
  m = pretrained.from_pretrained(
      os.path.join(DATA, 'timm_families', 'clip_quickgelu'), image_size=64)
  got = m.model.apply({'params': m.params}, golden['images'], train=False)
  assert _relative_error(got, golden['clip_quickgelu']) < 1e-5
  assert m.model.transformer['quick_gelu']


def test_from_pretrained_on_a_hub_name_from_the_hub_cache(tmp_path,
                                                          monkeypatch):
  """A hub name, offline, from huggingface_hub's cache (laid out as the hub
  lays it out): converted and cached like a folder."""
  constants = pytest.importorskip('huggingface_hub.constants')
  revision = 'a' * 40
  repo = tmp_path / 'hub' / 'models--google--vit-base-patch16-224'
  snapshot = repo / 'snapshots' / revision
  shutil.copytree(os.path.join(FOLDERS, 'vit'), snapshot)
  (repo / 'refs').mkdir()
  (repo / 'refs' / 'main').write_text(revision)
  monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  m = pretrained.from_pretrained('google/vit-base-patch16-224',
                                 image_size=32)
  got = m.model.apply({'params': m.params}, GOLDEN['images/32'], train=False)
  assert _relative_error(got, GOLDEN['vit/logits']) < 1e-5


def test_a_hub_name_not_cached_offline_fails_in_one_line(tmp_path,
                                                         monkeypatch):
  constants = pytest.importorskip('huggingface_hub.constants')
  monkeypatch.setattr(constants, 'HF_HUB_CACHE', str(tmp_path / 'hub'))
  monkeypatch.setenv('HF_HUB_OFFLINE', '1')
  with pytest.raises(ConnectionError, match='Cannot reach huggingface.co '
                     'to fetch facebook/dinov2-small'):
    pretrained.from_pretrained('facebook/dinov2-small')


@pytest.mark.parametrize('change,message', [
    ({'size': {'height': 224, 'width': 256}}, 'is not square'),
    ({'do_center_crop': False}, 'without a crop'),
    ({'do_resize': False}, 'does not resize'),
    ({'rescale_factor': 1.0}, 'does not scale pixels by 1/255'),
    ({'resample': 9}, 'unknown resample 9'),
])
def test_a_processor_vit_jax_cannot_follow_is_refused(change, message):
  with open(os.path.join(FOLDERS, 'dinov2', 'preprocessor_config.json')) as f:
    processor = dict(json.load(f), **change)
  with pytest.raises(ValueError, match=message):
    transformers_config.eval_transform(processor)


@pytest.mark.parametrize('change,message', [
    ({'hidden_act': 'relu'}, "with hidden_act='relu' is not supported"),
    ({'qkv_bias': False}, 'with qkv_bias=False is not supported'),
    ({'num_channels': 1}, 'with num_channels=1 is not supported'),
])
def test_a_setting_vit_jax_cannot_compute_is_refused(change, message,
                                                    tmp_path):
  folder = tmp_path / 'dinov2'
  shutil.copytree(os.path.join(FOLDERS, 'dinov2'), folder)
  config = dict(json.loads((folder / 'config.json').read_text()), **change)
  (folder / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ValueError, match=r"^transformers' Dinov2Model " +
                     message):
    converter.convert(str(folder), str(tmp_path / 'out.npz'))
  assert not (tmp_path / 'out.npz').exists()
