"""Fixtures of the analysis tests: the small real result set (tests/data/quickstart-small, recorded
by `zcorch run tests/data/small.yaml`), always used through a private copy so that loading (which
writes runs.cache) and reports never touch the repository."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SMALL = DATA / "quickstart-small"
GENERATED = {"runs.cache", "report.html", "plots"}


def copy_result_set(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in GENERATED])
    return dst


@pytest.fixture
def small_set(tmp_path) -> Path:
    if not (SMALL / "runs.jsonl").exists():
        pytest.fail(f"{SMALL} missing: record it with `zcorch run tests/data/small.yaml -o {SMALL}`")
    return copy_result_set(SMALL, tmp_path / "quickstart-small")


def raw_runs(path: Path) -> list:
    """The run records as written, parsed independently of zcorch."""
    return [json.loads(line) for line in (path / "runs.jsonl").read_text().splitlines() if line.strip()]


def zcorch_cli(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zcorch", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
