"""What changed on the hosts between two result sets (meta.json `hosts.<role>`), as lines: "kernel 6.1.0-18 →
6.1.0-21", "receiver: GRO on → off". Facts one side did not record are named, never taken for unchanged; a change
both roles share is said once, without a role."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

ROLES = ("sender", "receiver")

# The facts compared, in this order: (label, dotted path in hosts.<role>). Dicts of facts (sysctls, tool
# versions, host_facts) are compared key by key below, so a key added to them is compared too.
FIXED: "Tuple[Tuple[str, str], ...]" = (
    ("kernel", "kernel.release"),
    ("CPU", "cpu_model"),
    ("CPUs", "cpu_count"),
    ("memory", "mem_total_bytes"),
    ("data interface", "interface.name"),
    ("link kind", "interface.kind"),
    ("MTU", "interface.mtu"),
    ("link speed Mbit/s", "interface.speed_mbps"),
    ("Python", "python.version"),
)
# labels of zcorch.worker.remote.HOST_FACTS keys (tests/test_hostfacts.py); an unknown key shows its own name
FACT_LABELS: Dict[str, str] = {
    "nic_driver": "NIC driver", "nic_firmware": "NIC firmware", "gso": "GSO", "gro": "GRO", "tso": "TSO",
    "lro": "LRO", "rings": "ring sizes", "qdisc": "qdisc", "cpu_governor": "CPU governor", "cpu_boost": "CPU boost",
    "smt": "SMT", "kernel_cmdline": "kernel command line", "irq_affinity": "NIC IRQ affinity", "thp": "THP",
    "nic_numa_node": "NIC NUMA node",
}
# (section of hosts.<role>, the label of one of its keys)
SECTIONS: "Tuple[Tuple[str, Callable[[str], str]], ...]" = (
    ("host_facts", lambda k: FACT_LABELS.get(k, k)),
    ("sysctls", lambda k: k),
    ("versions", lambda k: f"{k} version"),
)
# facts said as the words that went (−) and came (+): a kernel command line is a line long
WORDS = {"kernel command line"}
_MISSING = object()


def _get(facts: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(facts, dict) or part not in facts:
            return _MISSING
        facts = facts[part]
    return facts


def _unavailable(value: Any) -> Optional[str]:
    return str(value["unavailable"]) if isinstance(value, dict) and set(value) == {"unavailable"} else None


def _show(value: Any) -> str:
    why = _unavailable(value)
    if why is not None:
        return f"unavailable ({why})"
    if value is None:
        return "unknown"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_show(v)}" for k, v in value.items()) or "none"
    return str(value)


def _change(label: str, old: Any, new: Any) -> Optional[str]:
    """"LABEL OLD → NEW", None when nothing changed (both unavailable, whatever the reasons, is no change)."""
    if old == new or (_unavailable(old) is not None and _unavailable(new) is not None):
        return None
    if label in WORDS and isinstance(old, str) and isinstance(new, str):
        # a command line: the words that went and came, not two whole lines
        a, b = old.split(), new.split()
        gone, came = [w for w in a if w not in b], [w for w in b if w not in a]
        if gone or came:
            return f"{label} " + " ".join([*(f"−{w}" for w in gone), *(f"+{w}" for w in came)])
    return f"{label} {_show(old)} → {_show(new)}"


def host_changes(old: dict, new: dict) -> "Tuple[List[str], List[str]]":
    """(the changes between one host's facts `old` and `new`, the labels of facts only one side recorded)."""
    changes: List[str] = []
    unrecorded: List[str] = []

    def one(label: str, a: Any, b: Any) -> None:
        if a is _MISSING and b is _MISSING:
            return
        if a is _MISSING or b is _MISSING:
            unrecorded.append(label)
            return
        said = _change(label, a, b)
        if said:
            changes.append(said)

    for label, path in FIXED:
        a, b = _get(old, path), _get(new, path)
        if label == "memory":   # MemTotal moves by a few KiB between kernels: said in GiB, as the report does
            a, b = (f"{v / (1 << 30):.1f} GiB" if isinstance(v, (int, float)) else v for v in (a, b))
        one(label, a, b)
    for section, label_of in SECTIONS:
        a, b = old.get(section), new.get(section)
        if not isinstance(a, dict) and not isinstance(b, dict):
            continue
        a, b = (a if isinstance(a, dict) else {}), (b if isinstance(b, dict) else {})
        for key in dict.fromkeys([*a, *b]):
            one(label_of(key), a.get(key, _MISSING), b.get(key, _MISSING))
    return changes, unrecorded


def diff_meta(old: dict, new: dict, names: "Tuple[str, str]" = ("base", "candidate")) -> List[str]:
    """What changed on the hosts from meta.json `old` to `new` (names: what the two sides are called). [] when
    both record their hosts and nothing changed; a side without host metadata is said so, never an all-clear."""
    hosts = [(m.get("hosts") if isinstance(m, dict) else None) or {} for m in (old, new)]
    roles = [r for r in ROLES if isinstance(hosts[0].get(r), dict) or isinstance(hosts[1].get(r), dict)]
    if not roles:
        return ["no host metadata on either side"]
    per_role: Dict[str, List[str]] = {}
    lines: List[str] = []
    for role in roles:
        a, b = hosts[0].get(role), hosts[1].get(role)
        missing = [n for n, h in zip(names, (a, b)) if not isinstance(h, dict)]
        if missing:
            lines.append(f"{role}: no host metadata in {missing[0]}")
            continue
        changes, unrecorded = host_changes(a, b)
        per_role[role] = changes + ([f"not recorded on one side: {', '.join(unrecorded)}"] if unrecorded else [])
    shared = [c for c in per_role.get(roles[0], []) if len(per_role) == len(roles) > 1
              and all(c in per_role[r] for r in roles[1:])]
    out = list(shared)
    for role in roles:
        out += [f"{role}: {c}" for c in per_role.get(role, []) if c not in shared]
    return out + lines
