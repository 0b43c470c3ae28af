"""The nightly recipe, contrib/nightly/zcorch-nightly: run as it would be by the timer (real `zcorch run`
and `zcorch history --check`), on localhost and against the lab through an inventory; its pruning of old
nights on plain directories."""
import datetime as dt
import fcntl
import importlib.machinery
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from fixtures_analysis import ROOT

SCRIPT = ROOT / "contrib" / "nightly" / "zcorch-nightly"

TINY = """\
name: tiny-nightly
params: {bytes: 8MiB, buffer: 64KiB, timeout: 30s, source: /dev/zero}
matrix:
  send_mode: [write]
  recv_mode: [read, splice]
repeats: 3
baselines: false
"""


def nightly(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """The script as the systemd unit runs it: this python (which has zcorch), argv only."""
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def script_module():
    loader = importlib.machinery.SourceFileLoader("zcorch_nightly", str(SCRIPT))
    spec = importlib.util.spec_from_loader("zcorch_nightly", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_prune_keeps_the_newest_nights_and_touches_nothing_it_did_not_make(tmp_path):
    mod = script_module()
    root = tmp_path / "root"
    root.mkdir()
    made = []
    for i in range(5):
        night = mod.night_directory(str(root), dt.datetime(2026, 11, 1 + i, 3, tzinfo=dt.timezone.utc))
        (tmp_path / "root" / os.path.basename(night) / "exp").mkdir()
        made.append(os.path.basename(night))
    assert made == [f"202611{d:02d}T030000Z" for d in range(1, 6)]
    # the same second again: a night of its own
    again = mod.night_directory(str(root), dt.datetime(2026, 11, 5, 3, tzinfo=dt.timezone.utc))
    assert os.path.basename(again) == "20261105T030000Z-1"
    # what the script did not make, though it looks alike
    (root / "20200101T000000Z").mkdir()                                     # a night without the marker
    elsewhere = tmp_path / "elsewhere" / "20200102T000000Z"
    elsewhere.mkdir(parents=True)
    (elsewhere / mod.MARKER).write_text("{}")
    (root / "20200102T000000Z").symlink_to(elsewhere)                      # a link to a marked night
    (root / "20200103T000000Z").mkdir()
    (root / "20200103T000000Z" / mod.MARKER).mkdir()                        # a marker that is no file
    (root / "results").mkdir()
    (root / "results" / mod.MARKER).write_text("{}")                        # not named like a night
    (root / "20200104T000000Z").write_text("a file")

    removed = mod.prune(str(root), keep=2)
    assert [os.path.basename(p) for p in removed] == made[:4]
    assert sorted(os.listdir(root)) == ["20200101T000000Z", "20200102T000000Z", "20200103T000000Z",
                                        "20200104T000000Z", made[4], "20261105T030000Z-1", "results"]
    assert (elsewhere / mod.MARKER).is_file()
    assert mod.prune(str(root), keep=2) == []


@pytest.mark.slow   # two nights of the real recipe, each a sweep and a history
def test_a_night_on_localhost_then_the_next_keeping_one(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY.replace("params:", "hosts: localhost\nparams:"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nrepeats: -1\n")
    root = tmp_path / "nightly"

    first = nightly("--root", root, "--keep", "1", tiny, bad)
    # bad.yaml is refused before any result set exists: history cannot see it, the script says so
    assert first.returncode == 2, first.stderr[-3000:]
    assert "no result set for: " + str(bad) in first.stderr
    (night1,) = [p for p in root.iterdir() if p.name[0].isdigit()]
    assert (night1 / ".zcorch-nightly").is_file()
    assert json.loads((night1 / "tiny" / "manifest.json").read_text())["status"] == "complete"
    assert "zcorch history: 1 result set(s)" in first.stdout and (root / "index.html").is_file()

    second = nightly("--root", root, "--keep", "1", tiny)
    # one night kept: nothing earlier to compare with, which the gate calls incomplete, not a pass
    assert second.returncode == 3, second.stderr[-3000:]
    assert "tiny-nightly: one sweep only, nothing earlier to compare with" in second.stdout
    assert f"pruned {night1}" in second.stderr
    (night2,) = [p for p in root.iterdir() if p.name[0].isdigit()]
    assert night2 != night1 and (night2 / "tiny" / "report.html").is_file()
    assert "tiny-nightly: 1 sweep(s)" in second.stdout


def test_refusals(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY)
    other = tmp_path / "other"
    other.mkdir()
    (other / "tiny.yaml").write_text(TINY)
    res = nightly("--root", tmp_path / "r", tiny, other / "tiny.yaml")
    assert res.returncode == 2 and "same result directory: tiny" in res.stderr
    res = nightly("--root", tmp_path / "r", tmp_path / "missing.yaml")
    assert res.returncode == 2 and "not found" in res.stderr
    res = nightly("--root", tmp_path / "r", "--keep", "0", tiny)
    assert res.returncode == 2 and "--keep" in res.stderr
    # another night still running under ROOT: this one does not start
    root = tmp_path / "held"
    root.mkdir()
    with open(root / ".zcorch-nightly.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        res = nightly("--root", root, tiny)
    assert res.returncode == 75 and "another zcorch-nightly runs" in res.stderr
    assert sorted(p.name for p in root.iterdir()) == [".zcorch-nightly.lock"]


@pytest.mark.lab
@pytest.mark.slow
def test_the_recipe_against_the_lab_through_an_inventory(lab, tmp_path):
    """The experiment has no hosts: block; the inventory names the lab's pair (needs `zcorch run --hosts`)."""
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(json.dumps({"pairs": {"lab": lab.hosts_spec}}, indent=1))  # JSON is YAML
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(TINY)
    root = tmp_path / "nightly"
    res = nightly("--root", root, "--hosts", f"{inventory}:lab", "--keep", "3", tiny)
    assert res.returncode == 3, res.stdout + res.stderr[-3000:]   # the first night: nothing to compare with
    assert "tiny-nightly: one sweep only" in res.stdout.splitlines()[-1]
    (night,) = [p for p in root.iterdir() if p.name[0].isdigit()]
    meta = json.loads((night / "tiny" / "meta.json").read_text())
    assert meta["hosts"]["receiver"]["interface"]["address"] == lab.receiver.data  # it ran in the lab
    assert meta["hosts"]["sender"]["interface"]["address"] == lab.sender.data
    assert "tiny-nightly: 1 sweep(s)" in res.stdout and "CANNOT TELL" in res.stdout
    assert (night / "tiny" / "report.html").is_file()
    assert "lab (inventory.yaml)" in (root / "index.html").read_text()  # the pair the manifest records


def recipe_argv(text: str) -> list:
    """The zcorch-nightly command line of a unit's ExecStart= (continuation lines joined) or a cron line."""
    text = text.replace("\\\n", " ")
    for line in text.splitlines():
        if "contrib/nightly/zcorch-nightly " in line and not line.startswith("#"):
            argv = shlex.split(line.split("ExecStart=", 1)[-1].split(">>", 1)[0])
            return argv[argv.index(next(a for a in argv if a.endswith("contrib/nightly/zcorch-nightly"))) + 1:]
    raise AssertionError("no zcorch-nightly command line")


def test_the_shipped_unit_timer_and_cron_line_are_valid_and_call_the_script_as_it_parses(tmp_path):
    mod = script_module()
    nightly_dir = SCRIPT.parent
    for name in ("zcorch-nightly.service", "zcorch-nightly.cron"):
        argv = recipe_argv((nightly_dir / name).read_text())
        # the experiment files named there exist in a lab's /etc/zcorch; ours are in experiments/
        argv = [str(ROOT / "experiments" / os.path.basename(a)) if a.endswith(".yaml") else a for a in argv]
        args = mod.parse_args(argv)
        assert args.hosts == "/etc/zcorch/inventory.yaml:lab" and args.keep == 30 and len(args.experiments) == 2
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed")
    # verified with this machine's python in place of /opt/zcorch/.venv (systemd checks it is executable)
    unit = (nightly_dir / "zcorch-nightly.service").read_text()
    unit = unit.replace("/opt/zcorch/.venv/bin/python", sys.executable).replace("User=zcorch", "User=root")
    (tmp_path / "zcorch-nightly.service").write_text(unit)
    (tmp_path / "zcorch-nightly.timer").write_text((nightly_dir / "zcorch-nightly.timer").read_text())
    res = subprocess.run([tool, "verify", "zcorch-nightly.service", "zcorch-nightly.timer"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "zcorch-nightly" not in res.stderr, res.stderr
