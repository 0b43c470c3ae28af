"""The committed copy of the mode capability table (zcorch.config.capabilities_table) that the cell rules
read: it is what the built worker reports (module and `zcorch worker info`), it lists the parameter table's
modes, and `zcorch plan` gives the same cells with and without the compiled module."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fixtures_worker import REPO, needs_native, run_worker
from zcorch.config import capabilities, capabilities_table
from zcorch.config.cells import cell_problems
from zcorch.errors import ZcorchError
from zcorch.params import DEFAULTS, param

# Imported first by the interpreter (a sitecustomize module on PYTHONPATH): makes `import zcorch._native`
# fail as on a controller where the worker was never built, and says so on stderr when it refused.
BLOCKER = '''\
import sys

class _NoNative:
    def find_spec(self, name, path=None, target=None):
        if name == "zcorch._native":
            sys.stderr.write("blocked zcorch._native\\n")
            raise ImportError("zcorch._native blocked by the test")
        return None

sys.meta_path.insert(0, _NoNative())
'''


def test_the_copy_lists_every_mode_of_the_parameter_table_in_its_order():
    table = capabilities.mode_capabilities()
    assert list(table) == ["send", "recv"]
    assert tuple(table["send"]) == param("send_mode").choices
    assert tuple(table["recv"]) == param("recv_mode").choices
    flags = {f for modes in table.values() for caps in modes.values() for f in caps}
    assert flags <= set(capabilities_table.CAPABILITY_NAMES)


def test_the_copy_is_the_generator_s_own_text():
    # hand edits show: the file is exactly what `--write` renders from its own content
    with open(capabilities.TABLE_FILE, encoding="utf-8") as f:
        committed = f.read()
    assert capabilities.render(capabilities_table.CAPABILITY_NAMES, capabilities.mode_capabilities()) == committed


def test_a_mode_the_copy_lacks_says_how_to_regenerate_it():
    with pytest.raises(ZcorchError) as exc:
        capabilities.mode_caps("send", "no_such_mode")
    assert "send mode `no_such_mode`" in str(exc.value) and capabilities.REGENERATE in str(exc.value)
    with pytest.raises(ZcorchError):
        cell_problems(dict(DEFAULTS, recv_mode="no_such_mode"))


@needs_native
def test_the_copy_is_what_the_built_worker_reports():
    with open(capabilities.TABLE_FILE, encoding="utf-8") as f:
        committed = f.read()
    assert capabilities.built_table() == committed, f"regenerate: {capabilities.REGENERATE}"
    rc, events, err = run_worker("info")
    assert rc == 0, err
    reported = events[0]["capabilities"]
    assert reported == {side: {m: sorted(c) for m, c in modes.items()}
                        for side, modes in capabilities.mode_capabilities().items()}
    assert list(reported["send"]) == list(capabilities_table.MODE_CAPABILITIES["send"])  # registry order too
    check = subprocess.run([sys.executable, "-m", "zcorch.config.capabilities", "--check"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stderr


@needs_native
def test_the_check_command_fails_on_a_stale_copy(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "capabilities_table.py"
    with open(capabilities.TABLE_FILE, encoding="utf-8") as f:
        stale.write_text(f.read().replace('"gift", "pipe"', '"pipe"', 1))
    monkeypatch.setattr(capabilities, "TABLE_FILE", str(stale))
    assert capabilities.main(["--check"]) == 1
    assert capabilities.REGENERATE in capsys.readouterr().err
    assert capabilities.main(["--write"]) == 0 and capabilities.main(["--check"]) == 0
    assert stale.read_text() == capabilities.built_table()


def _plan(path: str, extra_path: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (extra_path, REPO) if p))
    return subprocess.run([sys.executable, "-m", "zcorch", "plan", path, "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@needs_native
def test_plan_works_without_the_compiled_module(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    quickstart = os.path.join(REPO, "experiments", "quickstart.yaml")
    built = _plan(quickstart)
    assert built.returncode == 0, built.stderr
    blocked = _plan(quickstart, str(tmp_path))
    assert "blocked zcorch._native" in blocked.stderr   # the import was tried and refused
    assert blocked.returncode == 0, blocked.stderr
    runs = json.loads(blocked.stdout)
    assert runs == json.loads(built.stdout) and len({r["id"] for r in runs}) > 1
    # a cell the rules drop (file_sink with /dev/null) is dropped without the module too
    path = tmp_path / "drop.yaml"
    path.write_text("name: t\nmatrix:\n  recv_mode: [read, mmap]\n  sink: [/dev/null, /tmp/x]\nskip_invalid: true\n")
    built, blocked = _plan(str(path)), _plan(str(path), str(tmp_path))
    assert blocked.returncode == built.returncode == 0, blocked.stderr
    assert json.loads(blocked.stdout) == json.loads(built.stdout) and len(json.loads(built.stdout)) == 3
