"""Fixtures of the analysis tests: the small real result sets (tests/data/quickstart-small, recorded
by `zcorch run tests/data/small.yaml`; tests/data/filesystems-small, recorded as root by `zcorch run
tests/data/filesystems.yaml`), always used through a private copy so that loading (which writes
runs.parquet) and reports never touch the repository."""
from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SMALL = DATA / "quickstart-small"
FS_SMALL = DATA / "filesystems-small"
GENERATED = {"runs.parquet", "runs.cache", "report.html", "plots"}


def copy_result_set(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in GENERATED])
    return dst


def slowed_copy(src: Path, dst: Path, factor: float, repeats: "int | None" = None) -> Path:
    """A copy of a real result set as a machine `factor` times slower would have recorded it: every run's
    sender and receiver wall time multiplied by `factor` (so each rate is divided by it, and its noise with
    it); `repeats`: only the first N repeats of each cell, in the runs and in the plan alike (a complete set
    of fewer repeats, not a short one)."""
    copy_result_set(src, dst)
    lines = []
    for line in (dst / "runs.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if repeats is not None and rec["repeat"] >= repeats:
            continue
        for side in ("sender", "receiver"):
            if rec.get(side) and rec[side].get("wall_ns"):
                rec[side]["wall_ns"] = int(rec[side]["wall_ns"] * factor)
        lines.append(json.dumps(rec))
    (dst / "runs.jsonl").write_text("\n".join(lines) + "\n")
    if repeats is not None:
        plan = [r for r in json.loads((dst / "plan.json").read_text()) if r["repeat"] < repeats]
        (dst / "plan.json").write_text(json.dumps(plan))
    return dst


def nights_of(src: Path, root: Path, factors: "list[float]", start: str = "2026-11-01") -> "list[Path]":
    """Nightly sweeps as zcorch-nightly lays them out (ROOT/<night>/<name>), each a copy of the real set `src`
    recorded by a machine factors[i] times slower (slowed_copy), created a day apart."""
    import datetime as dt

    t0 = dt.datetime.fromisoformat(start).replace(hour=3, tzinfo=dt.timezone.utc)
    out = []
    for i, factor in enumerate(factors):
        night = t0 + dt.timedelta(days=i)
        dst = slowed_copy(src, root / night.strftime("%Y%m%dT%H%MZ") / src.name, factor)
        manifest = json.loads((dst / "manifest.json").read_text())
        manifest["created"] = night.isoformat()
        manifest["finished"] = (night + dt.timedelta(minutes=5)).isoformat()
        (dst / "manifest.json").write_text(json.dumps(manifest))
        out.append(dst)
    return out


def once_per_run(tmp_path_factory, name: str, make) -> Path:
    """make(directory) -> a path, made once for the whole test run: under pytest-xdist the first worker that
    asks makes it in the run's base directory (which every worker shares), under a lock, and the others wait
    for it and reuse it; in one process, once per session. What it makes is used through copies."""
    import fcntl

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make(tmp_path_factory.mktemp(name))
    directory = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    made = directory.with_name(directory.name + ".made")
    with open(directory.with_name(directory.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            made.write_text(str(make(directory)))
        return Path(made.read_text())


@pytest.fixture(scope="session")
def compare_set_recorded(tmp_path_factory) -> Path:
    """A real localhost sweep of tests/data/compare.yaml: 2 cells x 6 repeats of 128 MiB. Use through a copy."""
    return once_per_run(tmp_path_factory, "compare",
                        lambda d: record_sweep(d, "compare-check", (DATA / "compare.yaml").read_text()))


@pytest.fixture
def small_set(tmp_path) -> Path:
    if not (SMALL / "runs.jsonl").exists():
        pytest.fail(f"{SMALL} missing: record it with `zcorch run tests/data/small.yaml -o {SMALL}`")
    return copy_result_set(SMALL, tmp_path / "quickstart-small")


@pytest.fixture
def fs_set(tmp_path) -> Path:
    if not (FS_SMALL / "runs.jsonl").exists():
        pytest.fail(f"{FS_SMALL} missing: record it as root with "
                    f"`zcorch run tests/data/filesystems.yaml -o {FS_SMALL}`")
    return copy_result_set(FS_SMALL, tmp_path / "filesystems-small")


CPU_EXPERIMENT = """name: cpu-small
params: {bytes: 256MiB, source: mem, timeout: 30s, sample_interval: 5ms}
matrix:
  send_mode: [write, msg_zerocopy]
  recv_mode: [read, discard]
repeats: 2
baselines: false
"""


def record_sweep(directory: Path, name: str, experiment: str) -> Path:
    """A result set `directory/name` recorded now by a real localhost sweep of `experiment` (every run ok)."""
    from zcorch.sweep.pipeline import run_sweep

    exp = directory / f"{name}.yaml"
    exp.write_text(experiment)
    result = run_sweep(str(exp), output=str(directory / name), command=["test"])
    assert result.exit_status == 0, [r.get("reason") for r in result.records]
    return directory / name


@pytest.fixture(scope="session")
def cpu_set_recorded(tmp_path_factory) -> Path:
    """A result set recorded now by a real localhost sweep with the host view: 256 MiB runs, long enough
    (with sample_interval 5ms) to keep samples; meta.json with the hosts' calibration. Use `cpu_set`."""
    return once_per_run(tmp_path_factory, "cpu", lambda d: record_sweep(d, "cpu-small", CPU_EXPERIMENT))


@pytest.fixture
def cpu_set(cpu_set_recorded, tmp_path) -> Path:
    """A private copy of cpu_set_recorded (loading and reports write into it)."""
    return copy_result_set(cpu_set_recorded, tmp_path / "cpu-small")


def raw_runs(path: Path) -> list:
    """The run records as written, parsed independently of zcorch."""
    return [json.loads(line) for line in (path / "runs.jsonl").read_text().splitlines() if line.strip()]


def raw_baselines(path: Path) -> list:
    return [json.loads(line) for line in (path / "baselines.jsonl").read_text().splitlines() if line.strip()]


def repo_status(*paths) -> str:
    """`git status --porcelain --ignored` of paths in this checkout: what a test left behind."""
    res = subprocess.run(["git", "status", "--porcelain", "--ignored", "--", *map(str, paths)], cwd=ROOT,
                         capture_output=True, text=True)
    return res.stdout


def zcorch_cli(*args, cwd=ROOT) -> subprocess.CompletedProcess:
    """`zcorch ARGS` called in this process: zcorch.cli.main, the entry point of the `zcorch` script, with
    stdout and stderr captured and its exit status (argparse's SystemExit included) as returncode. What a
    command prints and returns is what its process would, without a second of interpreter and pandas start
    per call. A test of what only a process shows (signals, its exit, its environment, its imports, output
    of the processes it starts) uses zcorch_process."""
    from zcorch.cli import main

    argv = [str(a) for a in args]
    # a command's process ends with it; here its signal dispositions must not outlive it (after a sweep
    # `run` ignores SIGTERM and SIGHUP, which every child the test process starts later would inherit)
    signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    saved, here = (sys.stdout, sys.stderr), os.getcwd()
    sys.stdout, sys.stderr = out, err
    os.chdir(cwd)
    try:
        with warnings.catch_warnings():
            # a fresh interpreter's filters, each warning shown once per call on stderr (not recorded by
            # pytest, not hidden because an earlier call in this process showed it)
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.simplefilter("default", append=True)
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                err.write(warnings.formatwarning(message, category, filename, lineno, line))
            code = main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=err)
            code = 1
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(here)
        for s, handler in signals.items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess(["zcorch", *argv], code, out.buffer.getvalue().decode("utf-8"),
                                       err.buffer.getvalue().decode("utf-8"))


def zcorch_process(*args, cwd=ROOT, timeout=600) -> subprocess.CompletedProcess:
    """`python -m zcorch ARGS` in its own process."""
    return subprocess.run([sys.executable, "-m", "zcorch", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
