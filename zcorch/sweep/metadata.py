"""Host metadata stored with every result set (meta.json): what shaped the numbers.

One command per host: PROBE (a stdlib-only snippet) runs with the host's python as
`python -c PROBE DATA_ADDRESS PATH`; values travel as argv, never through a shell. It reads
/proc and /sys directly and asks `ip -j addr` and `findmnt -J -T PATH`; anything it cannot read
is recorded as null together with why (e.g. `speed` on veth/lo).
"""
from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from typing import Any, Dict, Optional

from zcorch._version import __version__
from zcorch.errors import HostError
from zcorch.hosts.local import Host

SYSCTLS = [
    "net.core.rmem_max", "net.core.wmem_max", "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_congestion_control", "fs.pipe-max-size", "net.core.optmem_max",
]

PROBE = r'''
import json, os, platform, subprocess, sys

def read(path):
    try:
        with open(path) as f:
            return f.read().strip(), None
    except OSError as exc:
        return None, "%s: %s" % (path, exc.strerror or exc)

def run(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, "%s: %s" % (argv[0], exc)
    if p.returncode != 0:
        return None, "%s exited %d: %s" % (" ".join(argv), p.returncode, p.stderr.strip()[:200])
    return p.stdout, None

def interface_for_address(addrs, address):
    """Name of the interface holding `address` in `ip -j addr` output, else None."""
    for link in addrs:
        for info in link.get("addr_info", []):
            if info.get("local") == address:
                return link.get("ifname")
    return None

def first_version_line(argv):
    out, why = run(argv)
    if out is None:
        return None, why
    return (out.strip().splitlines() or [""])[0], None

def probe(address, path, sysctls):
    meta = {"why_null": {}}
    why = meta["why_null"]
    u = platform.uname()
    meta["hostname"] = u.node
    meta["kernel"] = {"release": u.release, "version": u.version, "machine": u.machine}
    cpuinfo, w = read("/proc/cpuinfo")
    model = None
    for line in (cpuinfo or "").splitlines():
        if line.split(":")[0].strip() in ("model name", "Model", "cpu model"):
            model = line.split(":", 1)[1].strip()
            break
    meta["cpu_model"] = model
    if model is None:
        why["cpu_model"] = w or "no model name in /proc/cpuinfo"
    meta["cpu_count"] = os.cpu_count()
    try:
        meta["cpu_affinity_count"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        meta["cpu_affinity_count"] = None
    meminfo, w = read("/proc/meminfo")
    meta["mem_total_bytes"] = None
    for line in (meminfo or "").splitlines():
        if line.startswith("MemTotal:"):
            meta["mem_total_bytes"] = int(line.split()[1]) * 1024
    if meta["mem_total_bytes"] is None:
        why["mem_total_bytes"] = w or "no MemTotal in /proc/meminfo"
    # The data interface: the one that holds the data address.
    iface = {"address": address, "name": None, "mtu": None, "speed_mbps": None}
    out, w = run(["ip", "-j", "addr"])
    if out is None:
        why["interface"] = w
    else:
        iface["name"] = interface_for_address(json.loads(out), address)
        if iface["name"] is None:
            why["interface"] = "no interface holds %s (ip -j addr)" % address
        else:
            mtu, w = read("/sys/class/net/%s/mtu" % iface["name"])
            iface["mtu"] = int(mtu) if mtu else None
            if mtu is None:
                why["interface.mtu"] = w
            speed, w = read("/sys/class/net/%s/speed" % iface["name"])
            if speed is not None and speed.lstrip("-").isdigit() and int(speed) > 0:
                iface["speed_mbps"] = int(speed)
            else:
                # veth, lo and some virtual NICs have no link speed: EINVAL or -1.
                why["interface.speed_mbps"] = w or "speed reported as %r (virtual link?)" % speed
    meta["interface"] = iface
    meta["sysctls"] = {}
    for name in sysctls:
        val, w = read("/proc/sys/" + name.replace(".", "/"))
        meta["sysctls"][name] = " ".join(val.split()) if val is not None else None
        if val is None:
            why["sysctls." + name] = w
    meta["sink_path"] = path
    meta["sink_mount"] = None
    if path:
        probe_path = path
        while probe_path and not os.path.exists(probe_path):
            probe_path = os.path.dirname(probe_path)
        out, w = run(["findmnt", "-J", "-T", probe_path or "/"])
        if out is None:
            why["sink_mount"] = w
        else:
            fss = json.loads(out).get("filesystems") or [None]
            meta["sink_mount"] = fss[0]
    meta["python"] = {"version": platform.python_version(), "executable": sys.executable}
    for key, argv in (("iperf3", ["iperf3", "--version"]), ("compiler", ["cc", "--version"]),
                      ("dd", ["dd", "--version"])):
        meta.setdefault("versions", {})[key], w = first_version_line(argv)
        if w:
            why["versions." + key] = w
    meta["euid"] = os.geteuid()
    return meta

if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "", sys.argv[3:])))
'''


def probe_argv(python: str, data_address: str, path: str) -> list:
    return [python, "-c", PROBE, data_address, path, *SYSCTLS]


def collect_host(host: Host, python: str, data_address: Optional[str] = None, path: str = "") -> Dict[str, Any]:
    """Metadata of one host (one command). Raises HostError naming the host if the probe fails."""
    address = data_address or host.data_address
    res = host.run(probe_argv(python, address, path), timeout=60)
    if not res.ok:
        raise HostError(f"{host.name}: metadata probe failed (exit {res.returncode}): {res.stderr.strip()[-300:]}")
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HostError(f"{host.name}: metadata probe printed no JSON: {res.stdout[:200]!r}") from None


def git_revision(directory: Optional[str] = None) -> Optional[str]:
    """Revision of the controller checkout (with '-dirty' if modified), or None outside git."""
    directory = directory or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        rev = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", directory, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.TimeoutExpired):
        return None


def controller_meta() -> Dict[str, Any]:
    return {"hostname": socket.gethostname(), "zcorch_version": __version__, "git_revision": git_revision(),
            "python": platform.python_version(), "python_executable": sys.executable,
            "platform": platform.platform()}


def load_probe_namespace() -> dict:
    """PROBE's functions as a namespace, for testing its pure parts (interface_for_address)."""
    ns: dict = {"__name__": "zcorch_probe"}
    exec(compile(PROBE, "<zcorch.sweep.metadata.PROBE>", "exec"), ns)
    return ns
