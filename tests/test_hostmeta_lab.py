"""Host facts in the two-host lab: the receiver's qdisc (and, with ethtool, its GRO) changed between two real
sweeps; `zcorch compare A B` names the change beside its verdict, and the history page shows it."""
import json

import pytest

from fixtures_analysis import copy_result_set, zcorch_cli
from fixtures_browser import assert_page_is_sound, open_in_browser

EXPERIMENT = """\
name: hostmeta-check
params: {bytes: 16MiB, buffer: 64KiB, timeout: 60s, source: /dev/zero}
matrix:
  recv_mode: [read]
repeats: 3
baselines: false
"""
# a lab would try `fq`; kernels built without it (this machine's) have pfifo always: the change is the same kind
NEW_QDISC = "pfifo"


def link_state(lab, dev: str) -> "tuple[str, str | None]":
    """(root qdisc, GRO on/off or None without ethtool) of the receiver's data link, as the host says."""
    qdisc = json.loads(lab.run_in("receiver", ["ip", "-j", "link", "show", "dev", dev], check=True,
                                  capture_output=True, text=True).stdout)[0]["qdisc"]
    res = lab.run_in("receiver", ["ethtool", "-k", dev], capture_output=True, text=True)
    if res.returncode != 0:
        return qdisc, None
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("generic-receive-offload:"))
    return qdisc, line.split(":")[1].split()[0]


@pytest.mark.lab
def test_compare_and_history_name_a_qdisc_and_gro_changed_between_two_sweeps(lab, tmp_path, browser):
    from conftest import require_tool

    require_tool("tc")
    experiment = tmp_path / "hostmeta-check.yaml"
    experiment.write_text(EXPERIMENT + lab.layout.hosts_yaml())
    dev = lab.data_interface("receiver")
    qdisc0, gro0 = link_state(lab, dev)
    assert qdisc0 != NEW_QDISC, qdisc0
    root = tmp_path / "nightly"
    first = zcorch_cli("run", experiment, "-o", root / "night1" / "hostmeta-check")
    assert first.returncode == 0, first.stderr[-3000:]
    gro1 = {"on": "off", "off": "on"}.get(gro0 or "")
    try:
        lab.run_in("receiver", ["tc", "qdisc", "replace", "dev", dev, "root", NEW_QDISC], check=True)
        if gro1:
            lab.run_in("receiver", ["ethtool", "-K", dev, "gro", gro1], check=True)
        assert link_state(lab, dev) == (NEW_QDISC, gro1 if gro1 else None)
        second = zcorch_cli("run", experiment, "-o", root / "night2" / "hostmeta-check")
        assert second.returncode == 0, second.stderr[-3000:]
    finally:
        lab.run_in("receiver", ["tc", "qdisc", "del", "dev", dev, "root"])
        if gro1:
            lab.run_in("receiver", ["ethtool", "-K", dev, "gro", gro0])
    assert link_state(lab, dev) == (qdisc0, gro0)     # restored: the next test's lab is as it was

    a, b = root / "night1" / "hostmeta-check", root / "night2" / "hostmeta-check"
    facts = json.loads((a / "meta.json").read_text())["hosts"]["receiver"]["host_facts"]
    assert facts["qdisc"] == qdisc0 and (gro0 is None or facts["gro"] == gro0)
    res = zcorch_cli("compare", a, b)
    print(res.stdout)
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("zcorch compare: ")         # the verdict, and right beside it what changed
    hosts = lines[1]
    assert hosts.startswith("hosts: ") and f"receiver: qdisc {qdisc0} → {NEW_QDISC}" in hosts, hosts
    if gro1:
        assert f"receiver: GRO {gro0} → {gro1}" in hosts, hosts
    assert "sender: qdisc" not in hosts and "sender: GRO" not in hosts   # only the receiver's link changed
    doc = json.loads(zcorch_cli("compare", a, b, "--format", "json").stdout)
    assert f"receiver: qdisc {qdisc0} → {NEW_QDISC}" in doc["host_changes"]
    same = zcorch_cli("compare", a, copy_result_set(a, tmp_path / "again"))
    assert same.stdout.splitlines()[1] == "hosts: no recorded change (meta.json)", same.stdout

    history = zcorch_cli("history", root)
    assert history.returncode in (0, 1, 3), history.stdout + history.stderr
    page = (root / "index.html").read_text()
    assert "What changed on the hosts" in page and f"receiver: qdisc {qdisc0} → {NEW_QDISC}" in page
    seen = open_in_browser(browser, root / "index.html", "history-host-changes")
    assert_page_is_sound(seen)
    print("screenshot:", seen["screenshot"])
