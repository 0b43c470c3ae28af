"""scripts/test's parallel pass (--dist loadgroup) keeps the groups tests/conftest.py sets: a module whose
tests share a module fixture runs on one xdist process, so its recorded sweep is made once. The groups once
did nothing on pytest 9 without any test failing; this runs a real pytest-xdist session and reads where each
test ran."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
def test_a_module_fixtures_tests_run_on_one_xdist_process():
    p = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                        "-v", "--serial-tests=skip", "-k", "declared or regression or usage_error",
                        os.path.join(TESTS, "test_metrics.py")],
                       capture_output=True, text=True, timeout=600, cwd=os.path.dirname(TESTS))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    ran = re.findall(r"\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", p.stdout)
    grouped = [(worker, test) for worker, test in ran if test.endswith("@tests/test_metrics.py")]
    # the four selected tests all use the module's recorded sweep: they carry its group and share one process
    assert len(grouped) >= 4, p.stdout[-3000:]
    assert len({worker for worker, _ in grouped}) == 1, grouped
