"""SIGHUP (a dropped terminal or SSH session) ends a sweep exactly as SIGTERM and Ctrl-C do: the run in
progress recorded interrupted, the manifest `interrupted`, the hosts restored, exit 130. Real `zcorch run`
processes, real signals, a real pty hung up, a real network namespace whose lo the sweep changes."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import termios
import time
import uuid

import pytest

from fixtures_run import REPO, TAG_VAR, stall_a_run, start_zcorch, tagged_worker_pids, wait_no_workers, wait_records
from zcorch.results.store import read_jsonl

EXP = """name: hup
params:
  bytes: 512MiB
  source: /dev/zero
  timeout: 60s
matrix:
  send_mode: [write, sendfile]
repeats: 3
"""


# The signal tests check the runs, not the baselines: without them the first run starts seconds sooner
NO_BASELINES = "baselines: false\n"


def _exp(tmp_path, extra=""):
    path = tmp_path / "hup.yaml"
    path.write_text(EXP + extra)
    return path


@pytest.mark.slow
def test_sighup_mid_run_ends_the_sweep_interrupted_with_130(tmp_path, tag):
    out = tmp_path / "rs"
    p = start_zcorch(tag, "run", _exp(tmp_path, NO_BASELINES), "-o", out)
    rx = None
    try:
        wait_records(out / "runs.jsonl", 1)
        rx, _ = stall_a_run(lambda: tagged_worker_pids(tag))     # a run in progress that cannot end by itself
        p.send_signal(signal.SIGHUP)
        _, err = p.communicate(timeout=60)
        assert p.returncode == 130, (p.returncode, err)
    finally:
        if p.poll() is None:
            p.kill()
        if rx is not None:
            try:
                os.kill(rx, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    [stopped] = [r for r in read_jsonl(str(out / "runs.jsonl")) if r["status"] == "interrupted"]
    assert stopped["reason"] == "interrupted by SIGHUP during the run"
    assert "--resume" in err
    assert wait_no_workers(tag, 5.0) == []


@pytest.mark.slow
def test_a_hung_up_terminal_ends_the_sweep_and_its_teardown_finishes(tmp_path, tag):
    """zcorch run on a pty as its controlling terminal, the terminal's master closed (the kernel's SIGHUP, and
    every later write to the terminal fails): the teardown still finishes and closes the result set."""
    out = tmp_path / "rs"
    master, slave = os.openpty()

    def controlling_tty():
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    p = subprocess.Popen([sys.executable, "-m", "zcorch", "run", str(_exp(tmp_path, NO_BASELINES)), "-o", str(out)],
                         stdin=slave, stdout=slave, stderr=slave, cwd=REPO, preexec_fn=controlling_tty,
                         env=dict(os.environ, PYTHONPATH=REPO, **{TAG_VAR: tag}))
    os.close(slave)
    try:
        os.set_blocking(master, False)
        deadline = time.monotonic() + 60
        while not read_jsonl(str(out / "runs.jsonl")) and time.monotonic() < deadline:
            try:
                os.read(master, 65536)        # keep the terminal drained while the sweep starts
            except OSError:
                pass
            time.sleep(0.05)
        os.close(master)                       # the terminal hangs up
        master = None
        assert p.wait(timeout=60) == 130
    finally:
        if master is not None:
            os.close(master)
        if p.poll() is None:
            p.kill()
    assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
    assert wait_no_workers(tag, 5.0) == []


NETWORK = """allow_network_changes: true
networks:
  small: {mtu: 1500, sysctls: {net.ipv4.tcp_rmem: "4096 65536 131072", net.ipv4.conf.lo.arp_ignore: 2}}
"""


def _in_ns(ns, *argv) -> str:
    return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True).stdout


@pytest.mark.root
def test_sighup_restores_the_hosts_network(tmp_path, tag):
    """In a network namespace of the test's own (its lo is the localhost sweep's data link): the sweep changed
    lo's MTU, tcp_rmem and lo's arp_ignore; SIGHUP ends it with all three back as they were."""
    if shutil.which("ip") is None:
        pytest.skip("needs ip(8) (iproute2)")
    ns = f"zc-hup-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "rs"
    p = None
    try:
        _in_ns(ns, "ip", "link", "set", "lo", "up")

        def state():
            mtu = json.loads(_in_ns(ns, "ip", "-j", "link", "show", "lo"))[0]["mtu"]
            return (mtu, " ".join(_in_ns(ns, "cat", "/proc/sys/net/ipv4/tcp_rmem").split()),
                    _in_ns(ns, "cat", "/proc/sys/net/ipv4/conf/lo/arp_ignore").strip())

        before = state()
        exp = tmp_path / "hup.yaml"
        exp.write_text(EXP.replace("params:\n", "params:\n  network: small\n") + NETWORK)
        env = dict(os.environ, PYTHONPATH=REPO, HOME=str(home), **{TAG_VAR: tag})
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "zcorch", "run", str(exp), "-o",
                              str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        wait_records(out / "runs.jsonl", 1)
        during = state()
        assert during[0] == 1500 and during[1] == "4096 65536 131072" and during[2] == "2", (during, before)
        p.send_signal(signal.SIGHUP)                 # ip netns exec execs: p.pid is zcorch itself
        _, err = p.communicate(timeout=90)
        assert p.returncode == 130, err
        assert state() == before
        assert json.loads((out / "manifest.json").read_text())["status"] == "interrupted"
        assert wait_no_workers(tag, 5.0) == []
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        subprocess.run(["ip", "netns", "delete", ns], check=False)
