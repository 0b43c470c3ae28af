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
