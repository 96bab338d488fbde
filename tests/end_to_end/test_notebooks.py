"""Every notebook runs top to bottom with SMOKE = True (papermill), offline."""

import glob
import json
import os
import re

import papermill
import pytest

from tests import helpers

ROOT = helpers.ROOT
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))


def _code(path):
  with open(path) as f:
    return [c for c in json.load(f)['cells'] if c['cell_type'] == 'code']


def _run_smoke(name, tmp_path, monkeypatch):
  """Runs notebooks/`name` with SMOKE = True; (its text, its PNG count).

  The kernel's temporary folder, where the notebooks write, is
  `tmp_path`/tmp; its working directory `tmp_path`/cwd must stay empty.
  """
  cwd, tmp = tmp_path / 'cwd', tmp_path / 'tmp'
  cwd.mkdir()
  tmp.mkdir()
  monkeypatch.setenv('TMPDIR', str(tmp))  # the kernel inherits it
  out = tmp_path / 'out.ipynb'
  papermill.execute_notebook(
      os.path.join(ROOT, 'notebooks', name), str(out),
      parameters={'SMOKE': True}, cwd=str(cwd), progress_bar=False,
      execution_timeout=600)
  assert not os.listdir(cwd)
  with open(out) as f:
    outputs = [o for c in json.load(f)['cells'] for o in c.get('outputs', [])]
  text = '\n'.join(''.join(o.get('text', '')) for o in outputs)
  return text, sum('image/png' in o.get('data', {}) for o in outputs)


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_conventions(path):
  code = _code(path)
  assert 'parameters' in code[0]['metadata'].get('tags', [])
  assert ''.join(code[0]['source']).strip() == 'SMOKE = False'
  assert not any(c.get('outputs') or c.get('execution_count') for c in code)
  install = ''.join(code[1]['source'])
  assert install.startswith('# Must point at this project')
  assert "VIT_JAX_REPO = 'https://github.com/" in install
  assert 'check=True' in install and 'pip' in install
  assert not any('os.system' in ''.join(c['source']) for c in code)


def test_notebooks_install_from_one_repository():
  repos = {[line for line in ''.join(_code(p)[1]['source']).splitlines()
            if line.startswith('VIT_JAX_REPO = ')][0] for p in NOTEBOOKS}
  assert len(repos) == 1, repos


def test_vit_jax_notebook(tmp_path, monkeypatch):
  text, images = _run_smoke('vit_jax.ipynb', tmp_path, monkeypatch)
  assert 'position embedding (1, 5, 10) -> (1, 10, 10)' in text
  assert 'Done: 20 steps, test accuracy' in text
  assert "'count': 20" in text  # the evaluation of the fine-tuned model
  # Test images named by the folder's own classes: true -> predicted.
  assert re.search(r'(dark|bright) -> (dark|bright) \([01]\.\d{3}\)', text)
  assert images >= 2  # the input image, the training curves
  assert os.path.exists(tmp_path / 'tmp' / 'vit_jax_tour' / 'finetuned' /
                        'testing.npz')


def test_attention_notebook(tmp_path, monkeypatch):
  text, images = _run_smoke('attention.ipynb', tmp_path, monkeypatch)
  assert '4 images of 32x32 px' in text
  assert 'layer 1: ' in text and 'layer 0: ' not in text  # as in the figure
  assert images >= 5  # the five panels, inline
  figures = tmp_path / 'tmp' / 'vit_jax_attention' / 'figures'
  assert sorted(os.listdir(figures)) == [
      'analysis.json', 'attention_distance.png', 'class_token_attention.png',
      'filters.png', 'position_similarity.png', 'rollout.png']


def test_lit_notebook(tmp_path, monkeypatch):
  text, images = _run_smoke('lit.ipynb', tmp_path, monkeypatch)
  assert 'tokens of "a photo of a cat.": [ 2' in text  # [CLS] first
  assert 'similarity matrix (8, 10)' in text
  assert 'zero-shot accuracy' in text and 'on 8 images' in text
  assert images >= 1  # the similarity matrix
  assert os.path.exists(tmp_path / 'tmp' / 'lit_tour' / 'LiT-smoke.npz')


def test_mae_notebook(tmp_path, monkeypatch):
  text, images = _run_smoke('mae.ipynb', tmp_path, monkeypatch)
  assert "MAE parameters: ['decoder_block_0', 'decoder_embed'" in text
  assert 'few-shot linear accuracy' in text
  assert 'Fine-tuning from' in text and 'fine-tuned: test accuracy' in text
  assert images >= 2  # the run's grid, the grid at another mask ratio
  work = tmp_path / 'tmp' / 'vit_jax_mae'
  assert {'ViT-fmnist.npz', 'mae_reconstructions.png', 'results.json'} <= set(
      os.listdir(work / 'pretrain'))


def test_nnx_notebook(tmp_path, monkeypatch):
  text, _ = _run_smoke('nnx.ipynb', tmp_path, monkeypatch)
  assert 'ToNNX of VisionTransformer' in text
  assert "head: {'bias': (2,), 'kernel': (10, 2)}" in text
  before, after = (float(x) for x in re.findall(r'train loss (\d\.\d+)', text))
  assert after < before - 0.01  # nnx.Optimizer's steps trained the module
  # predict opened the saved .npz by its path and gave the module's classes.
  found = re.search(r'test/vertical/3\.png:\n  ([01]\.\d{4})  vertical\n|'
                    r'test/vertical/3\.png:\n.*\n  ([01]\.\d{4})  vertical\n',
                    text)
  module = re.search(r'test/vertical/3\.png by the NNX module: horizontal '
                     r'[01]\.\d{4}, vertical ([01]\.\d{4})', text)
  assert found and module, text
  assert (found[1] or found[2]) == module[1]
  work = tmp_path / 'tmp' / 'vit_jax_nnx'
  assert {'finetuned.npz', 'finetuned.transform.json'} <= set(os.listdir(work))
