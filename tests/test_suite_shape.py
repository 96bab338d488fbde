"""The suite's own shape: a test file over its budget fails the run.

conftest.py sums each file's CPU seconds where the reports arrive (the
xdist controller) and, at the session's end, lists a file over
tests/suite_cost.py's budget and fails the run past DRIFT times it
(docs/testing.md). Checked here on a
suite of two files in a fresh pytest, with a budget of a fraction of a
second against tests that burn 0.2 s of CPU each, so that no load on this
machine can flip the outcome.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from tests import helpers
from tests import suite_cost


def test_budget_is_documented():
  with open(os.path.join(helpers.ROOT, 'docs', 'testing.md')) as f:
    text = f.read()
  assert f'{suite_cost.FILE_BUDGET_S:.0f} s' in text
  assert suite_cost.BUDGET_VAR in text


def test_over_budget_lists_the_costliest_first():
  capped = 'tests/run/test_run_config.py'
  cap = suite_cost.CAPS_S[capped]
  seconds = {'tests/a.py': 20.0, 'tests/b.py': 65.5, 'tests/c.py': 80.0,
             capped: cap - 1}
  assert suite_cost.over_budget(seconds, 60) == [
      ('tests/c.py', 80.0, 60), ('tests/b.py', 65.5, 60)]
  # The budget scales the caps: at half the budget, half each cap.
  assert suite_cost.over_budget(seconds, 30) == [
      (capped, cap - 1, cap / 2), ('tests/c.py', 80.0, 30),
      ('tests/b.py', 65.5, 30)]
  assert suite_cost.over_budget(seconds, 0) == []  # 0: no budget


def test_caps_only_go_above_the_budget():
  assert all(cap > suite_cost.FILE_BUDGET_S
             for cap in suite_cost.CAPS_S.values())
  for path in suite_cost.CAPS_S:
    assert os.path.exists(os.path.join(helpers.ROOT, path)), path


def _suite(tmp_path):
  """A costly file (three tests of 0.2 CPU seconds: over 0.5 s only
  together) and a cheap one; their conftest installs the suite's hooks."""
  (tmp_path / 'conftest.py').write_text(textwrap.dedent('''
      import pytest
      from tests import suite_cost
      phase = suite_cost.PhaseCpu()
      budget = suite_cost.FileBudget()
      def pytest_runtest_logstart():
        phase.logstart()
      @pytest.hookimpl(wrapper=True)
      def pytest_runtest_makereport():
        return phase.makereport((yield))
      def pytest_runtest_logreport(report):
        budget.logreport(report)
      def pytest_sessionfinish(session):
        if not hasattr(session.config, 'workerinput'):
          budget.sessionfinish(session)
      def pytest_terminal_summary(terminalreporter):
        budget.summary(terminalreporter)
  '''))
  (tmp_path / 'test_slow.py').write_text(textwrap.dedent('''
      import time, pytest
      @pytest.mark.parametrize('i', range(3))
      def test_burn(i):
        start = time.process_time()
        while time.process_time() < start + 0.2:
          pass
  '''))
  (tmp_path / 'test_fast.py').write_text('def test_fast():\n  pass\n')


def _pytest(tmp_path, budget, *args):
  env = dict(os.environ, PYTHONPATH=helpers.ROOT)
  env[suite_cost.BUDGET_VAR] = str(budget)
  return subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
       '-p', 'no:randomly', '--rootdir', str(tmp_path), str(tmp_path), *args],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize('workers', [[], ['-n', '2']])
def test_a_file_over_budget_fails_the_run(tmp_path, workers):
  """Summed over its tests, on one process or spread over two workers."""
  _suite(tmp_path)
  over = _pytest(tmp_path, 0.2, *workers)  # 0.6 s > 2 x 0.2 s
  assert over.returncode == 1, over.stdout
  assert '4 passed' in over.stdout
  assert 'test files over their CPU budget' in over.stdout
  assert 'test_slow.py:' in over.stdout and 'test_fast.py:' not in over.stdout
  assert 'fails the run' in over.stdout
  drift = _pytest(tmp_path, 0.5, *workers)  # over 0.5 s, within 2 x
  assert drift.returncode == 0, drift.stdout
  assert 'test_slow.py:' in drift.stdout and 'within the drift' in drift.stdout
  within = _pytest(tmp_path, 30, *workers)
  assert within.returncode == 0, within.stdout
  assert 'over their CPU budget' not in within.stdout
