"""One network lease per host, in a fixed host-wide place (root: /run/zcorch, one per network namespace), not
under the inventory's workdir: a second controller with another workdir cannot change the MTU under a live
sweep. Real `zcorch run` processes in a network namespace of the test's own (its lo is their data link)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from fixtures_run import REPO, TAG_VAR, stall_a_run, tagged_worker_pids, wait_no_workers, wait_records
from zcorch.provision.fs_state import HOST_LEASE_DIR

EXP = """name: {name}
allow_network_changes: true
networks:
  net: {{mtu: {mtu}}}
params:
  network: net
  bytes: 512MiB
  source: /dev/zero
  timeout: 60s
matrix:
  send_mode: [write, sendfile]
repeats: 3
"""


def _in_ns(ns, *argv) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True).stdout


def _lo_mtu(ns) -> int:
    return json.loads(_in_ns(ns, "ip", "-j", "link", "show", "lo"))[0]["mtu"]


@pytest.mark.root
def test_a_second_sweep_with_another_workdir_cannot_change_the_mtu_under_a_live_one(tmp_path, tag):
    if shutil.which("ip") is None:
        pytest.skip("needs ip(8) (iproute2)")
    ns = f"zc-lease-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    procs = []
    rx = None
    try:
        _in_ns(ns, "ip", "link", "set", "lo", "up")
        before = _lo_mtu(ns)

        def start(name, mtu):
            home = tmp_path / f"home-{name}"      # localhost's workdir is ~/.cache/zcorch: another one per sweep
            home.mkdir()
            exp = tmp_path / f"{name}.yaml"
            exp.write_text(EXP.format(name=name, mtu=mtu))
            env = dict(os.environ, PYTHONPATH=REPO, HOME=str(home), **{TAG_VAR: tag})
            p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "zcorch", "run", str(exp), "-o",
                                  str(tmp_path / f"rs-{name}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=env, cwd=REPO)
            procs.append(p)
            return p

        a = start("a", 1400)
        wait_records(tmp_path / "rs-a" / "runs.jsonl", 1)
        rx, _ = stall_a_run(lambda: tagged_worker_pids(tag))       # sweep A stays in its run
        assert _lo_mtu(ns) == 1400
        b = start("b", 2000)
        _, err_b = b.communicate(timeout=120)
        assert b.returncode != 0 and "another sweep holds this host's network" in err_b, (b.returncode, err_b)
        assert f"{HOST_LEASE_DIR}/zcorch-net-" in err_b                # the host-wide lease, not B's workdir
        assert _lo_mtu(ns) == 1400                                      # A's configuration, untouched
        a.send_signal(signal.SIGTERM)
        os.kill(rx, signal.SIGCONT)
        rx = None
        _, err_a = a.communicate(timeout=90)
        assert a.returncode == 130, err_a
        assert _lo_mtu(ns) == before
        assert wait_no_workers(tag, 5.0) == []
    finally:
        if rx is not None:
            try:
                os.kill(rx, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
        time.sleep(0.1)


PLAIN = """name: plain
params:
  bytes: 1MiB
  source: /dev/zero
  timeout: 30s
matrix:
  send_mode: [write]
"""


@pytest.mark.root
def test_a_killed_sweeps_network_is_restored_by_a_sweep_with_another_workdir(tmp_path, tag):
    """The network state lives beside the host-wide lease, not in the killed sweep's workdir: a later sweep
    naming another workdir finds and restores it before it measures (here the killed sweep's watchdog is
    killed first, so the leftover stays for the next sweep)."""
    if shutil.which("ip") is None:
        pytest.skip("needs ip(8) (iproute2)")
    from fixtures_run import kill_watchdogs

    ns = f"zc-lease-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    a = None
    try:
        _in_ns(ns, "ip", "link", "set", "lo", "up")
        before = _lo_mtu(ns)

        def env(name):
            home = tmp_path / f"home-{name}"   # localhost's workdir is ~/.cache/zcorch: another one per sweep
            home.mkdir()
            return dict(os.environ, PYTHONPATH=REPO, HOME=str(home), **{TAG_VAR: tag})

        exp = tmp_path / "a.yaml"
        exp.write_text(EXP.format(name="a", mtu=1400))
        a = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "zcorch", "run", str(exp), "-o",
                              str(tmp_path / "rs-a")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env("a"), cwd=REPO)
        wait_records(tmp_path / "rs-a" / "runs.jsonl", 1)
        assert _lo_mtu(ns) == 1400
        pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                                               check=True).stdout.split()]
        assert len(kill_watchdogs(pids)) == 1
        a.kill()
        a.wait()
        assert _lo_mtu(ns) == 1400          # left behind
        plain = tmp_path / "plain.yaml"
        plain.write_text(PLAIN)
        b = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "zcorch", "run", str(plain), "-o",
                            str(tmp_path / "rs-b")], capture_output=True, text=True, env=env("b"), cwd=REPO,
                           timeout=180)
        assert b.returncode == 0, b.stderr[-3000:]
        assert "restored a previous controller's network leftover" in b.stderr and "lo mtu" in b.stderr, b.stderr
        assert _lo_mtu(ns) == before
        rec = json.loads((tmp_path / "rs-b" / "runs.jsonl").read_text().splitlines()[0])
        assert rec["status"] == "ok"
        assert wait_no_workers(tag, 5.0) == []
    finally:
        if a is not None and a.poll() is None:
            a.kill()
            a.wait()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
