"""Two controller machines, one host: the fleet's host locks live on each controller (/run/zcorch/fleet), so
what keeps a second controller's fleet off a host a first one is measuring is the host's own ControllerLease
(zcorch.provision.fs_state), held for the whole of each sweep and shared by every sweep of one controller.

Controller B is a real second `zcorch run` in UTS and mount namespaces of its own (`unshare -u -m`): another host
name, its own /run/zcorch/fleet (a tmpfs: A's fleet locks are not B's, as on another machine), its own HOME and,
in its inventory, another workdir; against the same two lab hosts as controller A's fleet."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest
import yaml

from fixtures_run import REPO, TAG_VAR, start_zcorch, wait_records
from zcorch.provision.fs_state import HOST_LEASE_DIR

pytestmark = [pytest.mark.lab, pytest.mark.root, pytest.mark.timeout(400)]

# As another machine: its own host name and its own /run/zcorch/fleet; then the command ("$@" after the name).
AS_OTHER_CONTROLLER = ('hostname "$1" && mkdir -p /run/zcorch/fleet && '
                       'mount -t tmpfs -o mode=0700 zcorch-other-controller /run/zcorch/fleet && shift && exec "$@"')
OTHER = "zc-other-controller"


def _experiment(path, repeats, size):
    path.write_text(yaml.safe_dump({"name": path.stem, "hosts": "inventory",
                                    "params": {**size, "source": "mem", "sink": "/dev/null", "timeout": "30s"},
                                    "matrix": {"send_mode": ["write"]}, "repeats": repeats, "baselines": False}))
    return path


def _inventory(path, lab, **extra):
    path.write_text(yaml.safe_dump({"pairs": {"p1": {r: dict(lab.hosts_spec[r], **extra)
                                                     for r in ("sender", "receiver")}}}))
    return path


def _other_controller(tmp_path, tag, *args):
    home = tmp_path / "home-b"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, PYTHONPATH=REPO, HOME=str(home), **{TAG_VAR: tag})
    return subprocess.run(["unshare", "-u", "-m", "--", "sh", "-c", AS_OTHER_CONTROLLER, "sh", OTHER,
                           sys.executable, "-m", "zcorch", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=240)


def test_a_second_controllers_fleet_is_refused_on_a_shared_host_naming_the_first(lab, tmp_path, tag):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) (util-linux)")
    inv_a = _inventory(tmp_path / "inv-a.yaml", lab)
    inv_b = _inventory(tmp_path / "inv-b.yaml", lab, workdir="/root/zc-other-controller")
    exp_a = _experiment(tmp_path / "fleet-a.yaml", 40, {"duration": "1s"})     # A measures for 40 s or more
    exp_b = _experiment(tmp_path / "fleet-b.yaml", 2, {"bytes": "4MiB"})
    a = start_zcorch(tag, "run", exp_a, "--hosts", f"{inv_a}:all", "-o", tmp_path / "A")
    try:
        wait_records(tmp_path / "A" / "p1" / "runs.jsonl", 1, timeout=120)
        b = _other_controller(tmp_path, tag, "run", exp_b, "--hosts", f"{inv_b}:all", "-o", tmp_path / "B")
        said = b.stdout + b.stderr
        assert b.returncode == 1, said[-3000:]
        pair = json.loads((tmp_path / "B" / "fleet.json").read_text())["pairs"][0]
        assert pair["status"] == "failed", pair
        # refused naming the holder: A's machine, its process, and the host-wide lock (not a workdir's)
        for text in (pair["reason"], said):
            assert f"controller {socket.gethostname()} (pid " in text and "is running sweeps on this host" in text, text
        assert f"{HOST_LEASE_DIR}/zcorch-controller-" in pair["reason"]
        assert not (tmp_path / "B" / "p1" / "runs.jsonl").exists() or \
            (tmp_path / "B" / "p1" / "runs.jsonl").read_text() == ""     # B transferred nothing
        assert a.poll() is None                                             # A runs on, undisturbed
        a.send_signal(signal.SIGTERM)
        _, err_a = a.communicate(timeout=120)
        assert a.returncode == 130, err_a[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    recs = [json.loads(line) for line in (tmp_path / "A" / "p1" / "runs.jsonl").read_text().splitlines()]
    # every run of A ok but the one the SIGTERM ended
    assert [r for r in recs if r["status"] == "ok"] and \
        all(r["status"] == "ok" or "interrupted by SIGTERM" in r["reason"] for r in recs), [r["reason"] for r in recs]
    # A gone: its hold ended with its connections, and B (still another machine) now runs there
    again = _other_controller(tmp_path, tag, "run", exp_b, "--hosts", f"{inv_b}:all", "-o", tmp_path / "B2")
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
