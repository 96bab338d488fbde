r"""The test suite's cost, sorted: which files and tests to make cheaper.

  python scripts/test_timings.py                    # the whole suite, 2 workers
  python scripts/test_timings.py tests/run -n 0     # one folder, one process
  python scripts/test_timings.py --junit run.xml    # a past run's junit xml
  VIT_JAX_TEST_TIMINGS=DIR bash .ci/run; python scripts/test_timings.py --dir DIR

Runs pytest with VIT_JAX_TEST_TIMINGS set (tests/suite_cost.py records one
line per test), then prints per file and per test, costliest first:
  wall     seconds of setup + call + teardown (a fixture's cost lands on the
           first test that uses it on that worker)
  cpu      CPU seconds of the pytest process in them (beyond wall: threads)
  child    CPU seconds of the processes the test started and waited for
  starts   processes started (subprocess.Popen)
  compile  seconds in XLA compilation in the pytest process, persistent
           cache reads included; hit / miss: its persistent cache lookups
           (a program under the cache's minimum compile time is neither)
A junit xml (pytest --junitxml) gives wall seconds only. Extra pytest
arguments follow `--`.
"""

import argparse
import collections
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

COLUMNS = ('wall', 'cpu', 'child', 'starts', 'compile', 'hits', 'misses')


def run_suite(paths, workers, extra):
  """Runs pytest; (rows, its exit code, wall seconds)."""
  directory = tempfile.mkdtemp(prefix='vit_jax_timings_')
  command = [sys.executable, '-m', 'pytest', '-q', *paths]
  if workers:
    command += ['-n', str(workers)]
  start = time.perf_counter()
  code = subprocess.call(command + extra, env=dict(
      os.environ, VIT_JAX_TEST_TIMINGS=directory))
  wall = time.perf_counter() - start
  return read_rows(directory), code, wall


def read_rows(directory):
  """The lines tests/suite_cost.py wrote into `directory`."""
  rows = []
  for path in glob.glob(os.path.join(directory, '*.jsonl')):
    with open(path) as f:
      for line in f:
        row = json.loads(line)
        row['child'] = row.pop('child_cpu')
        rows.append(row)
  return rows


def junit_rows(path):
  """Wall seconds per test from a junit xml (setup and teardown included)."""
  rows = []
  for case in ET.parse(path).iter('testcase'):
    module = case.get('classname', '').split('.')
    # classname is `tests.run.test_loop` or `tests.run.test_loop.TestX`.
    while module and not module[-1].startswith('test_'):
      module.pop()
    rows.append(dict(test='/'.join(module) + '.py::' + case.get('name'),
                     wall=float(case.get('time', 0))))
  return rows


def per_file(rows):
  files = collections.defaultdict(lambda: collections.Counter(tests=0))
  for row in rows:
    total = files[row['test'].split('::')[0]]
    total['tests'] += 1
    for key in COLUMNS:
      total[key] += row.get(key, 0)
  return [dict(v, test=k) for k, v in files.items()]


def table(rows, title, limit, columns):
  rows = sorted(rows, key=lambda r: -r['wall'])
  total = sum(r['wall'] for r in rows)
  lines = [f'## {title} ({len(rows)}, {total:.0f} s of wall in all)', '',
           '| # | ' + ' | '.join(columns) + ' | test |',
           '|---|' + '---:|' * len(columns) + '---|']
  for i, row in enumerate(rows[:limit], 1):
    cells = [f'{row.get(c, 0):.1f}' if isinstance(row.get(c, 0), float)
             else str(row.get(c, 0)) for c in columns]
    lines.append(f'| {i} | ' + ' | '.join(cells) + f' | {row["test"]} |')
  return '\n'.join(lines) + '\n'


def main():
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('paths', nargs='*', default=['tests'])
  parser.add_argument('-n', '--workers', type=int, default=2,
                      help='xdist workers; 0 runs in one process')
  parser.add_argument('--junit', help='tabulate this junit xml instead')
  parser.add_argument('--dir', help='tabulate the lines of a run made with '
                      'VIT_JAX_TEST_TIMINGS=DIR instead')
  parser.add_argument('--top', type=int, default=30)
  parser.add_argument('--out', help='also write the tables to this file')
  args, extra = parser.parse_known_args()
  extra = [a for a in extra if a != '--']
  code, header = 0, ''
  if args.junit:
    rows, columns = junit_rows(args.junit), ('wall',)
  elif args.dir:
    rows, columns = read_rows(args.dir), COLUMNS
  else:
    rows, code, wall = run_suite(args.paths, args.workers, extra)
    columns = COLUMNS
    header = f'pytest: {wall:.0f} s wall, exit code {code}\n\n'
  text = header + table(per_file(rows), 'Files', args.top,
                        ('tests',) + columns)
  text += '\n' + table(rows, 'Tests', args.top, columns)
  print(text)
  if args.out:
    with open(args.out, 'w') as f:
      f.write(text)
  return code


if __name__ == '__main__':
  sys.exit(main())
