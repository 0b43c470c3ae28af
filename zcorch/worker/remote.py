"""Small jobs the controller runs on a host with the host's own python: probes, scratch, dd, deploy steps.

    python -m zcorch.worker.remote ACTION ARGS...      (localhost: the controller's own package)
    python - ACTION ARGS... < zcorch/worker/remote.py   (remote hosts: this file's text on stdin)

Each action (ACTIONS below) takes argv, never a shell, and prints one JSON line where it has an answer;
exit 0 on success, 1 when the job failed (message on stderr), 2 on a usage error. Stdlib-only, importing
nothing from zcorch: it runs before the worker is deployed. No `typing` at run time (`python -S`).
"""
from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import platform
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import sysconfig
import time
from contextlib import suppress
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple


class ActionError(Exception):
    """A job that cannot be done: main() prints the message on stderr and exits 1."""


# -- preflight (before anything is deployed) ---------------------------------------------------

def _on_path(program: str) -> "str | None":
    """The first file named `program` in a directory of PATH, executable or not (unlike shutil.which)."""
    for d in os.environ.get("PATH", "").split(os.pathsep):
        path = os.path.join(d or ".", program)
        if os.path.isfile(path):
            return path
    return None


def preflight_facts(address: str, ports: "Sequence[int]" = (), programs: "Sequence[str]" = ()) -> "Dict[str, Any]":
    """What a sweep needs from this host: python version, cffi, Python.h, a compiler, each of `programs`
    (`tools`: {program: path or None}), and whether `address` (the data address) and each of `ports` on
    it can be bound."""
    out: "Dict[str, Any]" = {"python": list(sys.version_info[:3]), "executable": sys.executable}
    try:
        import cffi
        out["cffi"] = cffi.__version__
    except Exception:  # a broken cffi install counts as none
        out["cffi"] = None
    inc = sysconfig.get_paths().get("include") or ""
    out["python_h"] = os.path.exists(os.path.join(inc, "Python.h"))
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    out["cc"] = shutil.which(os.environ.get("CC", "") or cc) or shutil.which("cc") or shutil.which("gcc")
    out["tools"] = {p: shutil.which(p) for p in programs}
    # a program on PATH that cannot run (no execute bit): said as such, not as missing
    out["tools_unrunnable"] = {p: found for p in programs if out["tools"][p] is None
                               for found in [_on_path(p)] if found is not None}
    out["address_error"] = _bind_error(address, 0)
    tried = [] if out["address_error"] else [(int(port), _bind_error(address, int(port))) for port in ports]
    out["busy_ports"] = [[port, why] for port, why in tried if why]
    return out


def _bind_error(address: str, port: int) -> "str | None":
    """Why `address`:`port` cannot be bound, None if it can."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as s:
            # As servers (iperf3, the worker) do: a previous run's connection in TIME_WAIT is no listener,
            # and a real listener still makes bind fail.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
    except OSError as exc:
        return str(exc)
    return None


def build_state(workdir: str, name: str, marker: str) -> "Dict[str, Any]":
    """A worker build as the deploy step would find it: {"workdir": as written, "path": the build directory
    (expanded here), "marker": its marker's text or None (a build is due), "refused": None or why it must not
    be used}. The marker is read only after `private-build`'s checks: in a tree others can change it says nothing."""
    if not BUILD_NAME.fullmatch(name):
        raise ActionError(f"{name!r} is not the name of a worker build (worker-<16 hex digits>)")
    parent = os.path.expanduser(workdir)
    if not os.path.isabs(parent):   # relative to the home directory, where a remote command starts
        parent = os.path.join(os.path.expanduser("~"), parent)
    build = os.path.join(parent, name)
    out: "Dict[str, Any]" = {"workdir": workdir, "path": build, "marker": None, "refused": None}
    path = os.path.join(build, marker)
    if not os.path.exists(path):
        return out
    try:
        check_private_build(parent, build)
    except (ActionError, OSError) as exc:
        out["refused"] = f"private-build: {exc}"
        return out
    with suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:   # unreadable: rebuilt
        out["marker"] = f.read()
    return out


def cffi_backend_dir() -> str:
    """Directory holding _cffi_backend: the built worker needs only it from site-packages (so it can run -S)."""
    try:
        import _cffi_backend
    except ImportError as exc:
        raise ActionError(f"no _cffi_backend for {sys.executable}: {exc}") from None
    return os.path.dirname(os.path.abspath(_cffi_backend.__file__))


# -- deploy ----------------------------------------------------------------------------------

def check_private_dirs(paths: "Sequence[str]") -> None:
    """Refuse directories whose code this user would run but another user could change: each must be
    owned by the effective user and writable by neither group nor others (the build goes on PYTHONPATH)."""
    euid = os.geteuid()
    problems = []
    for path in paths:
        st = os.stat(path)
        if st.st_uid != euid:
            problems.append(f"{path} is owned by uid {st.st_uid}, not by uid {euid} who runs zcorch — "
                            f"use a workdir of your own (hosts.<role>.workdir) or chown it to uid {euid}")
        elif st.st_mode & 0o022:
            problems.append(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}) — "
                            f"chmod go-w {path}")
    if problems:
        raise ActionError("; ".join(problems))


MAX_TREE_PROBLEMS = 5


def check_private_tree(root: str) -> None:
    """check_private_dirs for `root` and everything below it (a module deep in a build on PYTHONPATH runs as
    this user too), judged by lstat: a symlink, device, FIFO or socket is refused (the build makes none)."""
    if stat.S_ISLNK(os.lstat(root).st_mode):
        raise ActionError(f"{root} is a symlink, not the build directory zcorch made")
    check_private_dirs([root])
    euid = os.geteuid()
    problems = []
    for top, dirs, files in os.walk(root, onerror=_raise):
        for path in (os.path.join(top, name) for name in dirs + files):
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "neither a file nor a directory"
                problems.append(f"{path} is {kind} (a worker build holds only files and directories)")
            elif st.st_uid != euid:
                problems.append(f"{path} is owned by uid {st.st_uid}, not by uid {euid} who runs zcorch")
            elif st.st_mode & 0o022:
                problems.append(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")
        if len(problems) >= MAX_TREE_PROBLEMS:
            break
    if problems:
        raise ActionError("; ".join(problems[:MAX_TREE_PROBLEMS]) + f" — delete {root} to have it rebuilt, "
                          "and find out who changed it")


def check_private_build(parent: str, build: str) -> None:
    """A reused worker build: the directories above its parent, the parent, and everything in it
    (check_private_ancestors, check_private_dirs, check_private_tree). Raises ActionError or OSError."""
    check_private_ancestors(parent)
    check_private_dirs([parent])
    check_private_tree(build)


def check_private_ancestors(path: str) -> None:
    """The directories above a worker build's parent: each root's or this user's, and group/other-writable only
    with the sticky bit (/tmp), or another user could rename the workdir away and put their own in its place."""
    euid = os.geteuid()
    problems = []
    here, parent = None, os.path.dirname(os.path.realpath(path))
    while parent != here:
        here, parent = parent, os.path.dirname(parent)
        st = os.stat(here)
        if st.st_uid not in (0, euid):
            problems.append(f"{here} (above the workdir) is owned by uid {st.st_uid}, neither root nor uid {euid}")
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problems.append(f"{here} (above the workdir) is writable by group or others without the sticky bit "
                            f"(mode {stat.S_IMODE(st.st_mode):04o}): anyone could replace the workdir")
    if problems:
        raise ActionError("; ".join(problems) + " — choose a workdir (hosts.<role>.workdir) below directories "
                          "only you and root can change")


def _raise(exc: OSError) -> None:
    raise exc


# What zcorch.provision.deploy names its directories: worker-<16 hex> and .tmp-worker-<16 hex>-<8 hex>.
BUILD_NAME = re.compile(r"worker-[0-9a-f]{16}")
TMP_BUILD_NAME = re.compile(r"\.tmp-worker-[0-9a-f]{16}-[0-9a-f]{8}")


def finalize_build(tmp: str, final: str, marker: str, text: str, keep: int) -> None:
    """After a worker build in `tmp`: check it, write the completion marker, rename it to `final`,
    prune all but the `keep` newest marked worker-<hash> builds and our temp directories older than an hour."""
    if not glob.glob(os.path.join(tmp, "zcorch", "_native*.so")):
        raise ActionError(f"the build printed no error but produced no zcorch/_native*.so in {tmp}")
    with open(os.path.join(tmp, marker), "w") as f:
        f.write(text)
    # What the build made follows the login's umask (002 on user-private-group systems): no group/other
    # write anywhere, or the reuse check (check_private_tree) would refuse it.
    for top, dirs, files in os.walk(tmp):
        for path in [top] + [os.path.join(top, n) for n in dirs + files]:
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022:
                os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)
    if os.path.isdir(final) and not os.path.exists(os.path.join(final, marker)):
        aside = f"{final}.old-{os.getpid()}"
        os.rename(final, aside)          # an incomplete directory: replace it
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(tmp, final)
    except OSError:
        if not os.path.exists(os.path.join(final, marker)):
            raise
        shutil.rmtree(tmp, ignore_errors=True)   # a concurrent deploy of the same hash won the race
    parent = os.path.dirname(final)
    check_private_build(parent, final)           # before it is used, and before pruning anything there
    # The workdir may be a user's home: only our own names, and builds only with our marker, are ours.
    names = os.listdir(parent)
    builds = sorted((os.path.join(parent, n) for n in names if BUILD_NAME.fullmatch(n)),
                    key=os.path.getmtime, reverse=True)
    builds = [b for b in builds if b != final and os.path.isfile(os.path.join(b, marker))]
    for old in builds[max(keep - 1, 0):]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in (os.path.join(parent, n) for n in names if TMP_BUILD_NAME.fullmatch(n)):
        if os.path.isdir(stale) and os.path.getmtime(stale) < os.path.getmtime(final) - 3600:
            shutil.rmtree(stale, ignore_errors=True)


# -- metadata ----------------------------------------------------------------------------------

def _read(path: str) -> "Tuple[Optional[str], Optional[str]]":
    """(stripped text, None) or (None, why it could not be read)."""
    try:
        with open(path) as f:
            return f.read().strip(), None
    except OSError as exc:
        return None, f"{path}: {exc.strerror or exc}"


def _run(argv: "List[str]") -> "Tuple[Optional[str], Optional[str]]":
    """(stdout, None) of a successful command, or (None, why not)."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{argv[0]}: {exc}"
    if p.returncode != 0:
        return None, f"{' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[:200]}"
    return p.stdout, None


def interface_for_address(addrs: "List[Dict[str, Any]]", address: str) -> "Optional[str]":
    """Name of the interface holding `address` in `ip -j addr` output, else None."""
    for link in addrs:
        for info in link.get("addr_info", []):
            if info.get("local") == address:
                return link.get("ifname")
    return None


def interface_kind(name: str) -> "Tuple[Optional[str], Optional[str]]":
    """(kind, None) of interface `name`, or (None, why not): its linkinfo kind (veth, bridge, bond...),
    "loopback" for lo, "device" for a plain device (a physical NIC). On loopback and veth the kernel copies
    every MSG_ZEROCOPY send (the report says so next to the zero-copy verdicts)."""
    out, w = _run(["ip", "-j", "-d", "link", "show", "dev", name])
    if out is None:
        return None, w
    try:
        links = json.loads(out)
    except ValueError as exc:
        return None, f"ip -j -d link: {exc}"
    if not links:
        return None, None
    kind = (links[0].get("linkinfo") or {}).get("info_kind")
    return kind or ("loopback" if links[0].get("link_type") == "loopback" else "device"), None


# -- io_uring zero-copy receive (zcrx): recorded per data interface, never run ----------------------

ZCRX_KERNEL = (6, 15)
_ETHTOOL_FIX = "apt-get install ethtool"


def kernel_version(release: str) -> "Tuple[int, ...]":
    """(6, 18) of "6.18.44-fc-v669"; () if the release does not start with numbers."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else ()


def parse_ethtool_feature(text: str, label: str) -> "Optional[str]":
    """The value of a `Label: value` line of ethtool output ("on", "off", "n/a", ...), None without one.
    Works for `ethtool -g` ("TCP data split:") and `ethtool -k` ("ntuple-filters:", "[fixed]" dropped)."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == label.lower():
            return value.split("[")[0].strip() or None
    return None


def zcrx_verdict(facts: "Dict[str, Any]") -> "Tuple[Optional[bool], List[str]]":
    """Pure: (True: the interface could do zcrx now, False: it cannot, None: unknown; the reasons). zcrx needs
    the kernel feature with io_uring allowed, a NIC whose driver splits headers from payload (`tcp-data-split`)
    and flow steering (ntuple filters) to put the flow on io_uring's queue: virtual links never can."""
    name, kind = facts.get("interface"), facts.get("kind")
    if kind != "physical":
        return False, [f"{name} is a {kind or 'virtual'} link: no NIC with header/data split"]
    why: "List[str]" = []
    if facts.get("kernel") is False:
        why.append(f"kernel {facts.get('kernel_release')} has no io_uring zcrx "
                   f"(Linux {'.'.join(map(str, ZCRX_KERNEL))} or later)")
    if facts.get("io_uring_disabled") not in (None, "0"):
        why.append(f"io_uring is disabled (kernel.io_uring_disabled={facts['io_uring_disabled']})")
    if facts.get("ethtool_error"):
        return (False if why else None), why + [f"unknown: {facts['ethtool_error']}"]
    split, ntuple = facts.get("tcp_data_split"), facts.get("ntuple")
    if split in (None, "n/a", "unknown"):
        why.append(f"driver {facts.get('driver')} reports no TCP header/data split (ethtool -g {name})")
    elif split != "on":
        why.append(f"TCP header/data split is {split} (ethtool -G {name} tcp-data-split on)")
    if ntuple != "on":
        why.append(f"flow steering (ntuple filters) is {ntuple or 'not reported'} (ethtool -K {name} ntuple on)")
    return not why, why


def zcrx_support(ifname: "Optional[str]") -> "Dict[str, Any]":
    """Whether io_uring zero-copy receive could run on the data interface `ifname` (zcrx_verdict):
    {"interface", "kind" (loopback|physical|<ip link kind>), "driver", "kernel_release", "kernel",
    "io_uring_disabled", "tcp_data_split", "ntuple", "possible" (true/false/null), "why" [...]}."""
    release = platform.release()
    facts: "Dict[str, Any]" = {"interface": ifname, "kind": None, "driver": None, "kernel_release": release,
                               "kernel": kernel_version(release) >= ZCRX_KERNEL,
                               "io_uring_disabled": _read("/proc/sys/kernel/io_uring_disabled")[0],
                               "tcp_data_split": None, "ntuple": None}
    if ifname:
        out, w = _run(["ip", "-d", "-j", "link", "show", "dev", ifname])
        link = (json.loads(out) or [{}])[0] if out else {}
        kind = (link.get("linkinfo") or {}).get("info_kind")
        if link.get("link_type") == "loopback" or "LOOPBACK" in (link.get("flags") or []):
            kind = "loopback"
        driver = None
        with suppress(OSError):
            driver = os.path.basename(os.readlink(f"/sys/class/net/{ifname}/device/driver"))
        facts["driver"] = driver
        facts["kind"] = kind or ("physical" if driver else ("unknown" if out is None else "virtual"))
        if facts["kind"] == "physical":
            if shutil.which("ethtool") is None:
                facts["ethtool_error"] = f"ethtool is not installed ({_ETHTOOL_FIX})"
            else:
                rings, w1 = _run(["ethtool", "-g", ifname])
                feats, w2 = _run(["ethtool", "-k", ifname])
                facts["tcp_data_split"] = parse_ethtool_feature(rings or "", "TCP data split")
                facts["ntuple"] = parse_ethtool_feature(feats or "", "ntuple-filters")
                if w1 or w2:
                    facts["ethtool_error"] = w1 or w2
    possible, why = zcrx_verdict(facts)
    facts["possible"], facts["why"] = possible, why
    return facts


# -- host facts beyond kernel, CPU and link (what a lab chasing a change asks first, as pyperf records) -----

class _Unavailable(Exception):
    """A host fact that cannot be read here: recorded as {"unavailable": why}, never guessed."""


def parse_ethtool_rings(text: str) -> "Dict[str, int]":
    """Pure: the current ring sizes of `ethtool -g` output ({"rx": 256, "tx": 256, ...}: the numeric lines of
    its "Current hardware settings" section, lower-cased); {} without that section."""
    rings: "Dict[str, int]" = {}
    current = False
    for line in text.splitlines():
        if line.strip().lower().startswith("current hardware settings"):
            current = True
            continue
        if current and line.strip().endswith(":") and not line.startswith((" ", "\t")):
            break  # the next section
        name, sep, value = line.partition(":")
        if current and sep and value.strip().isdigit():
            rings[name.strip().lower().replace(" ", "_")] = int(value.strip())
    return rings


def irqs_of_interface(interrupts: str, ifname: str) -> "List[str]":
    """Pure: the IRQ numbers whose /proc/interrupts line names `ifname` (its queues: "eth0-TxRx-3", "eth0")."""
    pattern = re.compile(r"(^|[\s,])" + re.escape(ifname) + r"($|[-_@:\s,])")
    irqs = []
    for line in interrupts.splitlines()[1:]:
        number, sep, rest = line.partition(":")
        if sep and number.strip().isdigit() and pattern.search(rest):
            irqs.append(number.strip())
    return irqs


class _FactReader:
    """Reads HOST_FACTS of one data interface: /proc and /sys below `root` (a fixture tree in tests), the
    commands (`ethtool`, `ip`) once each, their answer or why not kept for every fact they give."""

    def __init__(self, ifname: "Optional[str]", no_interface: str = "", root: str = "/"):
        self.ifname, self.no_interface, self.root = ifname, no_interface, root
        self._runs: "Dict[Tuple[str, ...], Tuple[Optional[str], Optional[str]]]" = {}

    def path(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def read(self, path: str) -> str:
        text, why = _read(self.path(path))
        if text is None:
            raise _Unavailable(why)
        return text

    def iface(self) -> str:
        if not self.ifname:
            raise _Unavailable(self.no_interface or "no data interface")
        return self.ifname

    def run(self, *argv: str) -> str:
        if argv not in self._runs:
            if shutil.which(argv[0]) is None:
                self._runs[argv] = None, f"{argv[0]} is not installed" + (
                    f" ({_ETHTOOL_FIX})" if argv[0] == "ethtool" else "")
            else:
                self._runs[argv] = _run(list(argv))
        out, why = self._runs[argv]
        if out is None:
            raise _Unavailable(why)
        return out

    def ethtool_field(self, option: str, label: str) -> str:
        value = parse_ethtool_feature(self.run("ethtool", option, self.iface()), label)
        if value is None:
            raise _Unavailable(f"ethtool {option} {self.iface()} reports no {label}")
        return value

    def offload(self, label: str) -> str:
        """on/off of an `ethtool -k` feature ("[fixed]" and "[requested on]" dropped)."""
        return self.ethtool_field("-k", label).split()[0]

    def device(self, leaf: str) -> str:
        """A file of the data NIC's device in sysfs; virtual links (veth, lo, bridges) have none."""
        path = f"/sys/class/net/{self.iface()}/device"
        if not os.path.exists(self.path(path)):
            raise _Unavailable(f"{self.iface()} has no device in sysfs (a virtual link)")
        return self.read(f"{path}/{leaf}")

    def driver(self) -> str:
        try:
            return self.ethtool_field("-i", "driver")
        except _Unavailable as why:
            try:
                return os.path.basename(os.readlink(self.path(f"/sys/class/net/{self.iface()}/device/driver")))
            except OSError:
                raise _Unavailable(f"{why}; no /sys/class/net/{self.iface()}/device/driver") from None

    def rings(self) -> "Dict[str, int]":
        rings = parse_ethtool_rings(self.run("ethtool", "-g", self.iface()))
        if not rings:
            raise _Unavailable(f"ethtool -g {self.iface()} reports no current ring sizes")
        return rings

    def qdisc(self) -> str:
        links = json.loads(self.run("ip", "-j", "link", "show", "dev", self.iface()) or "[]")
        qdisc = (links or [{}])[0].get("qdisc")
        if not qdisc:
            raise _Unavailable(f"ip -j link show dev {self.iface()} names no qdisc")
        return qdisc

    def governor(self) -> str:
        found = sorted(glob.glob(self.path("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")))
        if not found:
            raise _Unavailable("no /sys/devices/system/cpu/cpu*/cpufreq (no cpufreq driver: a VM or a fixed clock)")
        # one value when every CPU agrees (the usual case), else each distinct one
        return ",".join(dict.fromkeys(self.read(p[len(self.root.rstrip("/")):]) for p in found))

    def boost(self) -> str:
        try:
            return {"1": "on", "0": "off"}.get(self.read("/sys/devices/system/cpu/cpufreq/boost"), "?")
        except _Unavailable as why:
            try:  # intel_pstate says it the other way round
                return {"0": "on", "1": "off"}[self.read("/sys/devices/system/cpu/intel_pstate/no_turbo")]
            except (_Unavailable, KeyError):
                raise _Unavailable(f"{why}; no /sys/devices/system/cpu/intel_pstate/no_turbo") from None

    def selected(self, path: str) -> str:
        """The [bracketed] choice of a sysfs list ("always [madvise] never" -> "madvise")."""
        text = self.read(path)
        m = re.search(r"\[([^\]]+)\]", text)
        return m.group(1) if m else text

    def irq_affinity(self) -> "Dict[str, str]":
        irqs = irqs_of_interface(self.read("/proc/interrupts"), self.iface())
        if not irqs:
            raise _Unavailable(f"no IRQ named after {self.iface()} in /proc/interrupts (a virtual link has none)")
        return {irq: self.read(f"/proc/irq/{irq}/smp_affinity_list") for irq in irqs}


# One row per host fact: (key in meta.json's hosts.<role>.host_facts, how it is read, what it is, reader).
# docs/experiment-files.md's table of them is generated from here (render_host_facts_docs).
HOST_FACTS: "Tuple[Tuple[str, str, str, Callable[[_FactReader], Any]], ...]" = (
    ("nic_driver", "`ethtool -i IF` driver, else the link /sys/class/net/IF/device/driver",
     "driver of the data NIC", lambda r: r.driver()),
    ("nic_firmware", "`ethtool -i IF` firmware-version", "firmware of the data NIC",
     lambda r: r.ethtool_field("-i", "firmware-version")),
    ("gso", "`ethtool -k IF` generic-segmentation-offload", "GSO: on/off",
     lambda r: r.offload("generic-segmentation-offload")),
    ("gro", "`ethtool -k IF` generic-receive-offload", "GRO: on/off",
     lambda r: r.offload("generic-receive-offload")),
    ("tso", "`ethtool -k IF` tcp-segmentation-offload", "TSO: on/off",
     lambda r: r.offload("tcp-segmentation-offload")),
    ("lro", "`ethtool -k IF` large-receive-offload", "LRO: on/off",
     lambda r: r.offload("large-receive-offload")),
    ("rings", "`ethtool -g IF` current hardware settings", "ring sizes: {\"rx\": N, \"tx\": N, ...}",
     lambda r: r.rings()),
    ("qdisc", "`ip -j link show dev IF` qdisc", "root queueing discipline of the data link", lambda r: r.qdisc()),
    ("cpu_governor", "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
     "CPU frequency governor (each distinct one, comma-separated)", lambda r: r.governor()),
    ("cpu_boost", "/sys/devices/system/cpu/cpufreq/boost, else intel_pstate/no_turbo", "CPU boost (turbo): on/off",
     lambda r: r.boost()),
    ("smt", "/sys/devices/system/cpu/smt/control", "SMT: on, off, forceoff, notsupported, ...",
     lambda r: r.read("/sys/devices/system/cpu/smt/control")),
    ("kernel_cmdline", "/proc/cmdline", "kernel command line (mitigations, isolcpus, ...)",
     lambda r: r.read("/proc/cmdline")),
    ("irq_affinity", "/proc/irq/N/smp_affinity_list of each IRQ /proc/interrupts names after IF",
     "CPUs of the data NIC's queue interrupts: {\"IRQ\": \"CPU list\"}", lambda r: r.irq_affinity()),
    ("thp", "/sys/kernel/mm/transparent_hugepage/enabled (the [selected] value)", "transparent huge pages",
     lambda r: r.selected("/sys/kernel/mm/transparent_hugepage/enabled")),
    ("nic_numa_node", "/sys/class/net/IF/device/numa_node", "NUMA node of the data NIC (-1: none)",
     lambda r: int(r.device("numa_node"))),
)


def host_facts(ifname: "Optional[str]", no_interface: str = "", root: str = "/") -> "Dict[str, Any]":
    """Every HOST_FACTS key -> its value here, or {"unavailable": why} (`no_interface`: why there is no data
    interface, when `ifname` is None). `root`: where /proc and /sys are (a fixture tree in tests)."""
    reader = _FactReader(ifname, no_interface, root)
    facts: "Dict[str, Any]" = {}
    for key, _how, _what, read in HOST_FACTS:
        try:
            facts[key] = read(reader)
        except _Unavailable as why:
            facts[key] = {"unavailable": str(why)}
        except ValueError as exc:  # a file or answer of an unexpected shape: said, not guessed around
            facts[key] = {"unavailable": f"unexpected value: {exc}"}
    return facts


HOST_FACTS_DOC = ("<!-- host-facts:begin -->", "<!-- host-facts:end -->")


def render_host_facts_docs(text: str) -> str:
    """`text` (docs/experiment-files.md) with the markdown table of HOST_FACTS between HOST_FACTS_DOC's
    markers (tests/test_hostfacts.py checks the file); ValueError without them."""
    begin, end = HOST_FACTS_DOC
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"the document has no `{begin}` ... `{end}` block")
    rows = ["| key | what | how it is read |", "|---|---|---|"]
    rows += [f"| `{key}` | {what} | {how} |" for key, how, what, _ in HOST_FACTS]
    return text[:start + len(begin)] + "\n" + "\n".join(rows) + "\n" + text[stop:]


def host_metadata(address: str, path: str, sysctls: "Sequence[str]",
                  programs: "Sequence[str]" = ()) -> "Dict[str, Any]":
    """What shaped the numbers on this host. Anything unreadable is null, with why in meta["why_null"].

    address: the data address (its interface's MTU and speed are recorded); path: the sink, whose
    filesystem (nearest existing parent) is recorded; sysctls: dotted names read from /proc/sys; programs:
    the baseline kinds' tools whose `--version` first line is recorded in meta["versions"] (with the compiler's).
    """
    meta: "Dict[str, Any]" = {"why_null": {}}
    why = meta["why_null"]
    u = platform.uname()
    meta["hostname"] = u.node
    meta["kernel"] = {"release": u.release, "version": u.version, "machine": u.machine}
    cpuinfo, w = _read("/proc/cpuinfo")
    model = next((line.split(":", 1)[1].strip() for line in (cpuinfo or "").splitlines()
                  if line.split(":")[0].strip() in ("model name", "Model", "cpu model")), None)
    meta["cpu_model"] = model
    if model is None:
        why["cpu_model"] = w or "no model name in /proc/cpuinfo"
    meta["cpu_count"] = os.cpu_count()
    try:
        meta["cpu_affinity_count"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        meta["cpu_affinity_count"] = None
    meminfo, w = _read("/proc/meminfo")
    meta["mem_total_bytes"] = next((int(line.split()[1]) * 1024 for line in (meminfo or "").splitlines()
                                    if line.startswith("MemTotal:")), None)
    if meta["mem_total_bytes"] is None:
        why["mem_total_bytes"] = w or "no MemTotal in /proc/meminfo"
    # The data interface: the one that holds the data address.
    iface: "Dict[str, Any]" = {"address": address, "name": None, "mtu": None, "speed_mbps": None, "kind": None}
    out, w = _run(["ip", "-j", "addr"])
    if out is None:
        why["interface"] = w
    else:
        iface["name"] = interface_for_address(json.loads(out), address)
        if iface["name"] is None:
            why["interface"] = f"no interface holds {address} (ip -j addr)"
        else:
            mtu, w = _read(f"/sys/class/net/{iface['name']}/mtu")
            iface["mtu"] = int(mtu) if mtu else None
            if mtu is None:
                why["interface.mtu"] = w
            speed, w = _read(f"/sys/class/net/{iface['name']}/speed")
            if speed is not None and speed.lstrip("-").isdigit() and int(speed) > 0:
                iface["speed_mbps"] = int(speed)
            else:
                # veth, lo and some virtual NICs have no link speed: EINVAL or -1.
                why["interface.speed_mbps"] = w or f"speed reported as {speed!r} (virtual link?)"
            iface["kind"], w = interface_kind(iface["name"])
            if w:
                why["interface.kind"] = w
    meta["interface"] = iface
    # whether this kernel has Linux software RAID (md): a study of md arrays is untestable without it
    meta["md_driver"] = os.path.exists("/proc/mdstat")
    # per data interface: could io_uring zero-copy receive (zcrx) run there? (no mode uses it)
    meta["zcrx"] = {iface["name"]: zcrx_support(iface["name"])} if iface["name"] else {}
    meta["host_facts"] = host_facts(iface["name"], why.get("interface", ""))
    meta["boot_id"], w = _read("/proc/sys/kernel/random/boot_id")
    if w:
        why["boot_id"] = w
    meta["sysctls"] = {}
    for name in sysctls:
        val, w = _read("/proc/sys/" + name.replace(".", "/"))
        meta["sysctls"][name] = " ".join(val.split()) if val is not None else None
        if val is None:
            why["sysctls." + name] = w
    meta["sink_path"] = path
    meta["sink_mount"] = None
    if path:
        probe_path = path
        while probe_path and not os.path.exists(probe_path):
            probe_path = os.path.dirname(probe_path)
        out, w = _run(["findmnt", "-J", "-T", probe_path or "/"])
        if out is None:
            why["sink_mount"] = w
        else:
            meta["sink_mount"] = (json.loads(out).get("filesystems") or [None])[0]
    meta["python"] = {"version": platform.python_version(), "executable": sys.executable}
    meta["versions"] = {}
    for key, program in (("compiler", "cc"), *((p, p) for p in programs)):
        out, w = _run([program, "--version"])
        meta["versions"][key] = None if out is None else (out.strip().splitlines() or [""])[0]
        if w:
            why["versions." + key] = w
    meta["euid"] = os.geteuid()
    return meta


# -- {scratch} ----------------------------------------------------------------------------------

def prepare_scratch(workdir: str, subdirs: "Sequence[str]" = ()) -> "Dict[str, Any]":
    """Create `<workdir>/scratch` (mode 0700, whatever the umask; `~` expanded here) and `subdirs` under it.
    Returns {"path" (its real path: no link in it), "created", "mode"} plus "error" when the directory cannot
    be used: not a directory, owned by another user, not writable."""
    workdir = os.path.expanduser(workdir)
    path = os.path.join(workdir, "scratch")
    out: "Dict[str, Any]" = {"path": path, "created": False}
    try:
        os.makedirs(workdir, exist_ok=True)
        with suppress(FileExistsError):
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask
            out["created"] = True
        st = os.stat(path)
        out["mode"] = "%04o" % stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode):
            out["error"] = "exists and is not a directory"
        elif st.st_uid != os.geteuid():
            out["error"] = (f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}): another user "
                            "could read or replace the files")
        elif not os.access(path, os.W_OK | os.X_OK):
            out["error"] = "is not writable by this user"
        else:
            for sub in subdirs:
                os.makedirs(os.path.join(path, sub), 0o700, exist_ok=True)
            # The workers follow no link in a source's or sink's path: they get the directory's real path
            # (a workdir under a linked /home still works; a link put into it later is refused).
            out["path"] = os.path.realpath(path)
    except OSError as exc:
        out["error"] = f"cannot be created: {exc}"
    return out


# -- dd baseline --------------------------------------------------------------------------------

# A SIGTERM/SIGINT while subprocess.Popen is still starting dd would leave the job without the Popen to
# kill: dd would go on writing an unlinked file. _exit_on_signals' handler holds such a signal until the
# Popen exists (_SPAWN), and _dd then kills dd and ends the job with it.
_SPAWN: "Dict[str, Any]" = {"starting": False, "held": None}


def _dd(args: "List[str]") -> "Tuple[subprocess.CompletedProcess, float]":
    """(finished dd, its monotonic start time)."""
    t0 = time.monotonic()
    _SPAWN.update(starting=True, held=None)
    try:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, LC_ALL="C"))  # dd's summary line in a parseable language
    finally:
        _SPAWN["starting"] = False
    with proc:
        try:
            if _SPAWN["held"] is not None:
                raise SystemExit(128 + _SPAWN["held"])
            _, stderr = proc.communicate()
        except BaseException:
            proc.kill()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, None, stderr), t0


def dd_write_argv(path: str, bs: "int | str", count: "int | str", fdatasync: bool = False) -> "List[str]":
    """The timed write of the dd baseline (also what a dry run shows): dd only fills the file dd_baseline
    created (conv=notrunc); fdatasync: dd flushes the data before it ends, inside its own timing."""
    return ["dd", "if=/dev/zero", f"of={path}", f"bs={bs}", f"count={count}",
            "conv=notrunc,fdatasync" if fdatasync else "conv=notrunc"]


def dd_read_argv(path: str, bs: "int | str", count: "int | str") -> "List[str]":
    """The read back of the dd baseline's file."""
    return ["dd", f"if={path}", "of=/dev/null", f"bs={bs}", f"count={count}"]


def remove_stale_dd_files(directory: str) -> "List[str]":
    """Remove the files of dd jobs that were SIGKILLed (no handler runs then): `.zcorch-dd-PID-HEX`
    regular files of this user whose PID is gone. Returns the paths removed."""
    removed = []
    with suppress(OSError):
        for name in os.listdir(directory):
            m = re.match(r"^\.zcorch-dd-(\d+)-[0-9a-f]{16}$", name)
            if not m:
                continue
            path = os.path.join(directory, name)
            with suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not os.path.exists(f"/proc/{m.group(1)}"):
                    os.unlink(path)
                    removed.append(path)
    return removed


DD_OPTIONS = ("--no-sync", "--fdatasync", "--warmup")   # the `dd` action's options (DdKind.job_args)


def _dd_file(directory: str, made: "List[str]") -> str:
    """A new file for one dd write: created exclusively under a random name (O_EXCL|O_NOFOLLOW, 0600: never
    someone else's file or link), added to `made` (removed by dd_baseline whatever happens)."""
    path = os.path.join(directory, f".zcorch-dd-{os.getpid()}-{os.urandom(8).hex()}")
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    made.append(path)
    return path


def _dd_timed_write(path: str, argv: "List[str]", sync: bool, timed: str) -> "Dict[str, Any]":
    """One dd write after an untimed sync (as the seeds' `sync; time {...}`), with `sync` inside the timing
    or not; the data is synced afterwards either way, untimed, so that nothing of it is left for what follows."""
    os.sync()
    p, t0 = _dd(argv)
    if p.returncode == 0 and sync:
        os.sync()
    wall = time.monotonic() - t0
    if not sync:
        os.sync()
    return {"argv": p.args, "returncode": p.returncode, "stderr": p.stderr, "wall_s": wall, "timed": timed,
            "path": path}


def dd_baseline(directory: str, bs: str, count: str, sync: bool = True, fdatasync: bool = False,
                warmup: bool = False) -> "Dict[str, Any]":
    """Time `dd; sync` writing a file in `directory` (after an untimed sync, as the seeds'
    `sync; time { dd ...; sync; }`), then its read back after dropping the page cache when allowed.

    sync=False times dd alone; fdatasync: also a write with `conv=fdatasync`; warmup: first an untimed write
    of the same size (a fresh filesystem's first write pays for what later ones do not). Returns {"path",
    "stale_removed", ["warmup"], "write", "read", ["fdatasync"]}, each step only when the one before succeeded,
    and only if bs × count fits the free space. Every file is removed, also on SIGTERM/SIGINT (and after
    SIGKILL by the next job)."""
    path = os.path.join(directory, ".zcorch-dd-FILE")   # (named when created)
    out: "Dict[str, Any]" = {"path": path, "stale_removed": remove_stale_dd_files(directory)}
    write_argv = dd_write_argv(path, bs, count)
    timed = (f"dd if=/dev/zero of=FILE bs={bs} count={count}"
             + ("; sync (after an untimed sync)" if sync else " (after an untimed sync; no sync timed)"))
    made: "List[str]" = []
    old_handlers = _exit_on_signals()

    def refused(stderr: str) -> "Dict[str, Any]":
        return {"argv": write_argv, "returncode": 1, "wall_s": 0.0, "timed": timed, "stderr": stderr}

    def remove(p: str) -> None:
        with suppress(OSError):
            os.unlink(p)
        made.remove(p)

    try:
        try:
            st = os.statvfs(directory)
        except OSError:
            st = None  # dd reports a missing directory in its own words
        if st is not None and int(bs) * int(count) > st.f_bavail * st.f_frsize:
            out["write"] = refused(f"dd: not run: {int(bs) * int(count)} bytes do not fit the "
                                   f"{st.f_bavail * st.f_frsize} bytes free in {directory}\n")
            return out
        try:
            if warmup:
                w = _dd_file(directory, made)
                out["warmup"] = _dd_timed_write(w, dd_write_argv(w, bs, count), True,
                                                f"dd if=/dev/zero of=FILE bs={bs} count={count}; sync (a warm-up "
                                                "write, removed before the timed one)")
                remove(w)
                if out["warmup"]["returncode"] != 0:
                    return out
            path = out["path"] = _dd_file(directory, made)
        except OSError as exc:
            out["write"] = refused(f"dd: failed to open '{exc.filename or path}': {exc.strerror}\n")
            return out
        out["write"] = _dd_timed_write(path, dd_write_argv(path, bs, count), sync, timed)
        if out["write"]["returncode"] != 0:
            return out
        cached, why = True, None
        if os.geteuid() == 0:
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
                cached = False
            except OSError as exc:
                why = f"drop_caches failed: {exc}"
        else:
            why = "not root: page cache not dropped, the read is (partly) cached"
        p, t0 = _dd(dd_read_argv(path, bs, count))
        out["read"] = {"argv": p.args, "returncode": p.returncode, "stderr": p.stderr,
                       "wall_s": time.monotonic() - t0, "cached": cached, "cache_note": why,
                       "timed": f"dd if=FILE of=/dev/null bs={bs} count={count}"}
        remove(path)
        if fdatasync:
            try:
                f_path = _dd_file(directory, made)
            except OSError as exc:
                out["fdatasync"] = refused(f"dd: failed to open '{exc.filename}': {exc.strerror}\n")
                return out
            out["fdatasync"] = _dd_timed_write(f_path, dd_write_argv(f_path, bs, count, fdatasync=True), False,
                                               f"dd if=/dev/zero of=FILE bs={bs} count={count} conv=fdatasync "
                                               "(after an untimed sync)")
    finally:
        for p_ in list(made):
            remove(p_)
        for signum, handler in old_handlers.items():
            signal.signal(signum, handler)
    return out


def _dd_action(args: "List[str]") -> None:
    """`dd DIR BS COUNT [--no-sync] [--fdatasync] [--warmup]`: dd_baseline's JSON."""
    opts = args[3:]
    unknown = [o for o in opts if o not in DD_OPTIONS]
    if unknown:
        raise _UsageError(f"dd: unknown option {unknown[0]!r} (known: {' '.join(DD_OPTIONS)})")
    _print_json(dd_baseline(args[0], args[1], args[2], sync="--no-sync" not in opts,
                                   fdatasync="--fdatasync" in opts, warmup="--warmup" in opts))


def _exit_on_signals() -> "Dict[int, Any]":
    """SIGTERM/SIGINT raise SystemExit (so `finally` blocks run; _dd kills its dd on the way out), held while
    _dd starts one; returns the previous handlers. Outside the main thread signals cannot be caught: {}."""
    def stop(signum: int, frame: Any) -> None:
        if _SPAWN["starting"]:
            _SPAWN["held"] = signum   # raised by _dd once it can kill what it started
            return
        raise SystemExit(128 + signum)
    old: "Dict[int, Any]" = {}
    with suppress(ValueError):
        for signum in (signal.SIGTERM, signal.SIGINT):
            old[signum] = signal.signal(signum, stop)
    return old


# -- filesystems --------------------------------------------------------------------------------

# struct loop_info64 is 232 bytes; lo_flags is the u32 at offset 52 (linux/loop.h).
_LOOP_GET_STATUS64, _LOOP_SET_STATUS64, _LO_FLAGS_AUTOCLEAR = 0x4C05, 0x4C04, 4


def set_loop_autoclear(devices: "Sequence[str]") -> None:
    """Let attached loop devices detach themselves on last close (LO_FLAGS_AUTOCLEAR): util-linux has no
    option for it on an attached device, hence the ioctls. Raises OSError."""
    for dev in devices:
        fd = os.open(dev, os.O_RDONLY)
        try:
            buf = bytearray(232)
            fcntl.ioctl(fd, _LOOP_GET_STATUS64, buf)
            struct.pack_into("<I", buf, 52, struct.unpack_from("<I", buf, 52)[0] | _LO_FLAGS_AUTOCLEAR)
            fcntl.ioctl(fd, _LOOP_SET_STATUS64, bytes(buf))
        finally:
            os.close(fd)


def open_exclusive(path: str) -> None:
    """Open a block device with O_EXCL and close it again: raises OSError (EBUSY) when someone holds it
    exclusively (a mount, also in another namespace, a btrfs/md member, swap)."""
    os.close(os.open(path, os.O_RDONLY | os.O_EXCL))


def _open_dir(name: str, parent: int, shown: str) -> int:
    """The directory `name` in `parent` (a descriptor), opened without following a link."""
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ActionError(f"{shown} is a symbolic link or not a directory: a filesystem is mounted only on a "
                              "directory reached without links") from None
        raise ActionError(f"{shown}: {exc.strerror or exc}") from None


def _mount_id(fd: int, st: "os.stat_result") -> "Tuple[str, Any]":
    """What says which mount a descriptor lies on: the kernel's mount id (/proc/self/fdinfo), else st_dev."""
    with suppress(OSError, ValueError), open(f"/proc/self/fdinfo/{fd}", encoding="ascii") as f:
        for line in f:
            if line.startswith("mnt_id:"):
                return "mnt_id", int(line.split()[1])
    return "st_dev", st.st_dev


def open_mount_target(root: str, mountpoint: str, create: bool = False) -> "List[int]":
    """Descriptors of `root` and of every directory from it down to `mountpoint` (the caller closes them), each
    opened from / without following a link and judged on what was opened: `root` is this user's alone; below it
    nothing is a mount point; the last one is an empty directory of this user. create: a missing directory
    below `root` is made (mkdir in the directory opened above it). ActionError names what is refused."""
    if not root.startswith("/") or os.path.normpath(root) != root or root == "/":
        raise ActionError(f"mount root {root!r} is not a plain absolute path below /")
    if not mountpoint.startswith(root + "/") or os.path.normpath(mountpoint) != mountpoint:
        raise ActionError(f"{mountpoint} is not beneath the mount root {root} (a filesystem is mounted only beneath "
                          "the run's own directories)")
    fds = [os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        here = ""
        for name in root.strip("/").split("/"):
            here += "/" + name
            fds.append(_open_dir(name, fds[-1], here))
        st = os.fstat(fds[-1])
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise ActionError(f"mount root {root} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):04o}: "
                              f"not this user's (uid {os.geteuid()}) alone, so what lies below it could be swapped")
        below = mountpoint[len(root) + 1:].split("/")
        for name in below:
            if name in ("", ".", ".."):
                raise ActionError(f"{mountpoint}: `{name}` is not a directory name")
            parent_st = os.fstat(fds[-1])
            here += "/" + name
            if create:
                with suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fds[-1])
            fds.append(_open_dir(name, fds[-1], here))
            st = os.fstat(fds[-1])
            if _mount_id(fds[-1], st) != _mount_id(fds[-2], parent_st):
                raise ActionError(f"{here} is a mount point already: a filesystem is mounted only on a plain "
                                  "directory of the run's own, never over another mount")
            if st.st_uid != os.geteuid():
                raise ActionError(f"{here} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})")
        if os.listdir(fds[-1]):
            raise ActionError(f"{mountpoint} is not empty: a filesystem mounted over it would hide what it holds")
        return fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def mkdir_beneath(root: str, path: str) -> "Dict[str, Any]":
    """`mkdir -p` of `path` beneath `root` as open_mount_target walks it (no link followed, no mount crossed, each
    directory this user's): the mountpoint's directories, made where they will be judged."""
    for fd in open_mount_target(root, path, create=True):
        os.close(fd)
    return {"made": path}


def mount_beneath(root: str, mountpoint: str, fstype: str, options: str, source: str) -> "Dict[str, Any]":
    """mount(8) of `source` (`-t FSTYPE [-o OPTIONS]`) on the directory open_mount_target opened: the target is
    given as that descriptor (/proc/self/fd/N, not canonicalized), so the kernel mounts on exactly what was
    judged, whatever a path names by then."""
    fds = open_mount_target(root, mountpoint)
    try:
        target = fds[-1]
        argv = ["mount", "--no-canonicalize", "-t", fstype] + (["-o", options] if options else [])
        argv += ["--", source, f"/proc/self/fd/{target}"]
        res = subprocess.run(argv, pass_fds=(target,), stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if res.returncode != 0:
            raise ActionError(f"mount of {source} on {mountpoint} failed (exit {res.returncode}): "
                              f"{(res.stderr or res.stdout).strip()}")
        return {"mounted": mountpoint, "source": source}
    finally:
        for fd in fds:
            os.close(fd)


# -- command line -------------------------------------------------------------------------------

class _UsageError(Exception):
    pass


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise _UsageError(f"{what} must be an integer, got {text!r}") from None


def _print_json(doc: "Dict[str, Any]") -> None:
    print(json.dumps(doc))


def _tool_args(args: "List[str]") -> "Tuple[List[str], List[str]]":
    """(ports, programs) of preflight's arguments: each program follows `--tool`."""
    ports: "List[str]" = []
    programs: "List[str]" = []
    it = iter(args)
    for a in it:
        if a == "--tool":
            programs.append(next(it, ""))
        else:
            ports.append(a)
    return ports, programs


def _preflight_action(args: "List[str]") -> None:
    # the optional groups come last, in this order: [--net-state DIR PREFIX] [--build WORKDIR NAME MARKER],
    # found by position (a --tool PROGRAM may be named like a flag)
    groups: "Dict[str, List[str]]" = {}
    for flag, n, problem in (("--build", 3, "--build WORKDIR NAME MARKER must be the last arguments"),
                             ("--net-state", 2, "--net-state DIR PREFIX must come last (before --build)")):
        if flag in args:
            if len(args) < n + 2 or args[-n - 1] != flag:
                raise _UsageError(problem)
            groups[flag], args = args[-n:], args[:-n - 1]
    ports, programs = _tool_args(args[1:])
    facts = preflight_facts(args[0], [_int(p, "PORT") for p in ports], programs)
    if "--net-state" in groups:
        facts["net_state"] = net_state_present(*groups["--net-state"])
    if "--build" in groups:
        facts["build"] = build_state(*groups["--build"])
    _print_json(facts)


def net_state_present(state_dir: str, prefix: str) -> "Optional[bool]":
    """Whether the network state directory (`~` of this host) holds an entry named PREFIX... (a killed
    sweep's network state, zcorch.worker.netcfg: of any namespace, a link or not): False lets the controller
    skip reading and restoring it, True or None (cannot tell) has it read and judged as always."""
    try:
        # root's is host-wide (zcorch.worker.netcfg.state_path): this namespace's file there
        if os.geteuid() == 0 and os.path.lexists(f"/run/zcorch/{prefix}{os.stat('/proc/self/ns/net').st_ino}.json"):
            return True
        return any(name.startswith(prefix) for name in os.listdir(os.path.expanduser(state_dir)))
    except FileNotFoundError:
        return False
    except OSError:
        return None


def metadata_action(args: "List[str]") -> "Dict[str, Any]":
    """host_metadata of the `metadata` action's arguments (ADDRESS PATH [SYSCTL...] [--tool PROGRAM...]);
    also what `zcorch worker info --metadata ...` runs (zcorch.worker.cli)."""
    if len(args) < 2:
        raise _UsageError("usage: metadata ADDRESS PATH [SYSCTL...] [--tool PROGRAM...]")
    return host_metadata(args[0], args[1], *_tool_args(args[2:]))


# name -> (usage of its arguments, least and most argument count (None: any), handler); a handler prints
# its answer, if any, and raises ActionError or OSError when the job failed
ACTIONS: "Dict[str, Tuple[str, int, Optional[int], Callable[[List[str]], None]]]" = {
    "preflight": ("ADDRESS [PORT...] [--tool PROGRAM...] [--net-state DIR PREFIX] [--build WORKDIR NAME MARKER]", 1,
                  None, _preflight_action),
    "cffi-dir": ("", 0, 0, lambda a: print(cffi_backend_dir())),
    "finalize": ("TMP FINAL MARKER TEXT KEEP", 5, 5, lambda a: finalize_build(*a[:4], _int(a[4], "KEEP"))),
    "private-dirs": ("DIR...", 1, None, check_private_dirs),
    "private-build": ("PARENT BUILD", 2, 2, lambda a: check_private_build(*a)),
    "metadata": ("ADDRESS PATH [SYSCTL...] [--tool PROGRAM...]", 2, None,
                 lambda a: _print_json(metadata_action(a))),
    "scratch": ("WORKDIR [SUBDIR...]", 1, None, lambda a: _print_json(prepare_scratch(a[0], a[1:]))),
    "dd": ("DIR BS COUNT [--no-sync] [--fdatasync] [--warmup]", 3, 3 + len(DD_OPTIONS), _dd_action),
    "loop-autoclear": ("DEVICE...", 1, None, set_loop_autoclear),
    "open-excl": ("PATH", 1, 1, lambda a: open_exclusive(a[0])),
    "mkdir-beneath": ("ROOT PATH", 2, 2, lambda a: _print_json(mkdir_beneath(*a))),
    "mount-beneath": ("ROOT MOUNTPOINT FSTYPE OPTIONS SOURCE", 5, 5, lambda a: _print_json(mount_beneath(*a))),
}


def main(argv: "Optional[List[str]]" = None) -> int:
    """Run one action, e.g. `main(["scratch", "~/.cache/zcorch", "in"])`; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ACTIONS:
        usage = "".join(f"  {name} {spec[0]}".rstrip() + "\n" for name, spec in ACTIONS.items())
        sys.stderr.write((f"unknown action {args[0]!r}\n" if args else "")
                         + "usage: python -m zcorch.worker.remote ACTION ARGS...\n" + usage)
        return 2
    name, rest = args[0], args[1:]
    usage, least, most, handler = ACTIONS[name]
    try:
        if len(rest) < least or (most is not None and len(rest) > most):
            raise _UsageError(f"usage: {name} {usage}".rstrip())
        handler(rest)
        return 0
    except _UsageError as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 2
    except (ActionError, OSError) as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
