"""Host metadata: one probe command per host, compared with what the machine itself says."""
import json
import os
import platform
import subprocess
import sys

from conftest import require_tool
from zcorch.sweep import metadata
from zcorch.hosts.local import LocalHost
from zcorch.worker import remote

CAPTURED = os.path.join(os.path.dirname(__file__), "data", "captured")


def read(path):
    with open(path) as f:
        return f.read().strip()


def test_probe_on_localhost_matches_the_machine(tmp_path):
    sink = tmp_path / "sub" / "sink.bin"  # does not exist yet: the nearest existing parent counts
    meta = metadata.collect_host(LocalHost(), sys.executable, "127.0.0.1", str(sink))
    assert meta["kernel"]["release"] == platform.uname().release
    assert meta["cpu_count"] == os.cpu_count()
    assert meta["mem_total_bytes"] > 0
    assert meta["interface"]["name"] == "lo"
    assert meta["interface"]["mtu"] == int(read("/sys/class/net/lo/mtu"))
    # lo has no link speed: null, and the reason is recorded.
    assert meta["interface"]["speed_mbps"] is None
    assert "interface.speed_mbps" in meta["why_null"]
    for name in metadata.SYSCTLS:
        assert meta["sysctls"][name] == " ".join(read("/proc/sys/" + name.replace(".", "/")).split())
    expected = json.loads(subprocess.run(["findmnt", "-J", "-T", str(tmp_path)], capture_output=True,
                                         text=True, check=True).stdout)["filesystems"][0]
    assert meta["sink_mount"] == expected
    assert meta["python"]["version"] == platform.python_version()
    assert meta["versions"]["compiler"]


def test_probe_values_travel_as_argv_not_through_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    meta = metadata.collect_host(LocalHost(), sys.executable, f"127.0.0.1; touch {marker}", f"$(touch {marker})")
    assert not marker.exists()
    assert meta["interface"]["name"] is None and "no interface holds" in meta["why_null"]["interface"]


def test_interface_for_address_on_captured_ip_output():
    with open(os.path.join(CAPTURED, "ip_addr.json")) as f:
        addrs = json.load(f)
    assert remote.interface_for_address(addrs, "127.0.0.1") == "lo"
    assert remote.interface_for_address(addrs, "::1") == "lo"
    assert remote.interface_for_address(addrs, "192.0.2.77") is None


def test_controller_meta_has_version_and_git_revision():
    meta = metadata.controller_meta()
    assert meta["zcorch_version"]
    head = subprocess.run(["git", "-C", os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(metadata.__file__)))),
                           "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert meta["git_revision"].startswith(head.stdout.strip())


def test_zcrx_is_recorded_for_the_data_interface_and_never_claimed_for_loopback(tmp_path):
    meta = metadata.collect_host(LocalHost(), sys.executable, "127.0.0.1", str(tmp_path))
    lo = meta["zcrx"]["lo"]
    assert lo["interface"] == "lo" and lo["kind"] == "loopback" and lo["possible"] is False
    assert lo["why"] == ["lo is a loopback link: no NIC with header/data split"]
    assert lo["kernel"] == (remote.kernel_version(platform.release()) >= remote.ZCRX_KERNEL)
    assert metadata.collect_host(LocalHost(), sys.executable, "192.0.2.77", "")["zcrx"] == {}  # no interface


ETHTOOL_G = """Ring parameters for ens1f0np0:
Pre-set maximums:
RX:\t\t\t2047
TX:\t\t\t2047
Current hardware settings:
RX:\t\t\t1023
TX:\t\t\t1023
RX Buf Len:\t\tn/a
CQE Size:\t\tn/a
TX Push:\t\toff
TCP data split:\t\ton
"""
ETHTOOL_K = """Features for ens1f0np0:
rx-checksumming: on
ntuple-filters: off
receive-hashing: on
hw-tc-offload: off [fixed]
"""


def test_zcrx_verdict_from_ethtool_output():
    assert remote.parse_ethtool_feature(ETHTOOL_G, "TCP data split") == "on"
    assert remote.parse_ethtool_feature(ETHTOOL_K, "ntuple-filters") == "off"
    assert remote.parse_ethtool_feature(ETHTOOL_K, "hw-tc-offload") == "off"  # "[fixed]" dropped
    assert remote.parse_ethtool_feature(ETHTOOL_K, "tcp-data-split") is None
    assert remote.kernel_version("6.18.44-fc-v669") == (6, 18) and remote.kernel_version("x") == ()
    nic = {"interface": "ens1f0np0", "kind": "physical", "driver": "bnxt_en", "kernel": True, "kernel_release": "6.16.0",
           "io_uring_disabled": "0", "tcp_data_split": "on", "ntuple": "on"}
    assert remote.zcrx_verdict(nic) == (True, [])
    assert remote.zcrx_verdict(dict(nic, ntuple="off")) == (False, [
        "flow steering (ntuple filters) is off (ethtool -K ens1f0np0 ntuple on)"])
    assert remote.zcrx_verdict(dict(nic, tcp_data_split="off", kernel=False, kernel_release="6.1.0"))[1] == [
        "kernel 6.1.0 has no io_uring zcrx (Linux 6.15 or later)",
        "TCP header/data split is off (ethtool -G ens1f0np0 tcp-data-split on)"]
    assert remote.zcrx_verdict(dict(nic, tcp_data_split="n/a"))[1][0].startswith("driver bnxt_en reports no TCP")
    assert remote.zcrx_verdict(dict(nic, io_uring_disabled="2"))[0] is False
    unknown = dict(nic, tcp_data_split=None, ntuple=None, ethtool_error="ethtool is not installed (apt-get install ethtool)")
    assert remote.zcrx_verdict(unknown) == (None, ["unknown: ethtool is not installed (apt-get install ethtool)"])
    assert remote.zcrx_verdict(dict(nic, kind="veth", interface="v0"))[0] is False


def test_git_revision_only_of_the_top_of_a_work_tree(tmp_path):
    """A wheel installed into a venv that lies inside some repository: that repository's revision is not ours."""
    require_tool("git")
    repo, site = tmp_path / "project", tmp_path / "project" / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    assert metadata.git_revision(str(repo)) == head
    assert metadata.git_revision(str(site)) is None
    assert metadata.git_revision(str(tmp_path)) is None          # no repository at all


def test_remember_controller_answers_for_the_processes_forked_next(monkeypatch):
    """A fleet finds the controller's git revision and platform once, before it forks its pairs: afterwards
    git_revision() and controller_meta() answer without running anything, with what they answered before."""
    import types

    monkeypatch.setattr(metadata, "_remembered_revisions", {})
    before = metadata.controller_meta()
    metadata.remember_controller()

    def no_command(*args, **kwargs):
        raise AssertionError(f"ran {args[0] if args else kwargs} after remember_controller()")

    # A stand-in for the subprocess module (not a fault simulation): it proves git does not run again.
    monkeypatch.setattr(metadata, "subprocess", types.SimpleNamespace(run=no_command, TimeoutExpired=TimeoutError))
    assert metadata.git_revision() == before["git_revision"]
    assert metadata.controller_meta() == before
