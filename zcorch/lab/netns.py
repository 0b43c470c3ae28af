"""`zcorch lab up|down|status`: two real SSH hosts on one machine, in network namespaces (root).

Layout for `--name NAME --index N` (N shifts the third octet, so several labs can run at once):

    controller (root netns) 10.77.N.1 on bridge zlNbr
        ├── veth zlNs ── mgmt0 10.77.N.2  [netns zcorch-NAME-sender]   sshd on 10.77.N.2:22
        └── veth zlNr ── mgmt0 10.77.N.3  [netns zcorch-NAME-receiver] sshd on 10.77.N.3:22
    data link (veth, MTU 9000): sender data0 10.78.N.2 <-> receiver data0 10.78.N.3

Each sshd runs in its own mount namespace, the lab's per-host directories bind-mounted over /root and
/scratch; state lives in /var/lib/zcorch-lab/NAME/. Every root-namespace link carries the alias
`zcorch-lab:NAME`, so `down` finds what a crashed `up` left even without the state directory.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from zcorch.config.hosts import DEFAULT_PYTHON, DEFAULT_WORKDIR, Hosts, fs_state_dir, net_state_dir
from zcorch.errors import LabError, ZcorchError
from zcorch.hosts.local import LocalHost

STATE_ROOT = "/var/lib/zcorch-lab"
SCRATCH_MOUNTPOINT = "/scratch"
SSHD = "/usr/sbin/sshd"
HOSTS = ("sender", "receiver")
_HOST_OCTET = {"sender": 2, "receiver": 3}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")
DATA_MTU = 9000
SSHD_START_TIMEOUT = 15.0
# Where `zcorch run` keeps filesystem state on a host without a `workdir` (Hosts.fs_state_dir).
FS_STATE_DIR = fs_state_dir(DEFAULT_WORKDIR)
NET_STATE_DIR = net_state_dir(DEFAULT_WORKDIR)   # and the network state (zcorch.provision.network)

# Inside the sshd's own mount namespace: private home and scratch, then sshd in the foreground.
_SSHD_SCRIPT = ('mount --bind "$1" /root && mount --bind "$2" "$3" && '
                'exec "$4" -D -f "$5" -E "$6"')


@dataclass(frozen=True)
class LabLayout:
    """Names, addresses and paths of one lab. Pure: nothing here touches the system."""

    name: str = "default"
    index: int = 0
    state_root: str = STATE_ROOT

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise LabError(f"lab name {self.name!r}: use 1-31 characters a-z 0-9 _ - (starting with a letter/digit)")
        if not isinstance(self.index, int) or not 0 <= self.index <= 255:
            raise LabError(f"lab index {self.index!r}: must be an integer 0-255 (it is the third address octet)")

    # -- network ----------------------------------------------------------------------------
    @property
    def alias(self) -> str:
        return f"zcorch-lab:{self.name}"

    @property
    def ns_prefix(self) -> str:
        return f"zcorch-{self.name}-"

    def ns(self, host: str) -> str:
        return f"{self.ns_prefix}{host}"

    @property
    def bridge(self) -> str:
        return f"zl{self.index}br"

    def mgmt_veth(self, host: str) -> str:
        return f"zl{self.index}{host[0]}"

    def data_veth(self, host: str) -> str:  # name in the root netns before it moves into the host
        return f"zl{self.index}d{host[0]}"

    def root_links(self) -> List[str]:
        return [self.bridge] + [self.mgmt_veth(h) for h in HOSTS] + [self.data_veth(h) for h in HOSTS]

    @property
    def controller_address(self) -> str:
        return f"10.77.{self.index}.1"

    def mgmt_address(self, host: str) -> str:
        return f"10.77.{self.index}.{_HOST_OCTET[host]}"

    def data_address(self, host: str) -> str:
        return f"10.78.{self.index}.{_HOST_OCTET[host]}"

    # -- files ------------------------------------------------------------------------------
    @property
    def state_dir(self) -> str:
        return os.path.join(self.state_root, self.name)

    @property
    def identity_file(self) -> str:
        return os.path.join(self.state_dir, "id_ed25519")

    @property
    def known_hosts(self) -> str:
        return os.path.join(self.state_dir, "known_hosts")

    @property
    def ssh_config(self) -> str:
        return os.path.join(self.state_dir, "ssh_config")

    @property
    def authorized_keys(self) -> str:
        return os.path.join(self.state_dir, "authorized_keys")

    @property
    def info_file(self) -> str:
        return os.path.join(self.state_dir, "lab.json")

    def host_dir(self, host: str) -> str:
        return os.path.join(self.state_dir, host)

    def home(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "home")

    def scratch(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "scratch")

    def host_key(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "ssh_host_ed25519_key")

    def sshd_config(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "sshd_config")

    def sshd_pidfile(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "sshd.pid")

    def sshd_log(self, host: str) -> str:
        return os.path.join(self.host_dir(host), "sshd.log")

    def host_alias(self, host: str) -> str:
        return f"zcorch-{self.name}-{host}"

    # -- what the user pastes ---------------------------------------------------------------
    def hosts_spec(self) -> Dict[str, dict]:
        """The `hosts:` block as plain data (what `zcorch lab up` prints and lab.json stores)."""
        # allow_network_changes: a `networks:` entry may set the MTU of data0 (the veth `up` created) and the
        # net.* sysctls of the host's own network namespace; both die with the namespace at `down`.
        return {h: {"ssh": f"root@{self.mgmt_address(h)}", "data_address": self.data_address(h),
                    "identity_file": self.identity_file, "known_hosts": self.known_hosts,
                    "ssh_config": self.ssh_config, "allow_network_changes": True} for h in HOSTS}

    def hosts(self) -> Hosts:
        """The same block validated, as `zcorch.hosts.ssh.open_hosts` takes it."""
        return Hosts.from_mapping(self.hosts_spec(), f"lab {self.name}")

    def inventory_spec(self) -> Dict[str, dict]:
        """The lab as an inventory (zcorch.config.inventory): one pair, named after the lab."""
        return {"pairs": {self.name: self.hosts_spec()}}

    def _role_lines(self, indent: int) -> List[str]:
        """`sender: {...}` and `receiver: {...}` (one flow mapping each): the body of a hosts block."""
        lines = []
        for host, spec in self.hosts_spec().items():
            body = ", ".join(f"{k}: {json.dumps(v)}" for k, v in spec.items())
            lines.append(f"{' ' * indent}{host + ':':<10}{{{body}}}")
        return lines

    def hosts_yaml(self) -> str:
        """The `hosts:` block of an experiment file (what `zcorch lab up` prints)."""
        return "\n".join(["hosts:"] + self._role_lines(2)) + "\n"

    def inventory_yaml(self) -> str:
        """The inventory file of the lab (what `zcorch lab inventory` prints): the same hosts, as pair NAME."""
        return "\n".join(["pairs:", f"  {self.name}:"] + self._role_lines(4)) + "\n"

    def sshd_config_text(self, host: str) -> str:
        return "\n".join([
            f"# zcorch lab {self.name}: sshd of {host} (generated by `zcorch lab up`)",
            f"ListenAddress {self.mgmt_address(host)}",
            "Port 22",
            f"HostKey {self.host_key(host)}",
            f"PidFile {self.sshd_pidfile(host)}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "UseDNS no",
            "AllowAgentForwarding no",
            "AllowTcpForwarding yes",   # ProxyJump through a lab host
            "X11Forwarding no",
            "PrintMotd no",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "Subsystem sftp internal-sftp",
            "",
        ])

    def ssh_config_text(self) -> str:
        lines = [f"# zcorch lab {self.name} (generated by `zcorch lab up`); e.g. ssh -F {self.ssh_config} "
                 f"{self.host_alias('sender')}"]
        for h in HOSTS:
            lines += [f"Host {self.host_alias(h)}", f"    HostName {self.mgmt_address(h)}"]
        lines += [f"Host 10.77.{self.index}.* 10.78.{self.index}.* zcorch-{self.name}-*",
                  "    User root", f"    IdentityFile {self.identity_file}", "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {self.known_hosts}", "    ForwardAgent no", ""]
        return "\n".join(lines)


# -- small system helpers -------------------------------------------------------------------
def _run(argv: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise LabError(f"{argv[0]} not found (scripts/install-system-deps installs it)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{shlex.join(map(str, argv))} did not finish within {timeout:.0f}s") from None
    if check and p.returncode != 0:
        raise LabError(f"{shlex.join(map(str, argv))} failed: {(p.stderr or p.stdout).strip()}")
    return p


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("zcorch lab needs root (it creates network namespaces, veth links, mounts and "
                       "runs sshd): run it as root, e.g. sudo zcorch lab up")


def _require_tools() -> None:
    missing = [f"{tool} ({pkg})" for tool, pkg in
               (("ip", "iproute2"), ("ssh-keygen", "openssh-client"), ("unshare", "util-linux"),
                ("setsid", "util-linux"), ("nsenter", "util-linux"), ("mount", "mount"))
               if shutil.which(tool) is None]
    if not os.access(SSHD, os.X_OK):
        missing.append(f"{SSHD} (openssh-server)")
    if missing:
        raise LabError("zcorch lab: missing " + ", ".join(missing) + " — run scripts/install-system-deps")


def list_netns() -> List[str]:
    p = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _ip_json(*args: str) -> List[dict]:
    p = _run(["ip", "-j", *args], check=False)
    try:
        return json.loads(p.stdout or "[]")
    except ValueError:
        return []


def _links() -> List[dict]:
    return _ip_json("-d", "link", "show")


def _link(name: str) -> Optional[dict]:
    return next((l for l in _links() if l.get("ifname") == name), None)


def netns_pids(ns: str) -> List[int]:
    p = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _read_pid(path: str) -> Optional[int]:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: Optional[int]) -> bool:
    if not pid:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def ssh_banner(address: str, port: int = 22, timeout: float = 1.0) -> Optional[str]:
    """The SSH banner of address:port, or None if nothing answers."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as s:
            s.settimeout(timeout)
            data = s.recv(256)
    except OSError:
        return None
    return data.decode("ascii", "replace").strip() if data.startswith(b"SSH-") else None


def _write(path: str, text: str, mode: int = 0o644) -> None:
    tmp = path + ".tmp"
    Path(tmp).write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# -- status ---------------------------------------------------------------------------------
def status(layout: LabLayout) -> dict:
    """What exists of the lab now: {"up": bool, "hosts": {host: {...}}, "links": [...], ...}."""
    netns = set(list_netns())
    hosts = {}
    for h in HOSTS:
        pid = _read_pid(layout.sshd_pidfile(h))
        ns = layout.ns(h)
        hosts[h] = {"netns": ns, "netns_exists": ns in netns, "mgmt_address": layout.mgmt_address(h),
                    "data_address": layout.data_address(h), "sshd_pid": pid if _alive(pid) else None,
                    "ssh_banner": ssh_banner(layout.mgmt_address(h)) if ns in netns else None,
                    "pids": netns_pids(ns) if ns in netns else []}
    links = [l["ifname"] for l in _links() if l.get("ifalias") == layout.alias]
    up = all(v["netns_exists"] and v["sshd_pid"] and v["ssh_banner"] for v in hosts.values())
    return {"name": layout.name, "index": layout.index, "up": up, "state_dir": layout.state_dir,
            "state_exists": os.path.isdir(layout.state_dir), "links": links, "hosts": hosts}


def _index_owner(layout: LabLayout) -> Optional[str]:
    """Name of the lab that holds this index's bridge (None if free)."""
    link = _link(layout.bridge)
    if link is None:
        return None
    alias = link.get("ifalias") or ""
    return alias.split(":", 1)[1] if alias.startswith("zcorch-lab:") else f"(not a zcorch lab: {layout.bridge})"


# -- up -------------------------------------------------------------------------------------
def up(layout: LabLayout) -> dict:
    """Bring the lab up (idempotent). Returns status(). Raises LabError."""
    _require_root()
    _require_tools()
    st = status(layout)
    owner = _index_owner(layout)
    if owner is not None and owner != layout.name:
        raise LabError(f"lab index {layout.index} is in use by lab {owner!r} (its bridge {layout.bridge} "
                       f"exists): pick another --index, or `zcorch lab down --name {owner} --index {layout.index}`")
    if st["up"]:
        return st
    if st["links"] or any(v["netns_exists"] for v in st["hosts"].values()):
        down(layout, keep_keys=True)  # half-up (crash, killed sshd): rebuild from a clean slate
    _check_addresses_free(layout)
    try:
        _make_files(layout)
        _make_network(layout)
        for h in HOSTS:
            _start_sshd(layout, h)
    except BaseException:
        down(layout, keep_keys=True)
        raise
    st = status(layout)
    if not st["up"]:  # pragma: no cover - _start_sshd already waited for each banner
        raise LabError(f"lab {layout.name} did not come up: {json.dumps(st)}")
    return st


def _check_addresses_free(layout: LabLayout) -> None:
    prefixes = (f"10.77.{layout.index}.", f"10.78.{layout.index}.")
    for iface in _ip_json("-4", "addr", "show"):
        for a in iface.get("addr_info", []):
            if str(a.get("local", "")).startswith(prefixes):
                raise LabError(f"address {a['local']} already exists on {iface.get('ifname')}: lab index "
                               f"{layout.index} would clash; pick another --index")


def _make_files(layout: LabLayout) -> None:
    os.makedirs(layout.state_dir, mode=0o700, exist_ok=True)
    os.chmod(layout.state_dir, 0o700)
    if not os.path.exists(layout.identity_file):
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"zcorch-lab-{layout.name}",
              "-f", layout.identity_file])
    _write(layout.authorized_keys, Path(layout.identity_file + ".pub").read_text(), 0o600)
    known = []
    for h in HOSTS:
        for d in (layout.host_dir(h), layout.home(h), layout.scratch(h)):
            os.makedirs(d, mode=0o700, exist_ok=True)
        if not os.path.exists(layout.host_key(h)):
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{layout.host_alias(h)}",
                  "-f", layout.host_key(h)])
        keytype, key = Path(layout.host_key(h) + ".pub").read_text().split()[:2]
        known.append(f"{layout.mgmt_address(h)} {keytype} {key}")
        _write(layout.sshd_config(h), layout.sshd_config_text(h))
    _write(layout.known_hosts, "\n".join(known) + "\n")
    _write(layout.ssh_config, layout.ssh_config_text())
    _write(layout.info_file, json.dumps({"name": layout.name, "index": layout.index,
                                         "hosts": layout.hosts_spec()}, indent=2) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    if not os.path.isdir(SCRATCH_MOUNTPOINT):
        os.makedirs(SCRATCH_MOUNTPOINT, mode=0o755)
        _write(os.path.join(layout.state_root, ".created-scratch"), SCRATCH_MOUNTPOINT + "\n")


def _make_network(layout: LabLayout) -> None:
    ip = lambda *a: _run(["ip", *a])  # noqa: E731
    # The bridge first: creating it claims the index atomically against a parallel `up`.
    p = _run(["ip", "link", "add", layout.bridge, "type", "bridge"], check=False)
    if p.returncode != 0:
        raise LabError(f"cannot create bridge {layout.bridge} (index {layout.index} taken by a parallel lab?): "
                       f"{p.stderr.strip()}")
    ip("link", "set", layout.bridge, "alias", layout.alias)
    ip("addr", "add", f"{layout.controller_address}/24", "dev", layout.bridge)
    ip("link", "set", layout.bridge, "up")
    for h in HOSTS:
        ns = layout.ns(h)
        ip("netns", "add", ns)
        ip("-n", ns, "link", "set", "lo", "up")
        veth = layout.mgmt_veth(h)
        ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        ip("link", "set", veth, "alias", layout.alias)
        ip("link", "set", f"{veth}p", "netns", ns)
        ip("-n", ns, "link", "set", f"{veth}p", "name", "mgmt0")
        ip("-n", ns, "addr", "add", f"{layout.mgmt_address(h)}/24", "dev", "mgmt0")
        ip("-n", ns, "link", "set", "mgmt0", "up")
        ip("link", "set", veth, "master", layout.bridge)
        ip("link", "set", veth, "up")
    ds, dr = layout.data_veth("sender"), layout.data_veth("receiver")
    ip("link", "add", ds, "mtu", str(DATA_MTU), "type", "veth", "peer", "name", dr, "mtu", str(DATA_MTU))
    for h, dev in (("sender", ds), ("receiver", dr)):
        ip("link", "set", dev, "alias", layout.alias)
        ip("link", "set", dev, "netns", layout.ns(h))
        ip("-n", layout.ns(h), "link", "set", dev, "name", "data0")
        ip("-n", layout.ns(h), "addr", "add", f"{layout.data_address(h)}/24", "dev", "data0")
        ip("-n", layout.ns(h), "link", "set", "data0", "up")


def _start_sshd(layout: LabLayout, host: str) -> None:
    pidfile = layout.sshd_pidfile(host)
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    Path(layout.sshd_log(host)).touch()
    argv = ["setsid", "-f", "ip", "netns", "exec", layout.ns(host), "unshare", "--mount", "--propagation",
            "private", "sh", "-c", _SSHD_SCRIPT, "sh", layout.home(host), layout.scratch(host),
            SCRATCH_MOUNTPOINT, SSHD, layout.sshd_config(host), layout.sshd_log(host)]
    # setsid -f: sshd is nobody's child here (no zombie in a long-lived caller such as pytest).
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=False, timeout=30)
    deadline = time.monotonic() + SSHD_START_TIMEOUT
    while time.monotonic() < deadline:
        if _alive(_read_pid(pidfile)) and ssh_banner(layout.mgmt_address(host), timeout=0.5):
            return
        time.sleep(0.05)
    try:
        log = Path(layout.sshd_log(host)).read_text()[-2000:]
    except OSError:
        log = ""
    raise LabError(f"sshd of {host} in {layout.ns(host)} did not answer on {layout.mgmt_address(host)}:22 within "
                   f"{SSHD_START_TIMEOUT:.0f}s; sshd log: {log.strip() or '(empty)'}")


# -- down -----------------------------------------------------------------------------------
def down(layout: LabLayout, keep_keys: bool = False) -> dict:
    """Remove every trace of the lab (idempotent, works after a crash). Returns what was removed."""
    _require_root()
    removed: dict = {"processes": [], "netns": [], "links": [], "mounts": [], "state": None,
                     "filesystems": [], "filesystem_errors": [], "network": [], "network_errors": []}
    namespaces = [ns for ns in list_netns() if ns.startswith(layout.ns_prefix)]
    # What a killed `zcorch run` left lives in the host's namespaces: undone from inside while its sshd lives.
    for h in HOSTS:
        pid = _read_pid(layout.sshd_pidfile(h))
        if layout.ns(h) in namespaces and _alive(pid) and _is_lab_sshd(pid, layout, h):
            _cleanup_filesystems(NamespaceHost(h, pid), removed)
            _restore_network(NamespaceHost(h, pid), removed)
    for ns in namespaces:
        removed["processes"] += _kill_netns(ns)
    for h in HOSTS:  # an sshd that escaped its netns listing (e.g. netns already gone)
        pid = _read_pid(layout.sshd_pidfile(h))
        if _alive(pid) and _is_lab_sshd(pid, layout, h):
            os.kill(pid, signal.SIGKILL)
            removed["processes"].append(pid)
    for ns in namespaces:
        _run(["ip", "netns", "del", ns], check=False)
        removed["netns"].append(ns)
    index_is_ours = _index_owner(layout) in (None, layout.name)
    for link in _links():
        name = link.get("ifname")
        if link.get("ifalias") == layout.alias or (index_is_ours and name in layout.root_links()):
            if _run(["ip", "link", "del", name], check=False).returncode == 0:
                removed["links"].append(name)
    removed["mounts"] = _unmount_under(layout)
    if os.path.isdir(layout.state_dir):
        if keep_keys:
            keep = {"id_ed25519", "id_ed25519.pub", "known_hosts", "ssh_config", "authorized_keys"}
            for entry in os.listdir(layout.state_dir):
                path = os.path.join(layout.state_dir, entry)
                if entry in HOSTS:
                    for sub in os.listdir(path):
                        if not sub.startswith("ssh_host_"):
                            _remove(os.path.join(path, sub))
                elif entry not in keep:
                    _remove(path)
            removed["state"] = "kept keys"
        else:
            shutil.rmtree(layout.state_dir)
            removed["state"] = "removed"
    _remove_scratch_mountpoint(layout)
    return removed


class NamespaceHost(LocalHost):
    """A lab host reached without SSH: commands run in its sshd's network and mount namespaces (nsenter)."""

    def __init__(self, name: str, sshd_pid: int):
        super().__init__(name, "")
        self._prefix = ["nsenter", "-t", str(int(sshd_pid)), "-m", "-n", "--"]

    def run(self, argv, timeout=60.0, env=None, input=None):
        return super().run(self._prefix + [str(a) for a in argv], timeout=timeout,
                           env={"HOME": "/root", **(env or {})}, input=input)

    def start(self, argv, env=None):
        return super().start(self._prefix + [str(a) for a in argv], env={"HOME": "/root", **(env or {})})


def _cleanup_filesystems(host: "NamespaceHost", removed: dict) -> None:
    """FilesystemManager.cleanup_stale on one host for the default state dir (an experiment's own `workdir`
    keeps its state there: the next `zcorch run` undoes it)."""
    from zcorch.provision.filesystems import FilesystemManager

    _undo_into(removed, "filesystems", "filesystem_errors", lambda: [
        f"{host.name}: {u}" for u in FilesystemManager.cleanup_stale(host, FS_STATE_DIR, python=DEFAULT_PYTHON)])


def _restore_network(host: "NamespaceHost", removed: dict) -> None:
    """A killed `zcorch run`'s `networks:` changes put back from the default state dir: the namespace's
    deletion would discard them anyway, but this also clears the state file (for `down --keep-keys`)."""
    from zcorch.provision.network import restore_state

    _undo_into(removed, "network", "network_errors", lambda: restore_state(host, DEFAULT_PYTHON, NET_STATE_DIR))


def _undo_into(removed: dict, key: str, errors: str, undo: Callable[[], List[str]]) -> None:
    """removed[key] += undo(), or its error to removed[errors]. Undone by the host's own python3: the
    controller's may live under /root, hidden in the lab host's mount namespace."""
    try:
        removed[key] += undo()
    except ZcorchError as exc:
        removed[errors].append(str(exc))


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _kill_netns(ns: str) -> List[int]:
    killed: List[int] = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        pids = [p for p in netns_pids(ns) if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)
    return sorted(set(killed))


def _is_lab_sshd(pid: int, layout: LabLayout, host: str) -> bool:
    try:
        return layout.sshd_config(host).encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _unmount_under(layout: LabLayout) -> List[str]:
    """Mounts the lab made live in sshd's private mount namespaces; anything left in ours is a leak."""
    gone = []
    try:
        with open("/proc/self/mounts") as f:
            points = [line.split()[1] for line in f]
    except OSError:
        return gone
    for point in reversed(points):
        point = point.replace("\\040", " ")
        if point.startswith(layout.state_dir + "/") or point.startswith(f"/run/netns/{layout.ns_prefix}"):
            if _run(["umount", "-l", point], check=False).returncode == 0:
                gone.append(point)
    return gone


def _remove_scratch_mountpoint(layout: LabLayout) -> None:
    marker = os.path.join(layout.state_root, ".created-scratch")
    if not os.path.exists(marker):
        return
    if any(ns.startswith("zcorch-") for ns in list_netns()):
        return  # another lab's sshd may have /scratch as a mount point in its namespace
    try:
        os.rmdir(SCRATCH_MOUNTPOINT)
    except OSError:
        return  # not empty: the user put something there
    os.unlink(marker)


# -- state ----------------------------------------------------------------------------------
def _index_from_state(name: str, given: Optional[int]) -> int:
    """`down`/`status` without --index use the index recorded by `up`."""
    if given is not None:
        return given
    try:
        return int(json.loads(Path(STATE_ROOT, name, "lab.json").read_text())["index"])
    except (OSError, ValueError, KeyError):
        return 0

