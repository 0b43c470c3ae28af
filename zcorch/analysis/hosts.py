"""The report's Hosts section: the sender and receiver side by side (meta.json `hosts.<role>`), the facts that
explain a result (FACTS) in units, what differs marked; everything else only in the raw table."""
from __future__ import annotations

from typing import Any, Callable, Optional

from zcorch.config.baselines.registry import VERSION_LABELS

ROLES = ("sender", "receiver")
ROLE_FACTS = {"sink"}  # facts only one role has: shown, never marked as a difference


def fact(facts: Any, dotted: str) -> Any:
    """facts["a"]["b"] for "a.b"; None where a level is missing or not a dict."""
    value: Any = facts
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _gib(value) -> Optional[str]:
    return f"{value / (1 << 30):.1f} GiB" if isinstance(value, (int, float)) else None


def _bytes(value) -> Optional[str]:
    """A socket-limit sysctl in bytes, shown with its binary multiple ('4194304' -> '4 MiB')."""
    try:
        n = int(str(value))
    except (TypeError, ValueError):
        return None if value is None else str(value)
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _triple(value) -> Optional[str]:
    """tcp_rmem/tcp_wmem 'min default max' in bytes -> 'min 4 KiB, default 128 KiB, max 32 MiB'."""
    if value is None:
        return None
    parts = str(value).split()
    if len(parts) != 3:
        return str(value)
    return ", ".join(f"{w} {_bytes(p)}" for w, p in zip(("min", "default", "max"), parts))


def _cpus(facts: dict) -> Optional[str]:
    count, usable = facts.get("cpu_count"), facts.get("cpu_affinity_count")
    if count is None:
        return None
    return f"{count}" + (f" ({usable} usable by zcorch)" if usable not in (None, count) else "")


def _interface(facts: dict) -> Optional[str]:
    iface = facts.get("interface")
    if not isinstance(iface, dict):
        return None
    parts = [str(iface.get("name") or "?")]
    if iface.get("kind"):
        parts.append(f"({iface['kind']})")
    if iface.get("address"):
        parts.append(str(iface["address"]))
    return " ".join(parts)


def _speed(facts: dict) -> Optional[str]:
    speed = fact(facts, "interface.speed_mbps")
    if isinstance(speed, (int, float)):
        return f"{speed / 1000:g} Gbit/s" if speed >= 1000 else f"{speed:g} Mbit/s"
    why = fact(facts, "why_null.interface.speed_mbps") or (facts.get("why_null") or {}).get("interface.speed_mbps")
    return "unknown (the kernel does not report it)" if why or facts.get("interface") else None


def _sink(facts: dict) -> Optional[str]:
    path, mount = facts.get("sink_path"), facts.get("sink_mount")
    if not path:
        return None
    if isinstance(mount, dict) and mount.get("fstype"):
        return f"{path} on {mount['fstype']} ({mount.get('target')})"
    return str(path)


# (label, how to read it from one host's facts): the rows of the readable comparison, in this order.
FACTS: "list[tuple[str, Callable[[dict], Optional[str]]]]" = [
    ("host name", lambda f: f.get("hostname")),
    ("CPU model", lambda f: f.get("cpu_model")),
    ("CPUs", _cpus),
    ("memory", lambda f: _gib(f.get("mem_total_bytes"))),
    ("kernel", lambda f: " ".join(str(v) for v in (fact(f, "kernel.release"), fact(f, "kernel.machine")) if v) or None),
    ("data interface", _interface),
    ("link speed", _speed),
    ("MTU", lambda f: None if fact(f, "interface.mtu") is None else f"{fact(f, 'interface.mtu')} bytes"),
    ("TCP congestion control", lambda f: fact(f, "sysctls.net.ipv4.tcp_congestion_control")
     or (f.get("sysctls") or {}).get("net.ipv4.tcp_congestion_control")),
    ("socket receive buffer limit (rmem_max)", lambda f: _bytes((f.get("sysctls") or {}).get("net.core.rmem_max"))),
    ("socket send buffer limit (wmem_max)", lambda f: _bytes((f.get("sysctls") or {}).get("net.core.wmem_max"))),
    ("TCP receive buffer (tcp_rmem)", lambda f: _triple((f.get("sysctls") or {}).get("net.ipv4.tcp_rmem"))),
    ("TCP send buffer (tcp_wmem)", lambda f: _triple((f.get("sysctls") or {}).get("net.ipv4.tcp_wmem"))),
    ("socket option memory (optmem_max)", lambda f: _bytes((f.get("sysctls") or {}).get("net.core.optmem_max"))),
    ("largest pipe (pipe-max-size)", lambda f: _bytes((f.get("sysctls") or {}).get("fs.pipe-max-size"))),
    ("sink", _sink),
    ("Python", lambda f: fact(f, "python.version")),
    *((label, lambda f, label=label: fact(f, f"versions.{label}")) for label in VERSION_LABELS),
    ("C compiler", lambda f: fact(f, "versions.compiler")),
]


def comparison(meta: dict) -> Optional[dict]:
    """{"roles", "rows": [{"label", "values", "differs"}], "n_differ"} of meta.json's hosts; None without."""
    hosts = meta.get("hosts") or {}
    roles = [r for r in ROLES if isinstance(hosts.get(r), dict)]
    roles += [r for r in hosts if r not in roles and isinstance(hosts.get(r), dict) and r != "previous"]
    if not roles:
        return None
    def value(read: Callable[[dict], Optional[str]], facts: dict) -> Optional[str]:
        try:
            return read(facts)
        except (TypeError, ValueError, AttributeError):  # a fact of an unexpected shape: shown raw below
            return None
    rows = []
    for label, read in FACTS:
        values = [value(read, hosts[role]) for role in roles]
        if all(v is None for v in values):
            continue
        shown = ["" if v is None else str(v) for v in values]
        if label in ROLE_FACTS:  # a fact of one role (the sink is the receiver's): nothing to compare
            shown = [v or "–" for v in shown]
        differs = label not in ROLE_FACTS and len(set(shown)) > 1
        rows.append({"label": label, "values": shown, "differs": differs})
    return {"roles": roles, "rows": rows, "n_differ": sum(r["differs"] for r in rows)}
