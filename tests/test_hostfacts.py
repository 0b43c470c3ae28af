"""Host facts (meta.json hosts.<role>.host_facts, zcorch.worker.remote.HOST_FACTS) and what changed between two
sets' hosts (zcorch.analysis.hostdiff): the reader on a /proc-/sys-like fixture tree and on this machine, the
diff on meta.json documents."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from zcorch.analysis import hostdiff
from zcorch.analysis.compare import compare_frames, render
from zcorch.worker import remote

ROOT = Path(__file__).resolve().parent.parent
KEYS = [row[0] for row in remote.HOST_FACTS]
FIXTURE_IF = "zcfix0"   # no such interface here: ethtool and ip answer for it as for a missing link

INTERRUPTS = f"""           CPU0       CPU1
  0:         40          0   IO-APIC   2-edge      timer
 34:      12345          0   PCI-MSI 524288-edge      {FIXTURE_IF}-TxRx-0
 35:          0      67890   PCI-MSI 524289-edge      {FIXTURE_IF}-TxRx-1
 36:          1          0   PCI-MSI 524290-edge      {FIXTURE_IF}
 37:          5          0   PCI-MSI 524291-edge      {FIXTURE_IF}1-TxRx-0
NMI:          0          0   Non-maskable interrupts
"""


def write(root: Path, path: str, text: str) -> None:
    f = root / path.lstrip("/")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(text)


@pytest.fixture
def tree(tmp_path) -> Path:
    """What /proc and /sys hold on a two-CPU server with a PCI NIC (as read on such machines)."""
    root = tmp_path / "root"
    write(root, "/proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.1.0-21-amd64 root=UUID=x ro mitigations=off isolcpus=1\n")
    write(root, "/proc/interrupts", INTERRUPTS)
    for irq, cpus in (("34", "0"), ("35", "1"), ("36", "0-1"), ("37", "1")):
        write(root, f"/proc/irq/{irq}/smp_affinity_list", cpus + "\n")
    for cpu in (0, 1):
        write(root, f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "performance\n")
    write(root, "/sys/devices/system/cpu/intel_pstate/no_turbo", "1\n")
    write(root, "/sys/devices/system/cpu/smt/control", "off\n")
    write(root, "/sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    write(root, f"/sys/class/net/{FIXTURE_IF}/device/numa_node", "1\n")
    drivers = root / "sys/bus/pci/drivers/ixgbe"
    drivers.mkdir(parents=True)
    os.symlink(drivers, root / f"sys/class/net/{FIXTURE_IF}/device/driver")
    return root


def test_the_reader_on_a_fixture_tree(tree):
    facts = remote.host_facts(FIXTURE_IF, root=str(tree))
    assert list(facts) == KEYS
    assert facts["kernel_cmdline"].endswith("mitigations=off isolcpus=1")
    # the queues of zcfix0, not those of zcfix01 (whose name only starts like it)
    assert facts["irq_affinity"] == {"34": "0", "35": "1", "36": "0-1"}
    assert facts["cpu_governor"] == "performance"
    assert facts["cpu_boost"] == "off"             # intel_pstate's no_turbo=1
    assert facts["smt"] == "off" and facts["thp"] == "never" and facts["nic_numa_node"] == 1
    assert facts["nic_driver"] == "ixgbe"          # ethtool knows no zcfix0: the sysfs link
    # what ethtool and ip cannot say of a missing link is unavailable with their own words, never a guess
    for key in ("nic_firmware", "gso", "gro", "tso", "lro", "rings", "qdisc"):
        why = facts[key]["unavailable"]
        assert FIXTURE_IF in why and ("exited" in why or "not installed" in why), (key, why)


def test_every_fact_of_an_empty_tree_is_unavailable_with_its_reason(tmp_path):
    facts = remote.host_facts(FIXTURE_IF, root=str(tmp_path))
    assert list(facts) == KEYS
    for key, value in facts.items():
        assert set(value) == {"unavailable"} and value["unavailable"].strip(), (key, value)
    assert "cpufreq" in facts["cpu_governor"]["unavailable"]
    assert "virtual link" in facts["nic_numa_node"]["unavailable"]
    none = remote.host_facts(None, "no interface holds 192.0.2.7 (ip -j addr)", root=str(tmp_path))
    assert none["qdisc"] == none["gro"] == {"unavailable": "no interface holds 192.0.2.7 (ip -j addr)"}


def test_the_reader_on_this_machine_says_what_the_machine_says():
    facts = remote.host_facts("lo")
    with open("/proc/cmdline") as f:
        assert facts["kernel_cmdline"] == f.read().strip()
    link = json.loads(subprocess.run(["ip", "-j", "link", "show", "dev", "lo"], capture_output=True, text=True,
                                     check=True).stdout)[0]
    assert facts["qdisc"] == link["qdisc"]
    if shutil.which("ethtool"):
        shown = subprocess.run(["ethtool", "-k", "lo"], capture_output=True, text=True, check=True).stdout
        for key, name in (("gso", "generic-segmentation-offload"), ("gro", "generic-receive-offload"),
                          ("tso", "tcp-segmentation-offload"), ("lro", "large-receive-offload")):
            line = next(ln for ln in shown.splitlines() if ln.startswith(name + ":"))
            assert facts[key] == line.split(":")[1].split()[0], (key, line)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if thp.exists():
        assert f"[{facts['thp']}]" in thp.read_text()
    assert "unavailable" in facts["irq_affinity"] and "unavailable" in facts["nic_numa_node"]   # lo: no device


def test_a_missing_ethtool_is_a_reason_not_a_crash(tmp_path, monkeypatch):
    # a PATH that has ip but no ethtool (a real host without the package)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(shutil.which("ip"), bin_dir / "ip")
    monkeypatch.setenv("PATH", str(bin_dir))
    facts = remote.host_facts("lo")
    assert facts["gro"] == {"unavailable": "ethtool is not installed (apt-get install ethtool)"}
    assert facts["rings"] == facts["gro"]
    assert facts["qdisc"] == "noqueue"


def test_metadata_probe_records_the_host_facts(tmp_path):
    meta = remote.host_metadata("127.0.0.1", str(tmp_path), [])
    assert list(meta["host_facts"]) == KEYS and meta["host_facts"]["qdisc"] == "noqueue"
    absent = remote.host_metadata("192.0.2.77", "", [])["host_facts"]
    assert absent["qdisc"]["unavailable"] == "no interface holds 192.0.2.77 (ip -j addr)"


def test_a_firmware_version_is_kept_whole_and_an_offload_is_its_state(tmp_path):
    # `ethtool -i` of an ixgbe NIC and `ethtool -k` of a feature the driver fixes, as ethtool prints them (this
    # machine has no physical NIC: the captured answers stand in the reader's cache of its commands)
    reader = remote._FactReader("eth9", root=str(tmp_path))
    reader._runs[("ethtool", "-i", "eth9")] = ("driver: ixgbe\nversion: 6.1.0\nfirmware-version: 0x800008a4, "
                                              "1.2585.0\nbus-info: 0000:03:00.0\n", None)
    reader._runs[("ethtool", "-k", "eth9")] = ("Features for eth9:\nlarge-receive-offload: off [fixed]\n"
                                              "generic-receive-offload: on [requested off]\n", None)
    assert reader.ethtool_field("-i", "firmware-version") == "0x800008a4, 1.2585.0"
    assert reader.driver() == "ixgbe"
    assert (reader.offload("large-receive-offload"), reader.offload("generic-receive-offload")) == ("off", "on")


def test_ring_sizes_of_captured_ethtool_output():
    shown = """Ring parameters for eth0:
Pre-set maximums:
RX:		4096
RX Mini:	n/a
TX:		4096
Current hardware settings:
RX:		512
RX Mini:	n/a
RX Jumbo:	0
TX:		1024
RX Buf Len:		n/a
TCP data split:		off
"""
    assert remote.parse_ethtool_rings(shown) == {"rx": 512, "rx_jumbo": 0, "tx": 1024}
    assert remote.parse_ethtool_rings("netlink error: Operation not supported") == {}


def test_the_docs_table_is_generated_from_the_declaration():
    path = ROOT / "docs" / "experiment-files.md"
    text = path.read_text(encoding="utf-8")
    assert remote.render_host_facts_docs(text) == text, (
        "regenerate: python -c \"import zcorch.worker.remote as r; p='docs/experiment-files.md'; "
        "t=open(p).read(); open(p,'w').write(r.render_host_facts_docs(t))\"")


def test_every_host_fact_has_a_label_in_the_diff():
    assert set(KEYS) <= set(hostdiff.FACT_LABELS), set(KEYS) - set(hostdiff.FACT_LABELS)


# -- the diff ---------------------------------------------------------------------------------------------

def host(**facts) -> dict:
    base = {"kernel": {"release": "6.1.0-18-amd64"}, "cpu_model": "Xeon", "cpu_count": 2,
            "interface": {"name": "eth1", "mtu": 9000, "kind": "device"},
            "sysctls": {"net.core.rmem_max": "4194304"}, "versions": {"iperf3": "iperf 3.12"},
            "host_facts": {"gro": "on", "qdisc": "fq_codel", "cpu_governor": {"unavailable": "no cpufreq"},
                           "kernel_cmdline": "ro quiet mitigations=auto"}}
    for dotted, value in facts.items():
        node = base
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return base


def meta(sender: dict, receiver: dict) -> dict:
    return {"controller": {"hostname": "ctl"}, "hosts": {"sender": sender, "receiver": receiver}}


def test_nothing_changed_is_nothing_said():
    assert hostdiff.diff_meta(meta(host(), host()), meta(host(), host())) == []


def test_a_change_of_both_roles_is_said_once_and_one_role_s_with_its_role():
    old = meta(host(), host())
    new = meta(host(kernel__release="6.1.0-21-amd64"),
               host(kernel__release="6.1.0-21-amd64", host_facts__gro="off", host_facts__qdisc="fq"))
    assert hostdiff.diff_meta(old, new) == ["kernel 6.1.0-18-amd64 → 6.1.0-21-amd64", "receiver: GRO on → off",
                                            "receiver: qdisc fq_codel → fq"]


def test_memory_is_said_in_gib_so_a_kernel_s_few_kib_are_no_change():
    old = meta(host(mem_total_bytes=8 << 30), host(mem_total_bytes=8 << 30))
    new = meta(host(mem_total_bytes=(8 << 30) - 4096), host(mem_total_bytes=16 << 30))
    assert hostdiff.diff_meta(old, new) == ["receiver: memory 8.0 GiB → 16.0 GiB"]


def test_unavailable_on_one_side_is_said_with_its_reason_and_on_both_is_no_change():
    old = meta(host(), host(host_facts__gro={"unavailable": "ethtool is not installed"}))
    new = meta(host(host_facts__cpu_governor={"unavailable": "another reason"}), host())
    assert hostdiff.diff_meta(old, new) == ["receiver: GRO unavailable (ethtool is not installed) → on"]


def test_a_command_line_says_the_words_that_went_and_came():
    new = meta(host(host_facts__kernel_cmdline="ro quiet mitigations=off isolcpus=1"), host())
    assert hostdiff.diff_meta(meta(host(), host()), new) == [
        "sender: kernel command line −mitigations=auto +mitigations=off +isolcpus=1"]


def test_sysctls_versions_and_dict_facts_are_compared_key_by_key():
    new = meta(host(sysctls={"net.core.rmem_max": "8388608"}),
               host(versions__iperf3="iperf 3.16", host_facts__rings={"rx": 512, "tx": 512}))
    old = meta(host(), host(host_facts__rings={"rx": 256, "tx": 512}))
    assert hostdiff.diff_meta(old, new) == ["sender: net.core.rmem_max 4194304 → 8388608",
                                            "receiver: ring sizes rx 256, tx 512 → rx 512, tx 512",
                                            "receiver: iperf3 version iperf 3.12 → iperf 3.16"]


def test_what_one_side_never_recorded_is_named_never_taken_for_unchanged():
    older = host()
    del older["host_facts"]          # a set of a zcorch before host facts
    lines = hostdiff.diff_meta(meta(older, older), meta(host(), host()))
    assert lines == ["not recorded on one side: GRO, qdisc, CPU governor, kernel command line"]
    assert hostdiff.diff_meta({}, meta(host(), host())) == ["sender: no host metadata in base",
                                                            "receiver: no host metadata in base"]
    assert hostdiff.diff_meta({}, {}) == ["no host metadata on either side"]


def test_compare_render_puts_the_host_changes_beside_the_verdict():
    import pandas as pd

    runs = pd.DataFrame({"cell": ["c0"] * 3, "status": ["ok"] * 3, "gbit_s": [1.0, 1.1, 1.2], "repeat": [0, 1, 2]})
    table = compare_frames(runs, runs)
    text = render(table, "text", "A", "B", None, ["receiver: qdisc noqueue → fq"])
    assert text.splitlines()[1] == "hosts: receiver: qdisc noqueue → fq"
    assert "hosts: no recorded change (meta.json)" in render(table, "text", "A", "B", None, [])
    assert "**hosts: receiver: qdisc noqueue → fq**" in render(table, "markdown", "A", "B", None,
                                                              ["receiver: qdisc noqueue → fq"])
    doc = json.loads(render(table, "json", "A", "B", None, ["receiver: GRO on → off"]))
    assert doc["host_changes"] == ["receiver: GRO on → off"]
