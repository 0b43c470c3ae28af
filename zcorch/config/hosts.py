"""The `hosts:` section: `localhost`, or a sender and a receiver reached over SSH (docs/experiment-files.md).
Every value reaches ssh or a remote argv, so each is checked syntactically (nothing ssh could read as an option).
"""
from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import Checker

# The one default deploy/scratch/filesystem-state directory of a host (`~` is expanded on that host).
DEFAULT_WORKDIR = "~/.cache/zcorch"
DEFAULT_PYTHON = "python3"
HOST_ROLES = ("sender", "receiver")
HOST_KEYS = ("ssh", "data_address", "identity_file", "known_hosts", "ssh_config", "python", "workdir",
             "allow_network_changes")
REQUIRED_HOST_KEYS = ("ssh", "data_address")

_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"^{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")


def fs_state_dir(workdir: str) -> str:
    """Where zcorch.provision.filesystems keeps its state files and mounts under a workdir."""
    return posixpath.join(workdir.rstrip("/") or "/", "fs")


def net_state_dir(workdir: str) -> str:
    """Where zcorch.provision.network records a host's previous network values under a workdir."""
    return posixpath.join(workdir.rstrip("/") or "/", "net")


@dataclass(frozen=True)
class HostSpec:
    """One host of the `hosts:` section, validated; the attribute names are the file's keys."""

    ssh: str                              # [user@]host[:port] or an ssh-config alias
    data_address: str                     # where the data connection reaches this host
    identity_file: Optional[str] = None   # controller-side paths (absolute or ~/...)
    known_hosts: Optional[str] = None
    ssh_config: Optional[str] = None
    python: str = DEFAULT_PYTHON          # the host's interpreter for the worker
    workdir: str = DEFAULT_WORKDIR        # deploy, {scratch} and filesystem state live under it
    # The owner lets `networks:` change the host's MTU and net.* sysctls (restored after); never without it.
    allow_network_changes: Optional[bool] = None

    @property
    def fs_state_dir(self) -> str:
        return fs_state_dir(self.workdir)

    def to_mapping(self) -> "dict[str, str]":
        """The keys as an experiment file writes them (None left out)."""
        return {k: getattr(self, k) for k in HOST_KEYS if getattr(self, k) is not None}

    @classmethod
    def from_mapping(cls, data: Mapping, role: str = "sender", path: str = "<hosts>") -> "HostSpec":
        """Validate plain data through the same parser as a file; ConfigError names `hosts.<role>.<key>`."""
        def parse(chk: Checker, node: ys.YNode) -> Optional[HostSpec]:
            return _host_spec(chk, node.entries[role][1], role)  # type: ignore[union-attr]

        return checks.parse_data("hosts", {role: data}, parse, path)


@dataclass(frozen=True)
class Hosts:
    """The `hosts:` section: `localhost` (one LocalHost plays both roles), or a sender and a receiver."""

    localhost: bool = True
    sender: Optional[HostSpec] = None
    receiver: Optional[HostSpec] = None

    def __post_init__(self) -> None:
        remote = self.sender is not None and self.receiver is not None
        if self.localhost == remote or (not remote and (self.sender or self.receiver)):
            raise ValueError("Hosts: either localhost=True and no specs, or localhost=False and both specs")

    @classmethod
    def remote(cls, sender: HostSpec, receiver: HostSpec) -> "Hosts":
        return cls(localhost=False, sender=sender, receiver=receiver)

    def spec(self, role: str) -> HostSpec:
        """The HostSpec of `role` (a remote experiment only)."""
        spec = {"sender": self.sender, "receiver": self.receiver}[role]
        if spec is None:
            raise ValueError(f"hosts: localhost has no host spec for {role}")
        return spec

    def workdir(self, role: str) -> str:
        """The role's workdir as written (DEFAULT_WORKDIR for localhost): `~` not expanded."""
        return DEFAULT_WORKDIR if self.localhost else self.spec(role).workdir

    @property
    def fs_state_dir(self) -> str:
        """Filesystem state on the receiver (the filesystems live there)."""
        return fs_state_dir(self.workdir("receiver"))

    def describe(self) -> str:
        """One line for `zcorch plan`."""
        if self.localhost:
            return "localhost"
        return f"sender {self.spec('sender').ssh} -> receiver {self.spec('receiver').ssh}"

    def to_data(self) -> Any:
        """The section as an experiment file writes it."""
        return "localhost" if self.localhost else {r: self.spec(r).to_mapping() for r in HOST_ROLES}

    @classmethod
    def from_mapping(cls, data: "Mapping | str", path: str = "<hosts>") -> "Hosts":
        """Validate plain data ({"sender": {...}, "receiver": {...}} or "localhost") through the file's parser."""
        return checks.parse_data("hosts", data, parse_hosts, path)


LOCALHOST = Hosts()


INVENTORY = "inventory"  # `hosts: inventory`: the hosts come from `--hosts INVENTORY[:PAIR]` (or ZCORCH_HOSTS)


def parse_hosts(chk: Checker, node: ys.YNode, path: str = "hosts", base_dir: Optional[str] = None,
                inventory_ok: bool = False) -> "Hosts | None":
    """The `hosts:` node; problems go to `chk`. base_dir: what relative controller-side paths are relative to
    (an inventory's; None: refused). inventory_ok: `inventory` is accepted and returns None."""
    if isinstance(node, ys.YScalar):
        text = chk.value(node, path, ys.as_str, None)
        if inventory_ok and text == INVENTORY:
            return None
        if text is not None and text != "localhost":
            also = " (or `inventory`: the hosts are given with --hosts)" if inventory_ok else ""
            chk.problem(node.pos, path, f"expected `localhost` or a mapping with `sender:` and "
                                        f"`receiver:`{also}, got `{text}`")
        return LOCALHOST
    roles = chk.mapping(node, path, HOST_ROLES, "host roles")
    specs = {}
    for role in HOST_ROLES:
        if role not in roles:
            if isinstance(node, ys.YMap):
                chk.problem(node.pos, path, f"missing `{role}:` (both sender and receiver are needed)")
            continue
        specs[role] = _host_spec(chk, roles[role][1], role, f"{path}.{role}", base_dir)
    if set(specs) != set(HOST_ROLES) or None in specs.values():
        return LOCALHOST  # only returned with problems recorded
    return Hosts.remote(specs["sender"], specs["receiver"])


def _host_spec(chk: Checker, node: ys.YNode, role: str, path: Optional[str] = None,
               base_dir: Optional[str] = None) -> Optional[HostSpec]:
    path = path or f"hosts.{role}"
    n_problems = len(chk.problems)
    fields = chk.mapping(node, path, HOST_KEYS, "host keys")
    values = {}
    for key in HOST_KEYS:
        if key in fields:
            parser = HOST_PARSERS[key]
            if key in LOCAL_FILE_KEYS and base_dir is not None:
                parser = _relative_to(base_dir)
            val = chk.value(fields[key][1], f"{path}.{key}", parser, None)
            if val is not None:
                values[key] = val
        elif key in REQUIRED_HOST_KEYS and isinstance(node, ys.YMap):
            chk.problem(node.pos, path, f"missing required key `{key}`")
    if len(chk.problems) != n_problems or not isinstance(node, ys.YMap):
        return None
    return HostSpec(**values)


def _ssh_target(text: str) -> str:
    """`[user@]host[:port]` or an ssh-config alias; refuses anything ssh could read as an option."""
    rest = text
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not _USER_RE.match(user):
            raise ys.ValueProblem(f"`{text}`: `{user}` is not a valid user name")
    port = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise ys.ValueProblem(f"`{text}`: unclosed `[` around an IPv6 address")
        host, tail = rest[1:end], rest[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ys.ValueProblem(f"`{text}`: `{host}` is not an IPv6 address") from None
        if tail:
            if not tail.startswith(":"):
                raise ys.ValueProblem(f"`{text}`: expected `:PORT` after `]`")
            port = tail[1:]
    elif rest.count(":") > 1:
        try:
            ipaddress.IPv6Address(rest)
        except ValueError:
            raise ys.ValueProblem(f"`{text}`: not [user@]host[:port] (write IPv6 addresses as [addr]:port)") from None
        host = rest
    else:
        host, _, port = rest.partition(":")
        port = port if ":" in rest else None
        _check_host(host, text)
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ys.ValueProblem(f"`{text}`: port `{port}` is not a number between 1 and 65535")
    return text


def _check_host(host: str, whole: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    prefix = "" if host == whole else f"`{whole}`: "
    # All-numeric labels would pass as a host name: hold them to IPv4 syntax (10.78.0.300 is a typo).
    if not host or len(host) > 253 or not _HOSTNAME_RE.match(host) or re.match(r"^[0-9.]+$", host):
        raise ys.ValueProblem(f"{prefix}`{host}` is not a valid host name or IP address")


def _address(node: ys.YNode) -> str:
    text = ys.as_str(node, "an IP address or host name")
    _check_host(text, text)
    return text


def _local_file(node: ys.YNode) -> str:
    text = ys.as_str(node, "a path")
    if not (text.startswith("/") or text.startswith("~/")):
        raise ys.ValueProblem(f"expected an absolute path or ~/..., got `{text}` (the experiment file is "
                              "copied into the result set, where a relative path would name another file; "
                              "in an inventory file (--hosts), paths are relative to the inventory)")
    checks.check_no_control(text, "path")
    return text


def _relative_to(base_dir: str):
    """An inventory's controller-side path: absolute, ~/..., or relative to `base_dir` (made absolute)."""
    def parse(node: ys.YNode) -> str:
        text = ys.as_str(node, "a path")
        checks.check_no_control(text, "path")
        if text.startswith("/") or text.startswith("~/"):
            return text
        if text.startswith("~"):
            raise ys.ValueProblem(f"`{text}`: write ~/... (another user's ~name is not expanded)")
        return posixpath.normpath(posixpath.join(base_dir, text))

    return parse


def _python(node: ys.YNode) -> str:
    text = ys.as_str(node, "an interpreter name or path")
    if not _PYTHON_RE.match(text) or text.startswith("-"):
        raise ys.ValueProblem(f"`{text}` is not an interpreter name or path (e.g. python3, /usr/bin/python3)")
    return text


def _workdir(node: ys.YNode) -> str:
    text = ys.as_str(node, "a directory")
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        raise ys.ValueProblem(f"expected an absolute directory or ~/..., got `{text}`")
    checks.check_no_control(text, "workdir")
    return text


LOCAL_FILE_KEYS = ("identity_file", "known_hosts", "ssh_config")
HOST_PARSERS = {
    "ssh": lambda n: _ssh_target(ys.as_str(n, "[user@]host[:port]")),
    "data_address": _address,
    "identity_file": _local_file,
    "known_hosts": _local_file,
    "ssh_config": _local_file,
    "python": _python,
    "workdir": _workdir,
    "allow_network_changes": ys.as_bool,
}
assert set(HOST_PARSERS) == set(HOST_KEYS)
