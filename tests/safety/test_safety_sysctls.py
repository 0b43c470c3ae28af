"""Network sysctls are an allow-list: the data link's own keys (net.ipv4/ipv6.conf.<data link>.*) and the
documented host-wide ones; conf.all / conf.default, neighbour, route, forwarding and anything else are refused
at plan time (file:line, key) and again by the host module before it writes (real `zcorch plan` processes, the
real host module in a fresh network namespace of its own: nothing of this machine's network is touched)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from zcorch.config.experiment import load_experiment
from zcorch.errors import ConfigError
from zcorch.worker.netcfg import HOST_WIDE_SYSCTLS

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXPERIMENT = """name: n
hosts: localhost
allow_network_changes: true
networks:
  x: {{sysctls: {{{key}: {value}}}}}
params:
  network: x
"""

REFUSED = ["net.ipv4.conf.all.arp_ignore", "net.ipv4.conf.default.arp_ignore", "net.ipv6.conf.all.disable_ipv6",
           "net.ipv6.conf.default.disable_ipv6", "net.ipv4.conf.all.rp_filter", "net.ipv4.conf.all.forwarding",
           "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding", "net.ipv4.neigh.default.gc_thresh1",
           "net.ipv4.neigh.data0.base_reachable_time_ms", "net.ipv6.neigh.data0.gc_stale_time", "net.ipv4.route.flush",
           "net.ipv6.route.max_size", "net.ipv4.tcp_mem", "net.ipv4.icmp_echo_ignore_all", "net.ipv4.ip_local_port_range",
           "net.ipv4.tcp_syncookies", "net.core.somaxconn", "net.netfilter.nf_conntrack_max", "net.unix.max_dgram_qlen",
           "net.ipv4.conf.data0", "net.ipv4.conf.data0.x.y", "net.ipv4.conf.ab_cd_ef_gh_ij_klm.arp_ignore"]


def _experiment(tmp_path, key, value="1"):
    path = tmp_path / "exp.yaml"
    path.write_text(EXPERIMENT.format(key=key, value=value))
    return path


@pytest.mark.parametrize("key", REFUSED)
def test_plan_refuses_a_sysctl_off_the_allow_list(tmp_path, key):
    path = _experiment(tmp_path, key)
    with pytest.raises(ConfigError) as exc:
        load_experiment(str(path))
    assert f"{path}:5:" in str(exc.value) and f"networks.x.sysctls.{key}: `{key}`" in str(exc.value), str(exc.value)


def test_zcorch_plan_refuses_conf_all_arp_ignore_with_the_reason(tmp_path):
    path = _experiment(tmp_path, "net.ipv4.conf.all.arp_ignore", "8")
    res = subprocess.run([sys.executable, "-m", "zcorch", "plan", str(path)], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{path}:5:" in res.stderr and "networks.x.sysctls.net.ipv4.conf.all.arp_ignore" in res.stderr
    assert "changes every interface" in res.stderr


@pytest.mark.parametrize("key", ["net.ipv4.conf.data0.arp_ignore", "net.ipv6.conf.data0.accept_ra",
                                 "net.ipv4.conf.lo.arp_ignore", *HOST_WIDE_SYSCTLS])
def test_plan_accepts_the_data_links_keys_and_the_listed_host_wide_ones(tmp_path, key):
    value = '"cubic"' if key.endswith("congestion_control") else '"4096 131072 6291456"' if key.endswith("mem") \
        else "1"
    assert load_experiment(str(_experiment(tmp_path, key, value))).networks["x"].sysctls


# -- the host module's own judgement (zcorch.worker.netcfg in a network namespace of its own) -------------

def _in_netns(script: str) -> subprocess.CompletedProcess:
    """`script` (sh) in a fresh network namespace with lo up: the data link to 127.0.0.1 is lo there."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1): a network namespace of the test's own")
    return subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up && " + script], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO}, timeout=60)


def _apply(state_dir, sysctls: dict) -> str:
    spec = json.dumps({"name": "x", "mtu": None, "sysctls": sysctls})
    return (f"{sys.executable} -m zcorch.worker.netcfg apply {state_dir} 127.0.0.1 '{spec}' '{{}}'; "
            "echo rc=$?; ")


@pytest.mark.root
@pytest.mark.parametrize("key,path", [
    ("net.ipv4.conf.all.arp_ignore", "ipv4/conf/all/arp_ignore"),
    ("net.ipv4.conf.default.arp_ignore", "ipv4/conf/default/arp_ignore"),
    ("net.ipv4.ip_forward", "ipv4/ip_forward"),
    ("net.ipv4.conf.eth0.arp_ignore", "ipv4/conf/lo/arp_ignore"),      # a key of another link than the data link
    ("net.ipv4.neigh.lo.gc_stale_time", "ipv4/neigh/lo/gc_stale_time"),
])
def test_host_module_refuses_before_writing(tmp_path, key, path):
    state = tmp_path / "net"
    res = _in_netns(f"cat /proc/sys/net/{path}; " + _apply(state, {"net.ipv4.tcp_rmem": "4096 65536 131072", key: "2"})
                    + f"cat /proc/sys/net/{path}; cat /proc/sys/net/ipv4/tcp_rmem")
    before, rc, after, rmem = res.stdout.splitlines()[0], res.stdout.splitlines()[-3], *res.stdout.splitlines()[-2:]
    assert rc == "rc=1" and "refused, nothing changed" in res.stderr and f"`{key}`" in res.stderr, res.stderr
    assert after == before and rmem.split() != ["4096", "65536", "131072"]      # nothing at all was written
    assert not state.exists() or not os.listdir(state)


@pytest.mark.root
def test_host_module_sets_and_restores_the_data_links_own_key(tmp_path):
    state = tmp_path / "net"
    spec = {"net.ipv4.conf.lo.arp_ignore": "2"}
    res = _in_netns(_apply(state, spec) + "cat /proc/sys/net/ipv4/conf/lo/arp_ignore; "
                    f"{sys.executable} -m zcorch.worker.netcfg restore {state}; cat /proc/sys/net/ipv4/conf/lo/arp_ignore")
    lines = res.stdout.splitlines()
    assert lines[1] == "rc=0" and lines[2] == "2" and lines[-1] == "0", res.stdout + res.stderr


@pytest.mark.root
def test_host_module_restores_no_key_off_the_allow_list_from_a_state_file(tmp_path):
    """A state file (private, well-formed) that lists conf.all.arp_ignore, as apply never records: restore does
    not write it (before: it wrote whatever the file said)."""
    state = tmp_path / "net"
    state.mkdir(mode=0o700)
    doc = {"format": "zcorch-net-state", "version": 1, "name": "x", "owner": {}, "interface": "lo", "mtu": None,
           "sysctls": {"net.ipv4.conf.all.arp_ignore": "8"}}
    script = ("ino=$(stat -L -c %i /proc/self/ns/net); "
              f"printf '%s' '{json.dumps(doc)}' > {state}/zcorch-net-$ino.json; chmod 600 {state}/zcorch-net-$ino.json; "
              f"{sys.executable} -m zcorch.worker.netcfg restore {state}; cat /proc/sys/net/ipv4/conf/all/arp_ignore")
    res = _in_netns(script)
    out = json.loads(res.stdout.splitlines()[0])
    assert out["restored"] == [] and "not restored" in out["errors"][0], res.stdout + res.stderr
    assert res.stdout.splitlines()[-1] == "0"
