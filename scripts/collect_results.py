r"""A table shaped like the paper's Table 2 from many workdirs' results.json.

Rows are models, columns datasets: fine-tuning accuracy (`accuracy`) and the
few-shot linear accuracies (`fewshot_{k}shot`) found there. Each cell is the
mean over the runs, in %, +- its standard error when there are several
values: one per run, or for a few-shot metric, one per seed of each run.

  python scripts/collect_results.py /tmp/transfer/*/*
  python scripts/collect_results.py --rows=parent /tmp/transfer/*/*

Rows are named by the model, with ', from scratch' for runs without a
pretrained checkpoint; `--rows=parent` names them by the workdir's parent
folder instead.
"""

import argparse
import collections
import json
import os
import re
import sys

import numpy as np

_FEWSHOT = re.compile(r'fewshot_(\d+)shot$')


def read_runs(workdirs):
  """[(workdir, results)] of those workdirs that hold a results.json."""
  runs = []
  for workdir in workdirs:
    path = os.path.join(workdir, 'results.json')
    if os.path.exists(path):
      with open(path) as f:
        runs.append((workdir, json.load(f)))
    else:
      print(f'{workdir}: no results.json, skipped.', file=sys.stderr)
  return runs


def row_name(workdir, results, rows):
  if rows == 'parent':
    return os.path.basename(os.path.dirname(os.path.abspath(workdir)))
  name = results.get('model_name') or '?'
  return name if results.get('pretrained') else f'{name}, from scratch'


def metrics(results):
  """{metric: [values]}: 'fine-tune', and 'k-shot' with one value per seed."""
  out = {}
  if 'accuracy' in results:
    out['fine-tune'] = [results['accuracy']]
  for key, value in results.items():
    match = _FEWSHOT.match(key)
    if match:
      out[f'{match[1]}-shot'] = results.get(f'{key}_per_seed', [value])
  return out


def _metric_order(metric):
  return (0, 0) if metric == 'fine-tune' else (1, int(metric.split('-')[0]))


def cell(values):
  values = 100 * np.asarray(values, np.float64)
  if len(values) < 2:
    return f'{values.mean():.1f}'
  se = values.std(ddof=1) / np.sqrt(len(values))
  return f'{values.mean():.1f} ± {se:.1f}'


def table(runs, rows='model'):
  """The markdown table of `read_runs`' runs."""
  values = collections.defaultdict(list)
  for workdir, results in runs:
    row = row_name(workdir, results, rows)
    for metric, vals in metrics(results).items():
      values[row, (results.get('dataset') or '?', metric)].extend(vals)
  names = list(dict.fromkeys(row for row, _ in values))
  columns = sorted({col for _, col in values},
                   key=lambda c: (c[0], _metric_order(c[1])))
  lines = ['| model | ' + ' | '.join(f'{d} {m}' for d, m in columns) + ' |',
           '|---|' + '---|' * len(columns)]
  for name in names:
    lines.append(f'| {name} | ' + ' | '.join(
        cell(values[name, col]) if (name, col) in values else '–'
        for col in columns) + ' |')
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('workdirs', nargs='+')
  parser.add_argument('--rows', choices=('model', 'parent'), default='model')
  args = parser.parse_args(argv)
  runs = read_runs(args.workdirs)
  if not runs:
    raise SystemExit('No results.json in the workdirs given.')
  print(table(runs, args.rows))


if __name__ == '__main__':
  main()
