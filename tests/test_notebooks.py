"""The notebooks run (with a tiny model in place of the published one)."""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _code(name):
  with open(os.path.join(ROOT, 'notebooks', name)) as f:
    cells = json.load(f)['cells']
  return '\n'.join(''.join(c['source']) for c in cells
                   if c['cell_type'] == 'code')


def test_finetune_notebook(tmp_path, monkeypatch, capsys):
  code = _code('finetune_at_higher_resolution.ipynb')
  for old, new in (("MODEL = 'ViT-B_16'", "MODEL = 'testing'"),
                   ('PRETRAINED_RES = 224', 'PRETRAINED_RES = 32'),
                   ('FINETUNE_RES = 384', 'FINETUNE_RES = 64')):
    assert old in code
    code = code.replace(old, new)
  monkeypatch.chdir(tmp_path)
  exec(compile(code, 'notebook', 'exec'), {})  # pylint: disable=exec-used
  out = capsys.readouterr().out
  assert 'position embedding (1, 5, 10) -> (1, 17, 10)' in out
  assert 'logits (2, 10)' in out

