"""One lease per host, host-wide: the fleet's host and share locks live in one place of the machine (root:
/run/zcorch/fleet, zcorch.sweep.fleet.lock_dir), not in each fleet's directory, so two fleets at once on the
same hosts take turns, saying whom they wait for; a lock whose holder was killed while holding it is taken
over with a message. Real `zcorch run` fleets (localhost pairs: every pair is this machine) and real flocks
of a real SIGKILLed process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from fixtures_run import REPO, TAG_VAR
from test_fleet import overlaps, run_intervals
from zcorch.provision.fs_state import HOST_LEASE_DIR
from zcorch.sweep import fleet as fl

EXPERIMENT = """\
name: {name}
hosts: localhost
params: {{bytes: 4MiB, source: mem, sink: /dev/null, timeout: 20s}}
matrix:
  send_mode: [write]
repeats: 8
baselines: false
"""
INVENTORY = """\
pairs:
  a: localhost
  b: localhost
"""


@pytest.mark.root
@pytest.mark.serial   # it judges whom a fleet waited for: another worker's localhost fleet holds the same lock
def test_two_fleets_at_once_on_the_same_host_never_overlap_and_say_whom_they_wait_for(tmp_path, tag):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    assert fl.lock_dir(str(tmp_path / "f1")) == os.path.join(HOST_LEASE_DIR, "fleet")   # not under the fleet
    procs = {}
    for name in ("f1", "f2"):
        exp = tmp_path / f"{name}.yaml"
        exp.write_text(textwrap.dedent(EXPERIMENT.format(name=name)))
        env = dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag})
        procs[name] = subprocess.Popen([sys.executable, "-m", "zcorch", "run", str(exp), "--hosts", f"{inv}:a,b",
                                        "-o", str(tmp_path / name), "--json"], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    out = {}
    try:
        for name, p in procs.items():
            out[name] = p.communicate(timeout=400)
            assert p.returncode == 0, out[name][1][-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    runs = {f"{f}/{pair}": run_intervals(tmp_path / f / pair) for f in ("f1", "f2") for pair in "ab"}
    assert all(len(r) == 8 for r in runs.values())
    keys = sorted(runs)
    # not one moment where two runs on this machine overlapped, within a fleet or across the two
    assert [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:] if overlaps(runs[a], runs[b])] == []
    said = [json.loads(line) for f in out.values() for line in f[0].splitlines() if line.startswith("{")]
    waits = [e.get("message", "") for e in said if "waiting for host-localhost" in e.get("message", "")]
    # a pair of one fleet waited for a pair of the other, naming it
    assert any(f"of fleet {tmp_path / 'f2'}" in w for w in waits) or \
        any(f"of fleet {tmp_path / 'f1'}" in w for w in waits), waits or said[:20]


HOLD_AND_DIE = """
import os, signal, sys
from zcorch.sweep import fleet as fl
locks = fl.FleetLocks(sys.argv[1], [sys.argv[2]], who={"fleet": "/x/F", "pair": "p"})
locks.acquire()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_lock_whose_holder_was_killed_holding_it_is_taken_over_with_a_message(tmp_path):
    name = fl.lock_files(["h:22"], [])[0]
    p = subprocess.run([sys.executable, "-c", HOLD_AND_DIE, str(tmp_path), name], env=dict(os.environ, PYTHONPATH=REPO),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    said: list = []
    locks = fl.FleetLocks(str(tmp_path), [name], say=said.append)
    locks.acquire()     # the kernel dropped the dead holder's flock: no wait
    try:
        assert len(said) == 1 and "took over" in said[0] and "(pid " in said[0], said
        assert "died holding it" in said[0] and "pair p of fleet /x/F" in said[0], said
    finally:
        locks.release()
    again: list = []
    locks = fl.FleetLocks(str(tmp_path), [name], say=again.append)
    locks.acquire()     # released properly this time: nothing to take over
    locks.release()
    assert again == []
