"""SAM's image encoder converted from timm's samvit and transformers'
SamVisionModel and SamModel with no flags, against the outputs those
computed themselves (tests/data/sam, from scripts/make_sam_golden.py, with
torch, timm and transformers; these tests need none of them)."""

import contextlib
import io
import json
import os

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file

from tests import helpers
from vit_jax import convert
from vit_jax import models
from vit_jax.convert import sam as convert_sam

DATA = os.path.join(helpers.DATA, 'sam')
GOLDEN = np.load(os.path.join(DATA, 'golden.npz'))
SOURCES = ('timm_samvit', 'transformers_vision', 'transformers_sam')


@pytest.fixture(scope='module')
def converted(tmp_path_factory):
  """Each source converted (no flags) and loaded at 128 px; what the
  conversions wrote on stderr."""
  folder = tmp_path_factory.mktemp('sam')
  out, err = {}, io.StringIO()
  for source in SOURCES:
    npz = str(folder / f'{source}.npz')
    with contextlib.redirect_stderr(err):
      name = convert.convert(os.path.join(DATA, source), npz)
    out[source] = name, npz, models.from_pretrained(npz, image_size=128)
  out['stderr'] = err.getvalue()
  return out


def _apply(pretrained, side=(128, 128), **kw):
  images = GOLDEN['images'][:, :side[0], :side[1]]
  return pretrained.model.apply({'params': pretrained.params}, images, **kw)


@pytest.mark.parametrize('side', [(128, 128), (96, 96), (96, 128)])
def test_gives_timms_neck_output(converted, side):
  """At 128 px as saved; at 96 px and 96 x 128 timm resamples its
  absolute table and interpolates the global blocks' relative ones."""
  name, _, pretrained = converted['timm_samvit']
  assert name == 'SAM-testing'  # with timm's LayerNorm eps
  assert pretrained.model.layer_norm_eps == 1e-5
  key = 'timm/' + ('128' if side == (128, 128) else
                   '96' if side == (96, 96) else '96x128')
  np.testing.assert_allclose(_apply(pretrained, side), GOLDEN[key],
                             atol=1e-4, rtol=0)


def test_gives_timms_intermediates(converted):
  pretrained = converted['timm_samvit'][2]
  for norm in (False, True):
    maps = _apply(pretrained, method='forward_intermediates',
                  indices=[0, 2], norm=norm, intermediates_only=True)
    for i, got in zip((0, 2), maps):
      # Unnormalized blocks reach ~25: float32 rounding is relative.
      np.testing.assert_allclose(
          got, GOLDEN[f'timm/block_{i}{"_norm" if norm else ""}'],
          atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize('source', SOURCES[1:])
def test_gives_transformers_last_hidden_state(converted, source):
  name, npz, pretrained = converted[source]
  assert name == convert_sam.CUSTOM  # MLPs 48 wide: no preset's
  assert pretrained.model.mlp_dim == 48
  assert pretrained.model.layer_norm_eps == 1e-6
  np.testing.assert_allclose(_apply(pretrained), GOLDEN['transformers/128'],
                             atol=1e-4, rtol=0)
  with open(npz[:-4] + '.transform.json') as f:
    assert json.load(f)['input_size'] == [3, 128, 128]


def test_sam_model_drops_its_decoder_with_a_note(converted):
  notes = [line for line in converted['stderr'].splitlines()
           if 'transformers_sam' in line and 'without' in line]
  assert len(notes) == 1, converted['stderr']
  assert ("SamModel: converting its image encoder, without its mask_decoder, "
          'prompt_encoder, shared_image_embedding') in notes[0]


def test_names_round_trip_to_timms_state():
  state = load_file(os.path.join(DATA, 'timm_samvit', 'model.safetensors'))
  back = convert_sam.npz_to_timm(convert_sam.timm_to_npz(state))
  assert set(back) == set(state)
  for key, value in state.items():
    np.testing.assert_array_equal(back[key], value)


def test_contradicting_settings_are_refused():
  state = load_file(os.path.join(DATA, 'timm_samvit', 'model.safetensors'))
  flat = convert_sam.timm_to_npz(state)
  settings = convert_sam.timm_settings(
      {'model_args': {'window_size': 4, 'global_attn_indexes': [1, 2]}})
  with pytest.raises(ValueError, match=r'sized for sides \[4, 8, 4, 8\]'):
    convert_sam.model_config(flat, settings, 'x.safetensors')
  with pytest.raises(ValueError, match='use_rel_pos=False'):
    convert_sam.timm_settings({'model_args': {'use_rel_pos': False}})


def test_jitted_as_eager(converted):
  """The tables' resampling traces (jit), as the loop and predict run it."""
  pretrained = converted['timm_samvit'][2]
  images = GOLDEN['images'][:, :96, :96]
  got = jax.jit(lambda p, x: pretrained.model.apply({'params': p}, x))(
      pretrained.params, images)
  np.testing.assert_allclose(got, GOLDEN['timm/96'], atol=1e-4, rtol=0)


def test_written_back_as_timms_state_and_read_again(converted, tmp_path):
  """An .npz to timm's state dict (a bare file: its tables tell the
  windows), and that file read back as the same preset and weights."""
  _, npz, _ = converted['timm_samvit']
  back = str(tmp_path / 'back.safetensors')
  assert convert.convert(npz, back) == 'SAM-testing'
  want = load_file(os.path.join(DATA, 'timm_samvit', 'model.safetensors'))
  got = load_file(back)
  assert set(got) == set(want)
  for key, value in want.items():
    np.testing.assert_array_equal(got[key], value)
  again = str(tmp_path / 'again.npz')
  assert convert.convert(back, again) == 'SAM-testing'
  with open(again[:-4] + '.transform.json') as f:
    assert json.load(f)['model'] == {'layer_norm_eps': 1e-5}
  with pytest.raises(ValueError, match="timm's layout only"):
    convert.convert(npz, str(tmp_path / 'hf'), layout='transformers')
