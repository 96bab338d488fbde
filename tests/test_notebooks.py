"""Every notebook runs top to bottom with SMOKE = True (papermill), offline."""

import glob
import json
import os

import papermill
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, 'notebooks', '*.ipynb')))


def _run_smoke(name, tmp_path):
  """Runs notebooks/`name` with SMOKE = True in `tmp_path`; its text output."""
  out = tmp_path / 'out.ipynb'
  papermill.execute_notebook(
      os.path.join(ROOT, 'notebooks', name), str(out),
      parameters={'SMOKE': True}, cwd=str(tmp_path), progress_bar=False,
      execution_timeout=600)
  with open(out) as f:
    cells = json.load(f)['cells']
  return '\n'.join(''.join(o.get('text', '')) for c in cells
                   for o in c.get('outputs', []))


@pytest.mark.parametrize('path', NOTEBOOKS, ids=os.path.basename)
def test_notebook_conventions(path):
  with open(path) as f:
    cells = json.load(f)['cells']
  code = [c for c in cells if c['cell_type'] == 'code']
  assert 'parameters' in code[0]['metadata'].get('tags', [])
  assert ''.join(code[0]['source']).strip() == 'SMOKE = False'
  assert not any(c.get('outputs') or c.get('execution_count') for c in code)


def test_vit_jax_notebook(tmp_path):
  text = _run_smoke('vit_jax.ipynb', tmp_path)
  assert 'position embedding (1, 5, 10) -> (1, 10, 10)' in text
  assert 'Done: 20 steps, test accuracy' in text
  assert "'count': 20" in text  # the evaluation of the fine-tuned model
  assert os.path.exists(tmp_path / 'vit_jax_tour' / 'finetuned' /
                        'testing.npz')


def test_attention_notebook(tmp_path):
  text = _run_smoke('attention.ipynb', tmp_path)
  assert '4 images of 32x32 px' in text
  assert 'layer 0: ' in text
  figures = tmp_path / 'vit_jax_attention' / 'figures'
  assert sorted(os.listdir(figures)) == [
      'analysis.json', 'attention_distance.png', 'filters.png',
      'position_similarity.png', 'rollout.png']


def test_lit_notebook(tmp_path):
  text = _run_smoke('lit.ipynb', tmp_path)
  assert 'tokens of "a photo of a cat.": [ 2' in text  # [CLS] first
  assert 'similarity matrix (8, 10)' in text
  assert 'zero-shot accuracy' in text and 'on 8 images' in text
  assert os.path.exists(tmp_path / 'lit_tour' / 'LiT-smoke.npz')
