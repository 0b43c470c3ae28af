"""The `networks:` section and the `network` parameter: validation (file:line naming the key), the opt-in,
cell ids, run grouping, the host module's own refusals, and the dry run (nothing is changed anywhere)."""
import json
import os
import subprocess
import sys

import pytest

from zcorch.config.experiment import parse_experiment
from zcorch.config.networks import networks_from_mapping
from zcorch.errors import ConfigError
from zcorch.plan import _order_runs_ungrouped, cell_id, expand
from zcorch.sweep.pipeline import run_sweep
from zcorch.worker import netcfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETS = ("networks:\n"
        "  mtu1500: {mtu: 1500}\n"
        "  jumbo: {mtu: 9000, congestion: cubic}\n"
        "  bigbuf: {sysctls: {net.core.rmem_max: 67108864, net.ipv4.tcp_rmem: \"4096 131072 67108864\"}}\n")


def problems(text):
    with pytest.raises(ConfigError) as ei:
        parse_experiment(text, "exp.yaml")
    return ei.value.problems


def test_entries_are_normalised():
    exp = parse_experiment("name: t\nallow_network_changes: true\n" + NETS + "matrix:\n  network: [mtu1500, jumbo]\n")
    jumbo, bigbuf = exp.networks["jumbo"], exp.networks["bigbuf"]
    assert (jumbo.mtu, jumbo.congestion, jumbo.all_sysctls()) == (9000, "cubic", {"net.ipv4.tcp_congestion_control": "cubic"})
    assert bigbuf.mtu is None and bigbuf.all_sysctls() == {"net.core.rmem_max": "67108864",
                                                           "net.ipv4.tcp_rmem": "4096 131072 67108864"}
    assert exp.matrix[0].values == ["mtu1500", "jumbo"] and exp.allow_network_changes


def test_each_bad_value_is_named_at_its_line():
    text = ("name: t\nallow_network_changes: true\nnetworks:\n"
            "  a: {mtu: 67}\n"                                   # line 4
            "  b: {mtu: 65536, congestion: Cubic}\n"            # 5
            "  c: {congestion: \"cubic; reboot\"}\n"            # 6
            "  d: {sysctls: {kernel.panic: 1}}\n"               # 7
            "  e: {sysctls: {net.ipv4.tcp_sack: true}}\n"       # 8
            "  f: {sysctls: {net.core.rmem_max: \"$(rm -rf /)\"}}\n"   # 9
            "  g: {sysctls: {net.ipv4.tcp_congestion_control: reno}, congestion: cubic}\n"  # 10
            "  h: {}\n"                                         # 11
            "  i: {speed: 10G}\n"                               # 12
            "  j: {sysctls: {net..x: 1, net/ipv4/x: 1}}\n"      # 13
            "params: {network: nope}\n")                        # 14
    got = problems(text)
    expect = [("exp.yaml:4:", "networks.a.mtu: expected an integer between 68 and 65535"),
              ("exp.yaml:5:", "networks.b.mtu: expected an integer between 68 and 65535"),
              ("exp.yaml:5:", "networks.b.congestion: `Cubic` is not a congestion control name"),
              ("exp.yaml:6:", "networks.c.congestion: `cubic; reboot` is not a congestion control name"),
              ("exp.yaml:7:", "networks.d.sysctls.kernel.panic: `kernel.panic`: only the network stack's sysctls"),
              ("exp.yaml:8:", "networks.e.sysctls.net.ipv4.tcp_sack: `true` reads as a boolean"),
              ("exp.yaml:9:", "networks.f.sysctls.net.core.rmem_max: `$(rm -rf /)`: a sysctl value is an integer or words"),
              ("exp.yaml:10:", "networks.g.sysctls.net.ipv4.tcp_congestion_control: `net.ipv4.tcp_congestion_control` "
                               "is what `congestion` sets"),
              ("exp.yaml:11:", "networks.h: empty configuration"),
              ("exp.yaml:12:", "networks.i.speed: unknown key `speed`"),
              ("exp.yaml:13:", "networks.j.sysctls.net..x:"),
              ("exp.yaml:13:", "networks.j.sysctls.net/ipv4/x:"),
              ("exp.yaml:14:", "params.network: `nope` is not a network defined under `networks:`")]
    for where, what in expect:
        assert any(p.startswith(where) and what in p for p in got), (where, what, got)
    assert len(got) == len(expect), got


def test_unknown_network_in_the_matrix_suggests_the_defined_ones():
    (msg,) = problems("name: t\nallow_network_changes: true\n" + NETS + "matrix:\n  network: [mtu1500, jumob]\n")
    assert msg.startswith("exp.yaml:8:") and "matrix.network[1]: `jumob` is not a network" in msg
    assert "did you mean `jumbo`" in msg and "defined: mtu1500, jumbo, bigbuf" in msg


def test_localhost_without_the_opt_in_is_refused_with_a_clear_error():
    (msg,) = problems("name: t\n" + NETS + "params: {network: jumbo}\n")
    assert msg.startswith("exp.yaml:6:") and "params.network:" in msg
    assert "loopback" in msg and "allow_network_changes: true" in msg
    # null leaves the hosts alone: no opt-in needed (and the unused entries only warn)
    exp = parse_experiment("name: t\n" + NETS + "params: {network: null}\n")
    assert any("networks.jumbo is defined but no cell uses it" in w for w in expand(exp).warnings)


def remote_hosts(sender_allows, receiver_allows):
    def host(i, allows):
        extra = ", allow_network_changes: true" if allows else ""
        return f"{{ssh: root@10.77.9.{i}, data_address: 10.78.9.{i}{extra}}}"
    return f"hosts:\n  sender: {host(2, sender_allows)}\n  receiver: {host(3, receiver_allows)}\n"


def test_remote_hosts_each_need_their_owners_opt_in():
    (msg,) = problems("name: t\n" + remote_hosts(True, False) + NETS + "params: {network: mtu1500}\n")
    assert "params.network:" in msg and "receiver (root@10.77.9.3) did not allow it" in msg
    exp = parse_experiment("name: t\n" + remote_hosts(True, True) + NETS + "params: {network: mtu1500}\n")
    assert exp.network_allowed("sender") and exp.network_allowed("receiver")
    # or the file's own top-level opt-in, for both
    exp = parse_experiment("name: t\nallow_network_changes: true\n" + remote_hosts(False, False) + NETS
                           + "params: {network: mtu1500}\n")
    assert exp.network_allowed("receiver")


def test_a_null_network_keeps_every_existing_cell_id():
    base = parse_experiment("name: t\nparams: {bytes: 1MiB}\n")
    with_nets = parse_experiment("name: t\n" + NETS + "params: {bytes: 1MiB, network: null}\n")
    (a,), (b,) = expand(base).cells, expand(with_nets).cells
    assert a.id == b.id == cell_id({k: v for k, v in a.params.items() if k != "network"})
    jumbo = parse_experiment("name: t\nallow_network_changes: true\n" + NETS + "params: {bytes: 1MiB, network: jumbo}\n")
    assert expand(jumbo).cells[0].id != a.id


@pytest.mark.parametrize("order", ["interleave", "shuffle", "sequential"])
def test_runs_of_one_network_run_together_so_it_is_applied_once(order):
    exp = parse_experiment("name: t\nallow_network_changes: true\n" + NETS + f"order: {order}\nrepeats: 3\n"
                           "matrix:\n  recv_mode: [read, splice]\n  network: [jumbo, null, mtu1500]\n")
    plan = expand(exp)
    seq = [r.params["network"] for r in plan.runs]
    changes = [n for i, n in enumerate(seq) if i == 0 or seq[i - 1] != n]
    assert sorted(changes, key=str) == sorted(["jumbo", None, "mtu1500"], key=str)   # each group once
    assert len(plan.runs) == 18
    # within a group, the order asked for: interleave = repeat 0 of every cell before repeat 1
    if order == "interleave":
        jumbo = [r.repeat for r in plan.runs if r.params["network"] == "jumbo"]
        assert jumbo == [0, 0, 1, 1, 2, 2]
    # without a network axis the order is what it always was
    plain = parse_experiment(f"name: t\norder: {order}\nrepeats: 3\nmatrix:\n  recv_mode: [read, splice]\n")
    plain_plan = expand(plain)
    assert [(r.id, r.repeat) for r in plain_plan.runs] == \
        [(r.id, r.repeat) for r in _order_runs_ungrouped(plain, plain_plan.cells)]


def test_plain_data_goes_through_the_same_parser():
    assert networks_from_mapping({"x": {"mtu": 1500}})["x"].mtu == 1500
    with pytest.raises(ConfigError, match="networks.x.mtu"):
        networks_from_mapping({"x": {"mtu": 70000}})


def test_the_host_module_refuses_anything_but_net_sysctls_itself():
    # It is fed to the host's python as a file: its own check, whatever the controller sent.
    for bad in ("kernel.panic", "net/../../kernel/panic", "net", "net.ipv4/../x"):
        with pytest.raises(netcfg.ActionError):
            netcfg.sysctl_path(bad)
    assert netcfg.sysctl_path("net.ipv4.tcp_rmem") == "/proc/sys/net/ipv4/tcp_rmem"
    p = subprocess.run([sys.executable, "-m", "zcorch.worker.netcfg", "apply", "/nonexistent-zcorch", "127.0.0.1",
                        json.dumps({"name": "x", "mtu": None, "sysctls": {"kernel.panic": "1"}}), "{}"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    assert p.returncode == 1 and "`kernel.panic` is not a setting zcorch may change" in p.stderr


def test_probe_reads_the_data_link_of_this_machine():
    facts = netcfg.probe("127.0.0.1", ["net.ipv4.tcp_rmem", "net.nonexistent_zcorch"])
    assert facts["interface"] == "lo" and facts["kind"] == "loopback" and facts["error"] is None
    with open("/sys/class/net/lo/mtu") as f:
        assert facts["mtu"] == int(f.read())
    assert "reno" in facts["congestion_available"] and facts["congestion"] in facts["congestion_available"]
    assert facts["sysctls"]["net.nonexistent_zcorch"] is None and len(facts["sysctls"]["net.ipv4.tcp_rmem"].split()) == 3


def test_dry_run_shows_the_commands_and_changes_nothing(tmp_path):
    with open("/sys/class/net/lo/mtu") as f:
        mtu_before = f.read()
    path = tmp_path / "net.yaml"
    path.write_text("name: dry\nallow_network_changes: true\nbaselines: {iperf3: false, dd: false}\n" + NETS +
                    "params: {bytes: 1MiB}\nmatrix:\n  network: [mtu1500, jumbo]\n")
    res = run_sweep(str(path), dry_run=True)
    lines = [e.command() for e in res.recorded]
    applies = [x for x in lines if "zcorch.worker.netcfg apply" in x]
    restores = [x for x in lines if "zcorch.worker.netcfg restore" in x]
    assert len(applies) == 2 and '"mtu": 1500' in applies[0] and '"net.ipv4.tcp_congestion_control": "cubic"' in applies[1]
    assert len(restores) == 2   # mtu1500 restored before jumbo, jumbo at the end
    assert lines.index(restores[0]) < lines.index(applies[1])
    with open("/sys/class/net/lo/mtu") as f:
        assert f.read() == mtu_before
    assert not os.path.exists(os.path.expanduser("~/.cache/zcorch/net/zcorch-net-%d.json" % netcfg.netns_id()))
    assert not os.path.exists(netcfg.state_path("~/.cache/zcorch/net"))   # root's, host-wide


@pytest.mark.root
def test_the_preflight_refuses_a_congestion_control_a_namespace_does_not_allow(tmp_path):
    """What the docs say the preflight does, on a real network namespace: a congestion control the kernel
    lists as available but not in the namespace's tcp_allowed_congestion_control is refused before any run
    (the kernel would answer EPERM), one it allows passes; the facts are the host probe's own, run inside it."""
    import json
    import shutil
    import subprocess
    import sys

    from zcorch.config.networks import NetworkConfig
    from zcorch.provision.network import congestion_problems

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip (a network namespace)")
    ns = f"zcorch-cc-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "zcorch.worker.netcfg", "probe",
                              "127.0.0.1"], capture_output=True, text=True, check=True, cwd=tmp_path)
        facts = json.loads(out.stdout)
        refused = [c for c in facts["congestion_available"] if c not in facts["congestion_allowed"]]
        if not refused or not facts["congestion_allowed"]:
            pytest.skip(f"every available congestion control is allowed here: {facts['congestion_available']}")
        bad = NetworkConfig("cc", congestion=refused[0])
        (problem,) = congestion_problems("receiver", [bad], facts)
        assert f"congestion control `{refused[0]}` cannot be chosen in this host's network namespace" in problem
        assert "tcp_allowed_congestion_control" in problem
        # and the kernel does refuse it there: the preflight said what the run would have met
        write = subprocess.run(["ip", "netns", "exec", ns, "sh", "-c",
                                f"echo {refused[0]} > /proc/sys/net/ipv4/tcp_congestion_control"],
                               capture_output=True, text=True)
        assert write.returncode != 0
        assert congestion_problems("receiver", [NetworkConfig("ok", congestion=facts["congestion_allowed"][0])],
                                   facts) == []
    finally:
        subprocess.run(["ip", "netns", "del", ns])
