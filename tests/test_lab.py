"""`zcorch lab`: layout (pure) and real up/status/down with network namespaces and sshd (root)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from zcorch.lab import netns as zlab
from zcorch.errors import LabError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- pure -----------------------------------------------------------------------------------
def test_layout_names_and_addresses():
    layout = zlab.LabLayout("ci-runner_7", 255)
    assert all(len(link) <= 15 for link in layout.root_links())
    assert layout.mgmt_address("sender") == "10.77.255.2" and layout.mgmt_address("receiver") == "10.77.255.3"
    assert layout.data_address("sender") == "10.78.255.2" and layout.controller_address == "10.77.255.1"
    assert layout.ns("receiver") == "zcorch-ci-runner_7-receiver"
    assert layout.state_dir == "/var/lib/zcorch-lab/ci-runner_7"
    # what `up` prints is YAML that parses back to the spec (paste-able into an experiment file)
    assert yaml.safe_load(layout.hosts_yaml()) == {"hosts": layout.hosts_spec()}
    spec = layout.hosts_spec()["receiver"]
    assert spec["ssh"] == "root@10.77.255.3" and spec["data_address"] == "10.78.255.3"
    assert spec["identity_file"].startswith(layout.state_dir)
    assert "ListenAddress 10.77.255.3" in layout.sshd_config_text("receiver")


@pytest.mark.parametrize("name, index", [("", 0), ("Bad Name", 0), ("a/b", 0), ("x" * 40, 0), ("ok", 256),
                                         ("ok", -1)])
def test_layout_rejects_bad_name_or_index(name, index):
    with pytest.raises(LabError):
        zlab.LabLayout(name, index)


def test_cli_without_root_says_so():
    """A real unprivileged process (forked, setuid nobody) runs `zcorch lab up`."""
    from zcorch import cli

    cli.build_parser()  # import every stage now: after setuid the interpreter's files may be unreadable
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            sys.stderr = open(w, "w")  # pytest replaced sys.stderr; the CLI prints there
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            rc = cli.main(["lab", "up", "--name", "nonroot", "--index", "250"])
        except BaseException:  # anything else is what the test must catch
            import traceback

            traceback.print_exc()
            rc = 99
        sys.stderr.flush()
        os._exit(rc)
    os.close(w)
    with os.fdopen(r) as f:
        stderr = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 1, stderr
    assert "needs root" in stderr and "Traceback" not in stderr
    assert not os.path.exists(os.path.join(zlab.STATE_ROOT, "nonroot"))


# -- real ------------------------------------------------------------------------------------
def _traces(layout: zlab.LabLayout) -> dict:
    """Everything of this lab visible on the machine: netns, links, mounts, sshd processes, state."""
    links = [l["ifname"] for l in zlab._links()
             if l.get("ifalias") == layout.alias or l["ifname"] in layout.root_links()]
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f
                  if layout.state_dir in line or f"/run/netns/{layout.ns_prefix}" in line]
    sshd = subprocess.run(["pgrep", "-f", f"{layout.state_dir}/"], capture_output=True, text=True).stdout.split()
    return {"netns": [n for n in zlab.list_netns() if n.startswith(layout.ns_prefix)], "links": sorted(links),
            "mounts": mounts, "processes": sshd, "state": os.path.exists(layout.state_dir)}


NOTHING = {"netns": [], "links": [], "mounts": [], "processes": [], "state": False}


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zcorch", "lab", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


@pytest.fixture
def own_lab():
    """A second lab (own name and index) for tests that take labs up and down."""
    from fixtures_lab import start_lab

    name = f"pytestown{os.getpid()}"
    layout = start_lab(name)
    yield layout
    zlab.down(layout)
    assert _traces(layout) == NOTHING


@pytest.mark.lab
def test_up_idempotent_status_and_down_leaves_nothing(own_lab):
    layout = own_lab
    st = zlab.status(layout)
    assert st["up"]
    pids = {h: v["sshd_pid"] for h, v in st["hosts"].items()}
    # up again: nothing restarted, same sshd; the CLI prints the hosts block
    p = _cli("up", "--name", layout.name, "--index", str(layout.index))
    assert p.returncode == 0, p.stderr
    assert yaml.safe_load(p.stdout.split("\n", 1)[1]) == {"hosts": layout.hosts_spec()}
    assert {h: v["sshd_pid"] for h, v in zlab.status(layout)["hosts"].items()} == pids
    p = _cli("status", "--name", layout.name, "--json")  # index from the state file
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    assert st["index"] == layout.index and all(v["ssh_banner"].startswith("SSH-2.0") for v in st["hosts"].values())
    # data link: MTU 9000 between the two namespaces
    link = json.loads(subprocess.run(["ip", "-n", layout.ns("sender"), "-j", "link", "show", "data0"],
                                     capture_output=True, text=True).stdout)[0]
    assert link["mtu"] == 9000
    traces = _traces(layout)
    assert len(traces["netns"]) == 2 and traces["processes"] and traces["state"]
    p = _cli("down", "--name", layout.name)
    assert p.returncode == 0, p.stderr
    assert _traces(layout) == NOTHING
    p = _cli("down", "--name", layout.name, "--index", str(layout.index))  # idempotent
    assert p.returncode == 0, p.stderr
    p = _cli("status", "--name", layout.name, "--index", str(layout.index))
    assert p.returncode == 3 and "not up" in p.stdout


@pytest.mark.lab
def test_index_owned_by_another_lab_is_refused(lab):
    with pytest.raises(LabError, match=f"in use by lab '{lab.name}'"):
        zlab.up(zlab.LabLayout("intruder", lab.index))
    assert zlab.status(zlab.LabLayout(lab.name, lab.index))["up"]


def _stray_in(ns: str, seconds: int) -> str:
    """A `sleep` left running in namespace `ns` (setsid: not ours to reap), once it is really in there:
    `setsid -f` returns before `ip netns exec` has entered the namespace, and a repair that looks before then
    cannot see it (the fresh-clone CI once had the sleep join after `up` had cleaned). The pattern pgrep -f
    finds it by: its argument carries this test process's pid, so no one else's sleep matches."""
    arg = f"{seconds}.{os.getpid()}"
    subprocess.run(["setsid", "-f", "ip", "netns", "exec", ns, "sleep", arg], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in zlab.netns_pids(ns):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[:2] == [b"sleep", arg.encode()]:
                        return f"sleep {arg}"
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError(f"sleep {arg} did not appear in {ns} within 10 s")


@pytest.mark.lab
def test_down_after_crashed_up_and_repair_by_up(own_lab):
    layout = own_lab
    # Crash 1: an sshd died (kill -9) and a stray process still runs in the namespace; `up` repairs.
    st = zlab.status(layout)
    os.kill(st["hosts"]["receiver"]["sshd_pid"], 9)
    stray = _stray_in(layout.ns("sender"), 1234)
    assert not zlab.status(layout)["up"]
    assert zlab.up(layout)["up"]
    assert subprocess.run(["pgrep", "-f", stray], capture_output=True).returncode == 1
    zlab.down(layout, keep_keys=True)
    assert os.path.exists(layout.identity_file) and os.path.exists(layout.known_hosts)
    assert not os.path.exists(layout.home("sender"))
    # Crash 2: a partial `up` (bridge + one namespace with a process, no state files) then `down`.
    zlab.down(layout)
    subprocess.run(["ip", "link", "add", layout.bridge, "type", "bridge"], check=True)
    subprocess.run(["ip", "link", "set", layout.bridge, "alias", layout.alias], check=True)
    subprocess.run(["ip", "link", "add", layout.mgmt_veth("sender"), "type", "veth", "peer", "name",
                    layout.mgmt_veth("sender") + "p"], check=True)
    subprocess.run(["ip", "netns", "add", layout.ns("sender")], check=True)
    stray = _stray_in(layout.ns("sender"), 1235)
    assert _traces(layout) != NOTHING
    zlab.down(layout)
    assert _traces(layout) == NOTHING
    assert subprocess.run(["pgrep", "-f", stray], capture_output=True).returncode == 1
    zlab.down(layout)  # twice: still fine
    assert _traces(layout) == NOTHING


@pytest.mark.lab
def test_hosts_have_private_homes_and_scratch(lab):
    marker = f"private-{os.getpid()}"
    r = lab.run_in("receiver", ["sh", "-c", f"echo hi > /root/{marker} && echo s > /scratch/{marker} && ls /root"])
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(lab.receiver.home, marker))
    assert not os.path.exists(f"/root/{marker}") and not os.path.exists(f"/scratch/{marker}")
    assert lab.run_in("sender", ["test", "-e", f"/root/{marker}"]).returncode == 1
    assert lab.zcorch_procs("receiver") == []


def _loops() -> dict:
    out = subprocess.run(["losetup", "-J"], capture_output=True, text=True).stdout
    return {d["name"]: d.get("back-file") for d in (json.loads(out)["loopdevices"] if out.strip() else [])}


@pytest.mark.lab
def test_down_undoes_a_killed_sweeps_filesystem_state(own_lab):
    from fixtures_fs import SMALL_CONFIGS, start_provisioner

    layout = own_lab
    before = _loops()
    # A controller killed right before `mount`: its loop device is attached without autoclear, so
    # destroying the namespaces alone would leak it.
    proc = start_provisioner({"ext4-loop": SMALL_CONFIGS["ext4-loop"]}, zlab.FS_STATE_DIR, "mount-beneath",
                             layout.hosts_spec())
    proc.wait(timeout=120)
    assert proc.returncode == -9, proc.stderr.read()
    ours = {dev: f for dev, f in _loops().items() if before.get(dev) != f}
    assert len(ours) == 1, ours
    p = _cli("down", "--name", layout.name, "--index", str(layout.index))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "undid a killed sweep's filesystem state on receiver: detached" in p.stdout, p.stdout
    now = _loops()
    assert not [dev for dev, f in ours.items() if now.get(dev) == f]
