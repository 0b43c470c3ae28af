"""The `networks:` section: named configurations of the data link (`mtu`, `congestion`, allow-listed `sysctls`)
on both hosts, picked per cell by the `network` parameter (zcorch.provision.network applies them)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Optional

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import Checker
from zcorch.worker.netcfg import sysctl_refusal   # the one allow-list, the host module's (stdlib only)

NET_KEYS = ("mtu", "congestion", "sysctls")
MTU_MIN, MTU_MAX = 68, 65535          # IPv4's minimum MTU; the largest an interface's u16 MTU field takes
CONGESTION_SYSCTL = "net.ipv4.tcp_congestion_control"
_CONGESTION_RE = re.compile(r"^[a-z][a-z0-9_]{0,14}$")   # TCP_CA_NAME_MAX: 16 bytes with the NUL
# Only the network stack's sysctls: what the studies tuned, and a network namespace's own (the lab).
SYSCTL_RE = re.compile(r"^net(\.[A-Za-z0-9_-]+)+$")
# A value: words of printable characters without quotes, shell or path characters ("4096 87380 6291456").
_VALUE_RE = re.compile(r"^[A-Za-z0-9_.:,+-]+( [A-Za-z0-9_.:,+-]+)*$")


@dataclass(frozen=True)
class NetworkConfig:
    """One entry: the MTU (None: left as it is) and the sysctls to set, congestion included, in file order."""

    name: str
    mtu: Optional[int] = None
    congestion: Optional[str] = None
    sysctls: "tuple[tuple[str, str], ...]" = ()    # the `sysctls:` entries, values as written to /proc/sys

    def all_sysctls(self) -> "dict[str, str]":
        """Every sysctl the entry sets (congestion as net.ipv4.tcp_congestion_control last)."""
        out = dict(self.sysctls)
        if self.congestion is not None:
            out[CONGESTION_SYSCTL] = self.congestion
        return out

    def spec(self) -> dict:
        """What the host module (zcorch.worker.netcfg apply) gets."""
        return {"name": self.name, "mtu": self.mtu, "sysctls": self.all_sysctls()}

    def requested(self) -> dict:
        return {"mtu": self.mtu, "congestion": self.congestion, "sysctls": dict(self.sysctls)}


def networks_from_mapping(data: Mapping, path: str = "<networks>") -> "dict[str, NetworkConfig]":
    """Validate plain data ({name: entry}) through the file's parser; ConfigError if bad."""
    return checks.parse_data("networks", data, parse_networks, path)


def parse_networks(chk: Checker, node: ys.YNode) -> "dict[str, NetworkConfig]":
    """The `networks:` node -> {name: config} of the valid entries; problems go to `chk`."""
    return checks.named_entries(chk, node, "networks", NET_KEYS, "network keys", _entry)


def _entry(chk: Checker, fields: dict, node: ys.YMap, path: str, name: str) -> Optional[NetworkConfig]:
    if not node.entries:
        chk.problem(node.pos, path, "empty configuration: give `mtu`, `congestion` or `sysctls` (leave the "
                                    "hosts as they are with `network: null`)")
        return None
    mtu = chk.field(fields, path, "mtu", lambda n: checks.int_range(n, MTU_MIN, MTU_MAX))
    congestion = chk.field(fields, path, "congestion", _congestion)
    sysctls: "list[tuple[str, str]]" = []
    if "sysctls" in fields:
        snode = fields["sysctls"][1]
        if not isinstance(snode, ys.YMap) or not snode.entries:
            chk.problem(snode.pos, f"{path}.sysctls", "expected a mapping of sysctl names to values "
                                                      f"(e.g. {{net.core.rmem_max: 67108864}}), got {ys.describe(snode)}")
        else:
            for key, (kpos, vnode) in snode.entries.items():
                kpath = f"{path}.sysctls.{key}"
                if not SYSCTL_RE.match(key) or ".." in key:
                    chk.problem(kpos, kpath, f"`{key}`: only the network stack's sysctls may be set, dotted names "
                                             "starting with `net.` (e.g. net.ipv4.tcp_rmem)")
                    continue
                why = sysctl_refusal(key, None)
                if why:
                    chk.problem(kpos, kpath, why)
                    continue
                if key == CONGESTION_SYSCTL and congestion is not None:
                    chk.problem(kpos, kpath, f"`{key}` is what `congestion` sets: give it once")
                    continue
                value = chk.value(vnode, kpath, _sysctl_value, None)
                if value is not None:
                    sysctls.append((key, value))
    return NetworkConfig(name=name, mtu=mtu, congestion=congestion, sysctls=tuple(sysctls))


def _congestion(node: ys.YNode) -> str:
    text = ys.as_str(node, "a congestion control name")
    if not _CONGESTION_RE.match(text):
        raise ys.ValueProblem(f"`{text}` is not a congestion control name (lower-case letters, digits and `_`, "
                              "at most 15, as in /proc/sys/net/ipv4/tcp_available_congestion_control: reno, "
                              "cubic, bbr...)")
    return text


def _sysctl_value(node: ys.YNode) -> str:
    """An integer (not a boolean) or a string of words, as /proc/sys shows it; returned as text."""
    if not isinstance(node, ys.YScalar) or node.is_null:
        raise ys.ValueProblem(f"expected an integer or a string, got {ys.describe(node)}")
    if node.plain and node.tag.endswith(":bool"):
        raise ys.ValueProblem(f"`{node.text}` reads as a boolean: write 1 or 0 (or quote it)")
    text = " ".join(node.text.split())
    if not _VALUE_RE.match(text):
        raise ys.ValueProblem(f"`{node.text}`: a sysctl value is an integer or words of letters, digits and "
                              "`_ . : , + -` separated by spaces (no quotes, slashes or shell characters)")
    return text
