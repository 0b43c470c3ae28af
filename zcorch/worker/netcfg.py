"""Network configuration of a host's data link, run on the host with its own python: probe, apply, restore.

    python -m zcorch.worker.netcfg ACTION ARGS...      (localhost: the controller's own package)
    python - ACTION ARGS... < zcorch/worker/netcfg.py   (remote hosts: this file's text on stdin)

Actions (ACTIONS below; argv, never a shell; JSON answers on one line): probe, state, apply and restore.
Before anything changes, the previous MTU and sysctl values go to a state file per network namespace (root:
/run/zcorch/zcorch-net-<netns inode>.json, else under STATE_DIR), so a controller killed at any moment leaves
what `restore` needs. It is mode 0600 in a directory only this user can write, and read only when both are so,
never through a link: else `restore` would set values of someone else's choosing. Only the allow-list is
written (sysctl_refusal), judged here whatever the controller checked. Stdlib-only, importing nothing from
zcorch (fed to the host's interpreter as a plain file); no `typing` at run time.
"""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from contextlib import suppress
TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only
    from typing import Any, Dict, List, Optional, Tuple

STATE_PREFIX = "zcorch-net-"
HOST_DIR = "/run/zcorch"   # root's state file, beside the host-wide lease (zcorch.provision.fs_state.HOST_LEASE_DIR)
FORMAT = "zcorch-net-state"
CONGESTION = "net.ipv4.tcp_congestion_control"
SYSCTL_RE = re.compile(r"^net(\.[A-Za-z0-9_-]+)+$")
# The host-wide sysctls a `networks:` entry may set (docs/experiment-files.md "Networks"): socket buffers and TCP
# behaviour. None decides whether a packet reaches this host (no forwarding, neighbour, route, ARP, rp_filter,
# accept_* or conf.all/default keys), so the controller's SSH link keeps working whatever value is written.
HOST_WIDE_SYSCTLS = (
    "net.core.rmem_max", "net.core.wmem_max", "net.core.rmem_default", "net.core.wmem_default",
    "net.core.optmem_max", "net.core.netdev_max_backlog", "net.core.netdev_budget", "net.core.netdev_budget_usecs",
    "net.core.busy_read", "net.core.busy_poll",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_congestion_control", "net.ipv4.tcp_sack",
    "net.ipv4.tcp_timestamps", "net.ipv4.tcp_window_scaling", "net.ipv4.tcp_moderate_rcvbuf",
    "net.ipv4.tcp_autocorking", "net.ipv4.tcp_notsent_lowat", "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_limit_output_bytes", "net.ipv4.tcp_mtu_probing",
    "net.ipv4.tcp_ecn", "net.ipv4.tcp_min_tso_segs", "net.ipv4.tcp_tso_win_divisor",
)
# The data link's own keys: net.ipv4.conf.<data link>.*, net.ipv6.conf.<data link>.*
LINK_SYSCTL_RE = re.compile(r"^net\.ipv[46]\.conf\.([A-Za-z0-9_-]{1,15})\.[A-Za-z0-9_]+$")
IPV6_MIN_MTU = 1280   # below it the kernel deletes the link's IPv6 addresses (restoring the MTU does not re-add them)
IPV4_MIN_MTU = 68


class ActionError(Exception):
    """A job that cannot be done: main() prints the message on stderr and exits 1."""


def sysctl_path(name: str) -> str:
    """/proc/sys/net/ipv4/tcp_rmem of `net.ipv4.tcp_rmem` (only `net.` names: anything else is refused)."""
    if not SYSCTL_RE.match(name):
        raise ActionError(f"{name!r} is not a net.* sysctl name")
    return "/proc/sys/" + name.replace(".", "/")


def sysctl_refusal(name: str, dev: "Optional[str]") -> "Optional[str]":
    """Why `name` may not be changed (None: it may): it must be one of HOST_WIDE_SYSCTLS or a key of the data
    link `dev` itself (net.ipv4.conf.<dev>.*, net.ipv6.conf.<dev>.*). dev None: the link is not known yet (the
    plan), so any one interface's key passes, but never `all` or `default` (every interface, the SSH one too)."""
    if name in HOST_WIDE_SYSCTLS:
        return None
    m = LINK_SYSCTL_RE.match(name)
    if m and m.group(1) in ("all", "default"):
        return (f"`{name}` changes every interface ({m.group(1)}), the one the controller's SSH session rides on "
                "too: only the data link's own keys (net.ipv4.conf.<data link>.*) may be set")
    if m and dev is not None and m.group(1) != dev:
        return (f"`{name}` is a key of {m.group(1)}, not of the data link {dev}: only the data link's own keys "
                f"(net.ipv4.conf.{dev}.*, net.ipv6.conf.{dev}.*) may be set")
    if m:
        return None
    return (f"`{name}` is not a setting zcorch may change: only the data link's own keys "
            "(net.ipv4.conf.<data link>.*, net.ipv6.conf.<data link>.*) and the host-wide ones listed in "
            "docs/experiment-files.md (Networks: " + ", ".join(HOST_WIDE_SYSCTLS[:4]) + ", ...); neighbour, route, "
            "forwarding and other host-wide keys could cut the host off from the controller")


def read_sysctl(name: str) -> "Optional[str]":
    """The value with its whitespace collapsed (`4096 131072 6291456`), None when the file does not exist."""
    try:
        with open(sysctl_path(name)) as f:
            return " ".join(f.read().split())
    except FileNotFoundError:
        return None


def write_sysctl(name: str, value: str) -> None:
    with open(sysctl_path(name), "w") as f:
        f.write(str(value) + "\n")


def _ip(argv: "List[str]") -> str:
    try:
        p = subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ActionError(f"ip {' '.join(argv)}: {exc}") from None
    if p.returncode != 0:
        raise ActionError(f"ip {' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[:300]}")
    return p.stdout


def data_link(peer: str) -> str:
    """The interface carrying the route to `peer` (lo for a local address)."""
    routes = json.loads(_ip(["-j", "route", "get", peer]) or "[]")
    dev = routes[0].get("dev") if routes else None
    if not dev:
        raise ActionError(f"no route to {peer} (ip -j route get {peer})")
    return dev


def link_facts(dev: str) -> "Dict[str, Any]":
    """{"ifindex", "mtu", "kind" (veth, bridge..., loopback, or device), "min_mtu", "max_mtu"}."""
    links = json.loads(_ip(["-j", "-d", "link", "show", "dev", dev]) or "[]")
    link = links[0] if links else {}
    kind = (link.get("linkinfo") or {}).get("info_kind")
    if link.get("link_type") == "loopback":
        kind = "loopback"
    return {"ifindex": link.get("ifindex"), "mtu": link.get("mtu"), "kind": kind or "device",
            "min_mtu": link.get("min_mtu"), "max_mtu": link.get("max_mtu")}


def link_addresses(dev: str) -> "Dict[str, List[str]]":
    """{"inet": [...], "inet6": [...]}: the addresses on `dev` (an MTU below a family's minimum deletes them)."""
    out: "Dict[str, List[str]]" = {"inet": [], "inet6": []}
    for link in json.loads(_ip(["-j", "addr", "show", "dev", dev]) or "[]"):
        for a in link.get("addr_info") or []:
            if a.get("family") in out and a.get("local"):
                out[a["family"]].append(str(a["local"]))
    return out


def mtu_problem(dev: str, mtu: int, addresses: "Dict[str, List[str]]") -> "Optional[str]":
    """Why `mtu` would cost `dev` its addresses (None: it would keep them)."""
    for family, least, name in (("inet6", IPV6_MIN_MTU, "IPv6"), ("inet", IPV4_MIN_MTU, "IPv4")):
        if addresses.get(family) and mtu < least:
            return (f"mtu {mtu} is below {least}, the least {name} needs: the kernel would delete {dev}'s {name} "
                    f"addresses ({', '.join(addresses[family][:4])}) and restoring the MTU does not bring them back")
    return None


def _bare(address: str) -> str:
    """An address as `ip` prints it: no IPv6 zone (%eth0), no IPv4-mapped prefix (::ffff:10.0.0.1)."""
    address = address.split("%", 1)[0]
    return address[7:] if address.lower().startswith("::ffff:") and "." in address else address


def carrying_links(keep: "List[str]") -> "Dict[str, str]":
    """{interface: why}: the links the controller's SSH session rides on here, which no change may touch: the one
    holding SSH_CONNECTION's local end, the routes to its client and to each of `keep` (a local host: the other
    hosts' SSH peers), and every link under one of those (a VLAN's parent, a bridge's or bond's ports)."""
    out: "Dict[str, str]" = {}
    links = json.loads(_ip(["-j", "-d", "addr", "show"]) or "[]")
    by_name = {link.get("ifname"): link for link in links if link.get("ifname")}
    session = os.environ.get("SSH_CONNECTION", "").split()
    if len(session) == 4:
        client, server = _bare(session[0]), _bare(session[2])
        what = f"the controller's SSH session ({client} -> {server}:{session[3]})"
        for link in links:
            if any(a.get("local") == server for a in link.get("addr_info") or []):
                out.setdefault(link["ifname"], what)
        keep = [client] + list(keep)
    for address in keep:
        try:
            out.setdefault(data_link(_bare(address)), f"the route to {address}, which carries the controller's SSH "
                                                      "session" if address not in session else
                                                      f"the controller's SSH session (from {address})")
        except (ActionError, ValueError):
            continue
    todo = list(out)
    while todo:   # what lies under a carrying link carries it too
        name = todo.pop()
        link = by_name.get(name) or {}
        below = [link.get("link")] + [n for n, other in by_name.items() if other.get("master") == name]
        for lower in below:
            if lower and lower in by_name and lower not in out:
                out[lower] = f"{out[name]}, under {name}"
                todo.append(lower)
    return out


def netns_id() -> int:
    """The inode of this process's network namespace: one state file per namespace."""
    return os.stat("/proc/self/ns/net").st_ino


def in_init_netns() -> "Optional[bool]":
    """Whether this is the machine's initial network namespace (None: cannot tell). Outside it the kernel
    lets only net.ipv4.tcp_allowed_congestion_control be chosen as the default (EPERM otherwise)."""
    try:
        return os.stat("/proc/1/ns/net").st_ino == netns_id()
    except OSError:
        return None


def _congestion() -> "Dict[str, Any]":
    return {"congestion": read_sysctl(CONGESTION),
            "congestion_available": (read_sysctl("net.ipv4.tcp_available_congestion_control") or "").split(),
            "congestion_allowed": (read_sysctl("net.ipv4.tcp_allowed_congestion_control") or "").split(),
            "init_netns": in_init_netns()}


def probe(peer: str, args: "List[str]") -> "Dict[str, Any]":
    keep = [a[len("--keep="):] for a in args if a.startswith("--keep=")]
    sysctls = [a for a in args if not a.startswith("--keep=")]
    out: "Dict[str, Any]" = {"euid": os.geteuid(), "netns": netns_id(), "interface": None, "mtu": None,
                             "kind": None, "error": None, "addresses": {}, "carrying": {}}
    try:
        out["interface"] = data_link(peer)
        out.update({k: v for k, v in link_facts(out["interface"]).items() if k != "ifindex"})
        out["addresses"] = link_addresses(out["interface"])
        out["carrying"] = carrying_links(keep)
    except (ActionError, ValueError) as exc:
        out["error"] = str(exc)
    out.update(_congestion())
    out["sysctls"] = {name: read_sysctl(name) for name in sysctls}
    # In a network namespace the machine-wide ones (net.core.rmem_max...) are visible but read-only.
    out["sysctls_readonly"] = [name for name in sysctls
                               if out["sysctls"][name] is not None and not os.access(sysctl_path(name), os.W_OK)]
    return out


# -- state file ---------------------------------------------------------------------------------

def _legacy_path(state_dir: str) -> str:
    return os.path.join(os.path.expanduser(state_dir), f"{STATE_PREFIX}{netns_id()}.json")


def state_path(state_dir: str) -> str:
    """Where this namespace's state is written: root's in HOST_DIR beside the host's network lease, whatever
    workdir a sweep names (every controller finds it); another user's in `state_dir` (the workdir's)."""
    if os.geteuid() == 0:
        return os.path.join(HOST_DIR, f"{STATE_PREFIX}{netns_id()}.json")
    return _legacy_path(state_dir)


def _existing_path(state_dir: str) -> str:
    """The state file to read: the host-wide one, else one in `state_dir` (left by a zcorch that kept it in
    the workdir, or by a run as another user)."""
    path = state_path(state_dir)
    if not os.path.lexists(path) and os.path.lexists(_legacy_path(state_dir)):
        return _legacy_path(state_dir)
    return path


def _private(path: str, st: "os.stat_result", what: str) -> None:
    """ActionError unless `st` (of `path`) belongs to this user and no one else may write it."""
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise ActionError(f"{path}: the network state {what} is owned by uid {st.st_uid} with mode "
                          f"{st.st_mode & 0o7777:04o}, not this user's (uid {os.geteuid()}) and writable by no one "
                          f"else: someone else could have written it, so it is not acted on (check it, then remove "
                          f"it or `chown {os.geteuid()} {path}; chmod go-w {path}`)")


def read_state(state_dir: str) -> "Optional[Dict[str, Any]]":
    """The state file, only when it and every directory down to it are this user's and private (no symlink
    for the file itself): `restore` writes what it says."""
    path = _existing_path(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError:
        if os.path.islink(path):
            raise ActionError(f"{path}: the network state file is a symbolic link: not followed (remove it)") from None
        raise
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ActionError(f"{path}: the network state file is not a regular file (remove it)")
        _private(path, st, "file")
        _check_dirs(os.path.dirname(path))
        try:
            data = json.load(f)
        except ValueError as exc:
            raise ActionError(f"{path}: unreadable state file ({exc}); check and remove it") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ActionError(f"{path}: not a zcorch network state file (format {FORMAT!r}); check and remove it")
    return data


def _check_dirs(directory: str) -> None:
    """The state directory (resolved) must be private to this user; each directory above it root's or this
    user's, and writable by others only when sticky (/tmp): else someone could swap the state directory."""
    real = os.path.realpath(directory)
    _private(real, os.stat(real), "directory")
    parent = os.path.dirname(real)
    while parent != real:
        st = os.stat(parent)
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise ActionError(f"{parent}: a directory above the network state directory {directory} is owned by uid "
                              f"{st.st_uid} with mode {st.st_mode & 0o7777:04o}: someone else could replace what "
                              f"is below it, so the network state there is not acted on")
        real, parent = parent, os.path.dirname(parent)


def _write_state(path: str, data: "Dict[str, Any]") -> None:
    """Atomically (temp file, fsync, rename), mode 0600, in a directory only this user can change."""
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    _check_dirs(directory)
    tmp = f"{path}.tmp-{os.getpid()}"
    with suppress(FileNotFoundError):
        os.unlink(tmp)       # a leftover of a killed apply with our pid (never followed: unlink of the name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def apply(state_dir: str, peer: str, spec: "Dict[str, Any]", owner: "Dict[str, Any]") -> "Dict[str, Any]":
    """Record the previous values, then set the MTU of the data link and the sysctls. On any failure what
    was changed is put back (and the state file removed) before the error is raised."""
    path = state_path(state_dir)
    if os.path.lexists(_existing_path(state_dir)):
        raise ActionError(f"{_existing_path(state_dir)} exists: a previous configuration is still applied "
                          "(restore it first)")
    sysctls = {str(k): str(v) for k, v in (spec.get("sysctls") or {}).items()}
    dev = data_link(peer)
    refused = [why for why in (sysctl_refusal(name, dev) for name in sysctls) if why]
    if refused:   # judged here too: the controller's check is not this host's
        raise ActionError("refused, nothing changed: " + "; ".join(refused))
    link = link_facts(dev)
    old: "Dict[str, Optional[str]]" = {}
    for name in sysctls:
        old[name] = read_sysctl(name)
        if old[name] is None:
            raise ActionError(f"this host has no sysctl {name} ({sysctl_path(name)} does not exist in its "
                              "network namespace)")
    mtu = spec.get("mtu")
    if mtu is not None:
        why = mtu_problem(dev, int(mtu), link_addresses(dev))
        if why:
            raise ActionError(why)
    data = {"format": FORMAT, "version": 1, "name": spec.get("name"), "owner": owner, "netns": netns_id(),
            "interface": dev, "ifindex": link["ifindex"], "mtu": link["mtu"] if mtu is not None else None,
            "sysctls": old}
    _write_state(path, data)     # before the first change: a kill from here on leaves what restore needs
    try:
        if mtu is not None and int(mtu) != link["mtu"]:
            _ip(["link", "set", "dev", dev, "mtu", str(int(mtu))])
        for name, value in sysctls.items():
            try:
                write_sysctl(name, value)
            except OSError as exc:
                raise ActionError(f"cannot set {name} to {value!r}: {exc.strerror or exc}") from None
    except BaseException:
        restore(state_dir)
        raise
    facts = link_facts(dev)   # what is in effect now
    return {"interface": dev, "mtu": facts["mtu"], "kind": facts["kind"], **_congestion(),
            "sysctls": {name: read_sysctl(name) for name in sysctls}}


def restore(state_dir: str) -> "Dict[str, Any]":
    """Put back what this namespace's state file records, newest change first; remove the file when all is
    back. A link that is gone (or another link now has its name) is skipped: nothing else is touched."""
    data = read_state(state_dir)
    out: "Dict[str, Any]" = {"restored": [], "errors": []}
    if data is None:
        return out
    dev = data.get("interface")
    for name, value in reversed(list((data.get("sysctls") or {}).items())):
        if value is None:
            continue
        why = sysctl_refusal(name, dev if isinstance(dev, str) else "")
        if why:       # apply never records such a key: the file was written by someone else
            out["errors"].append(f"{name}: not restored: {why} (check {_existing_path(state_dir)} and remove it)")
            continue
        try:
            if read_sysctl(name) != value:
                write_sysctl(name, value)
                out["restored"].append(f"{name} = {value}")
        except (OSError, ActionError) as exc:
            out["errors"].append(f"{name}: {getattr(exc, 'strerror', None) or exc}")
    mtu = data.get("mtu")
    if isinstance(dev, str) and isinstance(mtu, int):
        try:
            facts = link_facts(dev)
        except (ActionError, ValueError):
            facts = None        # the link is gone (a lab torn down): nothing to restore there
        if facts is not None and facts["ifindex"] == data.get("ifindex") and facts["mtu"] != mtu:
            try:
                _ip(["link", "set", "dev", dev, "mtu", str(mtu)])
                out["restored"].append(f"{dev} mtu {mtu}")
            except ActionError as exc:
                out["errors"].append(str(exc))
    if not out["errors"]:
        os.unlink(_existing_path(state_dir))
    return out


# -- command line -------------------------------------------------------------------------------

def _print_json(doc: "Any") -> int:
    print(json.dumps(doc))
    return 0


ACTIONS: "Dict[str, Tuple[str, int, Optional[int], Any]]" = {
    "probe": ("PEER [--keep=ADDR...] [SYSCTL...]", 1, None, lambda a: _print_json(probe(a[0], a[1:]))),
    "state": ("STATE_DIR", 1, 1, lambda a: _print_json(read_state(a[0]))),
    "apply": ("STATE_DIR PEER SPEC OWNER", 4, 4,
              lambda a: _print_json(apply(a[0], a[1], json.loads(a[2]), json.loads(a[3])))),
    "restore": ("STATE_DIR", 1, 1, lambda a: _print_json(restore(a[0]))),
}


def main(argv: "Optional[List[str]]" = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ACTIONS:
        sys.stderr.write("usage: python -m zcorch.worker.netcfg ACTION ARGS...\n" + "".join(
            f"  {n} {s[0]}\n" for n, s in ACTIONS.items()))
        return 2
    name, rest = args[0], args[1:]
    usage, least, most, handler = ACTIONS[name]
    if len(rest) < least or (most is not None and len(rest) > most):
        sys.stderr.write(f"{name}: usage: {name} {usage}\n")
        return 2
    try:
        return handler(rest)
    except (ActionError, OSError, ValueError) as exc:
        sys.stderr.write(f"{name}: {exc}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
