"""`python -m vit_jax.features`: the arrays it writes are the models'
`forward_intermediates` and pre-logits of the images as `transform.prepare`
gives them, whatever the batching (8 devices, from conftest); a user's
mistake is one `Error:` line."""

import os
import subprocess
import sys
from unittest import mock

from absl import flags
from absl.testing import flagsaver
import jax
import ml_collections
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

from tests import helpers
from tests.end_to_end import exports
from vit_jax import cli
from vit_jax import convert
from vit_jax import features
from vit_jax import models
from vit_jax.convert import transform
from vit_jax.data import pipeline

exports.define_command_flags()  # as the command line does; main reads them

# Relative paths and pixel arrays' shapes: sizes differ, one image is gray
# and one has an alpha channel.
IMAGES = {'dogs/b.png': (40, 60, 3), 'cats/a.png': (70, 50),
          'top.png': (56, 56, 4), 'cats/c.png': (33, 33, 3),
          'dogs/a.png': (64, 80, 3)}
SORTED = ['cats/a.png', 'cats/c.png', 'dogs/a.png', 'dogs/b.png', 'top.png']
SPLIT = 'fashion_mnist_local:test[:5]'


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  root = tmp_path_factory.mktemp('images')
  rng = np.random.default_rng(0)
  for name, shape in IMAGES.items():
    (root / name).parent.mkdir(exist_ok=True)
    Image.fromarray(rng.integers(0, 256, shape, np.uint8)).save(root / name)
  (root / 'cats' / 'labels.txt').write_text('not an image')
  return root


def _converted(tmp_path_factory, source, **kw):
  """(.npz, from_pretrained's model) of a golden timm file in tests/data."""
  npz = str(tmp_path_factory.mktemp('checkpoint') / 'model.npz')
  convert.convert(os.path.join(helpers.DATA, source), npz)
  return npz, models.from_pretrained(npz, **kw)


@pytest.fixture(scope='module')
def dinov2(tmp_path_factory):
  """DINOv2 with 4 registers, 2 blocks, no head, 56 px (its record)."""
  return _converted(tmp_path_factory, 'timm_ssl/dinov2_reg4')


@pytest.fixture(scope='module')
def swin(tmp_path_factory):
  """Swin, 4 stages, at 64 px."""
  return _converted(tmp_path_factory, 'timm_swin.safetensors', image_size=64)


def _extract(out, *args):
  """The arrays that `main` writes to `out` for the command line `args`."""
  with flagsaver.flagsaver():
    argv = flags.FLAGS(['features', f'--out={out}', *map(str, args)])
    assert features.main(argv) == 0
  with np.load(out) as arrays:
    return dict(arrays)


def _assert_close(got, want):
  """Within 1e-5, relative to the size where unnormalized tokens grow (to
  ~20): another batch shape or sharding rounds float32 sums otherwise."""
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _prepared(pretrained, paths):
  return np.stack([transform.prepare(p, pretrained.transform) for p in paths])


def _intermediates(pretrained, paths, **kw):
  # Jitted: Swin's windows take seconds op by op.
  return jax.jit(lambda p, x: pretrained.model.apply(
      {'params': p}, x, method='forward_intermediates',
      intermediates_only=True, **kw))(
          pretrained.params, _prepared(pretrained, paths))


def _sorted_paths(folder):
  return [str(folder / name) for name in SORTED]


def test_maps_and_prefix_tokens(dinov2, folder, tmp_path, capfd):
  """Blocks 0 and -1 (the last, 1), normed, with their class and register
  tokens; two batches (3 + 2 images) on 8 devices."""
  npz, pretrained = dinov2
  got = _extract(tmp_path / 'f.npz', f'--checkpoint={npz}', '--indices=0,-1',
                 '--norm', '--prefix_tokens', '--batch_size=3', folder)
  paths = _sorted_paths(folder)
  assert list(got['names']) == paths
  want = _intermediates(pretrained, paths, indices=(0, -1), norm=True,
                        return_prefix_tokens=True)
  assert sorted(got) == ['block_0', 'block_0_prefix', 'block_1',
                         'block_1_prefix', 'names']
  for i, (maps, prefix) in enumerate(want):
    assert got[f'block_{i}'].shape == (5, 4, 4, 32)
    assert got[f'block_{i}_prefix'].shape == (5, 5, 32)
    _assert_close(got[f'block_{i}'], maps)
    _assert_close(got[f'block_{i}_prefix'], prefix)
  err = capfd.readouterr().err
  assert 'Preprocessing: resize short side to 56 (bicubic)' in err
  assert '5/5' in err  # the progress bar, for more than one batch


def test_tokens_of_the_last_n_blocks(dinov2, folder, tmp_path):
  npz, pretrained = dinov2
  got = _extract(tmp_path / 'f.npz', f'--checkpoint={npz}', '--indices=2',
                 '--output_fmt=NLC', folder)
  want = _intermediates(pretrained, _sorted_paths(folder), indices=2,
                        output_fmt='NLC')
  assert sorted(got) == ['block_0', 'block_1', 'names']
  for i, tokens in enumerate(want):
    assert got[f'block_{i}'].shape == (5, 16, 32)
    _assert_close(got[f'block_{i}'], tokens)


def test_batches_give_the_single_batch_features(dinov2, folder, tmp_path,
                                                capfd):
  npz, pretrained = dinov2
  one = _extract(tmp_path / 'one.npz', f'--checkpoint={npz}', folder)
  assert '%|' not in capfd.readouterr().err  # one batch: no progress bar
  three = _extract(tmp_path / 'three.npz', f'--checkpoint={npz}',
                   '--batch_size=2', folder)
  assert sorted(one) == ['block_1', 'names']  # the last block by default
  np.testing.assert_array_equal(three['names'], one['names'])
  np.testing.assert_allclose(three['block_1'], one['block_1'], atol=1e-6)
  (want,) = _intermediates(pretrained, _sorted_paths(folder), indices=1)
  _assert_close(one['block_1'], want)


def test_pooled_is_the_pre_logits(dinov2, folder, tmp_path):
  """Without a head, the model's output; for DINOv2, the class token after
  the final norm."""
  npz, pretrained = dinov2
  got = _extract(tmp_path / 'f.npz', f'--checkpoint={npz}',
                 '--output_fmt=pooled', folder)
  assert sorted(got) == ['names', 'pooled']
  paths = _sorted_paths(folder)
  want = pretrained.model.apply({'params': pretrained.params},
                                _prepared(pretrained, paths), train=False)
  _assert_close(got['pooled'], want)
  ((_, prefix),) = _intermediates(pretrained, paths, indices=1, norm=True,
                                  return_prefix_tokens=True)
  _assert_close(got['pooled'], prefix[:, 0])


def test_swin_stage_maps(swin, folder, tmp_path):
  """Stages 0 and -1 (3, the last, normed): maps at four grids' sides."""
  npz, pretrained = swin
  got = _extract(tmp_path / 'f.npz', f'--checkpoint={npz}', '--size=64',
                 '--indices=0,-1', '--norm', folder)
  want = _intermediates(pretrained, _sorted_paths(folder), indices=(0, -1),
                        norm=True)
  assert sorted(got) == ['block_0', 'block_3', 'names']
  assert got['block_0'].shape == (5, 32, 32, 4)  # patches of 2
  assert got['block_3'].shape == (5, 4, 4, 32)
  _assert_close(got['block_0'], want[0])
  _assert_close(got['block_3'], want[1])


def test_tfds_split_after_a_file(dinov2, folder, fmnist_dirs, tmp_path):
  """A split's images are prepared as the same images saved as PNG files."""
  manual, data_dir = fmnist_dirs
  builder = pipeline.get_builder(ml_collections.ConfigDict(dict(
      dataset='fashion_mnist_local', tfds_data_dir=data_dir,
      tfds_manual_dir=manual, tfds_download=False)))
  npz, pretrained = dinov2
  top = str(folder / 'top.png')
  got = _extract(tmp_path / 'f.npz', f'--checkpoint={npz}', f'--tfds={SPLIT}',
                 f'--tfds_data_dir={data_dir}', top)
  assert list(got['names']) == [top] + [f'{SPLIT}/{i}' for i in range(5)]
  paths = [top]
  split = builder.as_dataset(split='test[:5]', shuffle_files=False)
  for i, example in enumerate(tfds.as_numpy(split)):
    paths.append(str(tmp_path / f'{i}.png'))
    Image.fromarray(example['image'][..., 0]).save(paths[-1])
  (want,) = _intermediates(pretrained, paths, indices=1)
  _assert_close(got['block_1'], want)


def test_command_line(dinov2, folder, tmp_path):
  npz, pretrained = dinov2
  out = tmp_path / 'feats.npz'
  result = subprocess.run(
      [sys.executable, '-m', 'vit_jax.features', f'--checkpoint={npz}',
       '--batch_size=2', str(folder), f'--out={out}'],
      capture_output=True, text=True, timeout=300, cwd=helpers.ROOT)
  assert result.returncode == 0, result.stderr
  assert result.stdout == ('Features of 5 images: block_1 (5, 4, 4, 32), '
                           f'names (5,) in {out}\n')
  assert '[from model.transform.json]' in result.stderr
  (want,) = _intermediates(pretrained, _sorted_paths(folder), indices=1)
  with np.load(out) as got:
    _assert_close(got['block_1'], want)
  assert not [p for p in os.listdir(tmp_path) if p != 'feats.npz']


def _error_lines(capfd, *args):
  """stderr's lines of the command line `args`, run in this process; it
  must exit with status 1."""
  argv = ['features', *map(str, args)]
  with flagsaver.flagsaver(), mock.patch.object(sys, 'argv', argv):
    with pytest.raises(SystemExit) as exit_info:
      cli.run(features.main)
  assert exit_info.value.code == 1
  return capfd.readouterr().err.splitlines()


@pytest.mark.parametrize('args,message', [
    ([], 'Give image files or folders, or --tfds=NAME:SPLIT.'),
    (['missing.png'], 'missing.png: no such file or folder.'),
    (['{empty}'], 'empty: no image files in the folder.'),
    (['--indices=a,b', '{image}'], '--indices=a,b: give n, the last n'),
    (['--output_fmt=NCHW', '{image}'], 'value should be one of <NHWC|NLC|'),
    (['--output_fmt=pooled', '--norm', '{image}'], 'takes no --norm'),
    (['--out={tmp}/no/f.npz', '{image}'], 'no folder'),
    (['--out={tmp}/f.h5', '{image}'], 'the file must end in .npz'),
])
def test_mistakes_before_loading(folder, tmp_path, capfd, args, message):
  """Each is said before the checkpoint (here missing) is read."""
  (tmp_path / 'empty').mkdir()
  (tmp_path / 'empty' / 'notes.txt').write_text('no image')
  names = dict(empty=tmp_path / 'empty', image=folder / 'top.png',
               tmp=tmp_path)
  args = [a.format(**names) for a in args]
  if not any(a.startswith('--out=') for a in args):
    args.append(f'--out={tmp_path}/f.npz')
  lines = _error_lines(capfd, f'--checkpoint={tmp_path}/missing.npz', *args)
  errors = [line for line in lines if line.startswith('Error:')]
  assert len(errors) == 1 and message in errors[0], lines
  assert len(lines) == 1 or lines[1].startswith('Pass --helpfull'), lines
  assert not os.path.exists(tmp_path / 'f.npz')


@pytest.mark.parametrize('model,args,message', [
    ('dinov2', ['--indices=0,5'], r'indices=(0, 5): expected block indices '
     'in [-2, 1]'),
    ('dinov2', ['--indices=3'], 'the last n blocks, n from 1 to 2'),
    ('dinov2', ['{bad}'], 'bad.png is not an image that PIL can decode'),
    ('swin', ['--size=64', '--prefix_tokens'], 'a SwinTransformer has none'),
])
def test_mistakes_the_model_finds(request, folder, tmp_path, capfd, model,
                                  args, message):
  npz, _ = request.getfixturevalue(model)
  (tmp_path / 'bad.png').write_text('not a PNG')
  args = [a.format(bad=tmp_path / 'bad.png') for a in args]
  lines = _error_lines(capfd, f'--checkpoint={npz}', f'--out={tmp_path}/f.npz',
                       folder / 'top.png', *args)
  errors = [line for line in lines if line.startswith('Error:')]
  assert errors == [lines[-1]] and message in errors[0], lines
  assert not os.path.exists(tmp_path / 'f.npz')
