"""Nothing zcorch starts imports code from the current directory.

`python -m`, `-c` and `-` put the current directory first on sys.path; zcorch runs as root from wherever
the user stands and, over SSH, from the login's home directory. A directory holding a `zcorch/` package
(or a `json.py`) that writes a marker when imported is planted where the interpreters start: the
localhost sweep's working directory, and the lab hosts' home directories. Every job and the worker must
run anyway, from the real package, and the marker must never appear.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml

from fixtures_run import REPO, TAG_VAR, tag  # noqa: F401  (fixture)
from zcorch.hosts.interpreter import STDIN, module_of, python_argv
from zcorch.results.store import read_jsonl
from zcorch.worker import remote

MARKER = "PLANTED-CODE-RAN"
# Each planted module records that it ran, then fails loudly (a test would see either).
PLANT = (f"import os\nopen(os.path.join({{where!r}}, {MARKER!r}), 'a').write(__name__ + '\\n')\n"
         "raise SystemExit('planted module imported')\n")


def plant(directory: str, where: str) -> None:
    """A `zcorch/` package (and zcorch.worker), a `json.py` and a `runpy.py` in `directory`, each writing
    MARKER into `where` when imported."""
    code = PLANT.format(where=where)
    for rel in ("zcorch/__init__.py", "zcorch/worker/__init__.py", "json.py", "runpy.py"):
        path = os.path.join(directory, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(code)


def unplant(directory: str) -> None:
    shutil.rmtree(os.path.join(directory, "zcorch"), ignore_errors=True)
    for name in ("json.py", "runpy.py", MARKER):
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env.update(extra)
    return env


@pytest.mark.parametrize("safe_path", [False, True])
def test_both_interpreter_forms_ignore_a_planted_package(tmp_path, safe_path):
    """-P (3.11+) and the -c bootstrap (any version): the module by name and the program on stdin."""
    if safe_path and sys.version_info < (3, 11):
        pytest.skip("-P needs Python 3.11")
    plant(str(tmp_path), str(tmp_path))
    by_name = subprocess.run([*python_argv(sys.executable, "zcorch.worker.remote", safe_path=safe_path),
                              "scratch", str(tmp_path / "wd")], cwd=tmp_path, capture_output=True, text=True,
                             env=_env(PYTHONPATH=REPO), timeout=60)
    with open(remote.__file__, encoding="utf-8") as f:
        source = f.read()
    on_stdin = subprocess.run([*python_argv(sys.executable, None, ["-S"], safe_path=safe_path), "scratch",
                               str(tmp_path / "wd2")], input=source, cwd=tmp_path, capture_output=True, text=True,
                              env=_env(), timeout=60)
    assert not (tmp_path / MARKER).exists(), (tmp_path / MARKER).read_text()
    assert by_name.returncode == 0, by_name.stderr
    assert on_stdin.returncode == 0, on_stdin.stderr
    assert (tmp_path / "wd" / "scratch").is_dir() and (tmp_path / "wd2" / "scratch").is_dir()


def test_the_bootstrap_keeps_pythonpath_and_a_safe_path_environment(tmp_path):
    """PYTHONPATH (the worker's build directory) still counts; with PYTHONSAFEPATH=1 nothing was added
    first, and the bootstrap removes nothing."""
    code = [*python_argv(sys.executable, None), "x"]
    for extra in ({}, {"PYTHONSAFEPATH": "1"}):
        p = subprocess.run(code, input="import sys, json; print(json.dumps(sys.path))", capture_output=True,
                           text=True, cwd=tmp_path, env=_env(PYTHONPATH=str(tmp_path / "lib"), **extra), timeout=60)
        assert p.returncode == 0, p.stderr
        path = __import__("json").loads(p.stdout)
        assert path[0] == str(tmp_path / "lib") and "" not in path and str(tmp_path) not in path


def test_module_of_reads_back_every_form():
    for safe in (False, True):
        argv = python_argv("py", "zcorch.worker", ["-S"], safe_path=safe) + ["recv", "--listen", "x"]
        assert module_of(argv) == ("zcorch.worker", len(argv) - 3)
        argv = python_argv("py", None, safe_path=safe) + ["preflight", "a"]
        assert module_of(argv) == (STDIN, len(argv) - 2)
    assert module_of(["py", "native/build.py", "--out", "d"]) is None


def _localhost_experiment(tmp_path) -> str:
    exp = tmp_path / "local.yaml"
    exp.write_text(yaml.safe_dump({"name": "iso", "params": {"bytes": "1MiB", "timeout": "30s"},
                                   "matrix": {"send_mode": ["write"], "recv_mode": ["read"]}, "repeats": 1,
                                   "baselines": {"iperf3": False, "dd": {"bs": "64KiB", "count": 4}}}))
    return str(exp)


@pytest.mark.slow
def test_a_localhost_sweep_from_a_directory_holding_a_zcorch_package(tmp_path, tag):  # noqa: F811
    """The `zcorch` command (its own directory first on sys.path, not the current one) started in a
    directory holding a planted package: the jobs (preflight, scratch, metadata, dd) and the worker must
    run the installed package."""
    script = os.path.join(os.path.dirname(sys.executable), "zcorch")
    if not os.path.isfile(script):
        pytest.skip(f"no zcorch command next to {sys.executable} (scripts/bootstrap installs it)")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    plant(str(cwd), str(cwd))
    p = subprocess.run([script, "run", _localhost_experiment(tmp_path), "-o", str(tmp_path / "rs")], cwd=cwd,
                       capture_output=True, text=True, timeout=240, env=_env(**{TAG_VAR: tag}))
    assert not (cwd / MARKER).exists(), (cwd / MARKER).read_text()
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    [run] = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
    assert run["status"] == "ok"
    assert [b["status"] for b in read_jsonl(str(tmp_path / "rs" / "baselines.jsonl"))] == ["ok", "ok"]


@pytest.mark.lab
@pytest.mark.root
@pytest.mark.timeout(300)
def test_a_lab_sweep_with_a_zcorch_package_in_the_hosts_home_directories(lab, tmp_path, tag):  # noqa: F811
    """Over SSH the jobs start in the login's home directory (/root on the lab hosts): plant it there."""
    from fixtures_run import zcorch

    homes = [lab.sender.home, lab.receiver.home]
    exp = tmp_path / "lab.yaml"
    exp.write_text(yaml.safe_dump({"name": "isolab", "hosts": lab.hosts_spec,
                                   "params": {"bytes": "1MiB", "timeout": "30s"},
                                   "matrix": {"send_mode": ["write"], "recv_mode": ["read"]}, "repeats": 1,
                                   "baselines": {"iperf3": False, "dd": {"bs": "64KiB", "count": 4}}}))
    try:
        for home in homes:
            plant(home, "/root")     # the marker as the host sees its home
        r = zcorch(tag, "run", exp, "-o", tmp_path / "rs", timeout=240)
        ran = [os.path.join(h, MARKER) for h in homes if os.path.exists(os.path.join(h, MARKER))]
        assert not ran, ran
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        [run] = read_jsonl(str(tmp_path / "rs" / "runs.jsonl"))
        assert run["status"] == "ok"
    finally:
        for home in homes:
            unplant(home)
