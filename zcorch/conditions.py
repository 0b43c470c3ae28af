"""The conditions under which a published claim can be tested on the machine that ran it: declared once.
A claim whose condition is not met is *untestable here* rather than *does not hold* (a pinning study on busy
CPUs says nothing about pinning); each check is a pure function of what the result set records. Stdlib only.
"""
from __future__ import annotations

import statistics
from collections import namedtuple
from typing import Optional, Sequence

IDLE_MIN = 0.8        # a host counts as quiet before a run when at least this share of its CPU time was idle
RAM_FIT_SHARE = 0.5   # data "fits in RAM" (stays in the page cache) up to this share of the host's memory
VIRTUAL_LINKS = ("loopback", "veth")   # link kinds (zcorch.worker.remote.interface_kind) with no NIC or driver
SAME_WORK_FACTOR = 2  # same_sender_work: the two sides' sender user CPU per GiB within this factor by default

MET, NOT_MET, UNKNOWN = "met", "not met", "not recorded"


class ConditionSpec(namedtuple("ConditionSpec", ("name", "takes", "help", "study"), defaults=(False,))):
    """A condition a claim may need; takes: the noun of its number (`{name: N}`) or None; study: study-wide."""

    __slots__ = ()


CONDITIONS: "tuple[ConditionSpec, ...]" = (
    ConditionSpec("idle_hosts", None,
                  f"the hosts were quiet before the runs: at least {IDLE_MIN:.0%} of their CPU time idle over the "
                  "workers' `idle_probe` window (`host_idle_before`), before at least half of the claim's runs; "
                  "the claim's cells must set `idle_probe`", True),
    ConditionSpec("one_kernel", None,
                  "both ends ran on one kernel (`same_host`: a loopback or veth transfer inside one machine)"),
    ConditionSpec("virtual_link", None,
                  "the data link is " + " or ".join(VIRTUAL_LINKS) + ": no NIC and no driver in the path"),
    ConditionSpec("real_nic", None, "the data link is a real NIC (a device with a driver), not loopback or veth"),
    ConditionSpec("data_in_ram", None,
                  f"every run's data fits in the page cache: `bytes` at most {RAM_FIT_SHARE:.0%} of the smaller "
                  "host's memory (a cached source, as a study that says its files were cached)"),
    ConditionSpec("data_beyond_ram", None,
                  "every run moves more than the receiver's memory: written data cannot all wait in the page "
                  "cache"),
    ConditionSpec("md_raid", None,
                  "the receiving filesystem is on Linux software RAID (md): a `filesystems:` entry with `raid:` "
                  "that was assembled as /dev/mdN, on a receiver whose kernel has md"),
    ConditionSpec("disk_source", None,
                  "every run that reads a file sends more than the sender's memory: the source comes from the "
                  "disk, not from the page cache (runs from /dev/zero or memory read no file)"),
    ConditionSpec("same_sender_work", "times",
                  "the claim's two sides did alike user-space work in the sender, as the study's did: their median "
                  f"sender user CPU per GiB within a factor of {SAME_WORK_FACTOR} of each other "
                  "(`{same_sender_work: N}`: within N); a time claim between a sender that fills every message "
                  "and one that cannot measures the filling"),
    ConditionSpec("cpus", "CPUs",
                  "the hosts have the CPUs the claim pins: every CPU its cells name exists, and there are at "
                  "least as many as they name distinct ones (`{cpus: N}`: at least N)"),
)
BY_NAME: "dict[str, ConditionSpec]" = {c.name: c for c in CONDITIONS}
NAMES: "tuple[str, ...]" = tuple(BY_NAME)


class Check(namedtuple("Check", ("name", "state", "detail"))):
    """A condition checked on one claim's runs: state MET, NOT_MET or UNKNOWN; detail says with what numbers."""

    __slots__ = ()

    def __str__(self) -> str:
        mark = {MET: "✓", NOT_MET: "✗", UNKNOWN: "?"}[self.state]
        return f"{mark} {self.name}: {self.detail}"


# ---------------------------------------------------------------- the checks (pure)

def check_idle(shares: "Sequence[Optional[float]]", minimum: float = IDLE_MIN) -> Check:
    """`shares`: per run, the lower idle share of its two hosts before it (None: not probed)."""
    known = [s for s in shares if s is not None and s == s]
    if not known:
        return Check("idle_hosts", UNKNOWN, "host idle before the runs not recorded (the cells set no `idle_probe`)")
    quiet = sum(s >= minimum for s in known)
    words = (f"{quiet} of {len(known)} runs began on quiet hosts (median idle before a run "
             f"{statistics.median(known):.0%}; quiet = at least {minimum:.0%} idle)")
    return Check("idle_hosts", MET if 2 * quiet >= len(known) else NOT_MET, words)


def check_one_kernel(same_host: "Sequence[Optional[bool]]") -> Check:
    """`same_host`: per run, whether both workers reported one boot id (None: unknown)."""
    known = [bool(s) for s in same_host if s is not None and s == s]
    if not known:
        return Check("one_kernel", UNKNOWN, "the hosts' boot ids were not recorded")
    apart = len(known) - sum(known)
    return (Check("one_kernel", NOT_MET, f"{apart} of {len(known)} runs had their ends on two kernels") if apart
            else Check("one_kernel", MET, f"both ends on one kernel in all {len(known)} runs"))


def check_link(kinds: "Sequence[Optional[str]]", virtual: bool) -> Check:
    """`kinds`: the data interfaces' kinds of the two hosts (loopback, veth, device ...; None: unknown)."""
    name = "virtual_link" if virtual else "real_nic"
    known = sorted({k for k in kinds if k})
    if not known:
        return Check(name, UNKNOWN, "the data link's kind was not recorded")
    is_virtual = [k in VIRTUAL_LINKS for k in known]
    ok = all(is_virtual) if virtual else not any(is_virtual)
    return Check(name, MET if ok else NOT_MET, f"the data link is {' and '.join(known)}")


def check_ram(nbytes: "Sequence[Optional[float]]", mem_total: "Optional[int]", inside: bool) -> Check:
    """`nbytes`: per run the data moved; `mem_total`: the memory it is held against, bytes."""
    name = "data_in_ram" if inside else "data_beyond_ram"
    known = [float(b) for b in nbytes if b is not None and b == b]
    if not known or not mem_total:
        return Check(name, UNKNOWN, "the data size or the hosts' memory was not recorded")
    most, least = max(known), min(known)
    gib = 1 << 30
    if inside:
        limit = RAM_FIT_SHARE * mem_total
        ok = most <= limit
        words = f"{most / gib:.3g} GiB per run against {mem_total / gib:.3g} GiB of memory (fits up to {limit / gib:.3g})"
    else:
        ok = least > mem_total
        words = f"{least / gib:.3g} GiB per run against {mem_total / gib:.3g} GiB of the receiver's memory"
    return Check(name, MET if ok else NOT_MET, words)


def check_cpus(named: "Sequence[int]", have: "Optional[int]", at_least: "Optional[int]" = None) -> Check:
    """`named`: the CPUs the cells pin; `have`: the fewer the hosts offer; `at_least`: `{cpus: N}`."""
    need = at_least if at_least is not None else len(set(named))
    if have is None:
        return Check("cpus", UNKNOWN, "the hosts' CPU counts were not recorded")
    missing = sorted(c for c in set(named) if c >= have)
    if missing:
        return Check("cpus", NOT_MET, f"CPU {', '.join(map(str, missing))} named but the hosts have {have} CPUs")
    return Check("cpus", NOT_MET if have < need else MET, f"{have} CPUs here, the claim needs {need}")


def check_md_raid(filesystems: "Sequence[tuple[str, Optional[dict]]]", md_driver: Optional[bool]) -> Check:
    """`filesystems`: (name, its meta.json record or None); `md_driver`: the receiver's kernel has md."""
    driver = ("" if md_driver is None else
              "; the receiver's kernel has md" if md_driver else "; the receiver's kernel has no md (/proc/mdstat absent)")
    if not filesystems:
        return Check("md_raid", NOT_MET, "the claim's cells write to no provisioned filesystem" + driver)
    if any(rec is None for _, rec in filesystems):
        missing = ", ".join(n for n, rec in filesystems if rec is None)
        return Check("md_raid", UNKNOWN, f"filesystem {missing} not recorded" + driver)
    plain = [f"{n} is {_devices(rec)}" for n, rec in filesystems
             if not (rec.get("raid") and str(rec.get("mount_source") or "").startswith("/dev/md"))]
    if plain:
        return Check("md_raid", NOT_MET, "; ".join(plain) + driver)
    return Check("md_raid", MET, ", ".join(f"{n} on {rec.get('raid')} {rec.get('mount_source')}"
                                          for n, rec in filesystems))


def _devices(rec: dict) -> str:
    devices = rec.get("devices") or []
    kinds = "loop device" if all(str(d.get("path", "")).startswith("/dev/loop") for d in devices) else "device"
    return (f"{len(devices)} {kinds}{'s' if len(devices) != 1 else ''} without md RAID" if devices else
            f"on {rec.get('mount_source') or 'an existing mount'}, not md RAID")


def check_disk_source(nbytes: "Sequence[Optional[float]]", send_mem_total: Optional[int]) -> Check:
    """`nbytes`: per run that reads a file as its source, the data moved; `send_mem_total`: the sender's memory."""
    known = [float(b) for b in nbytes if b is not None and b == b]
    if not known:
        return Check("disk_source", MET, "no run of the claim reads a file (its sources are /dev/zero or memory)")
    if not send_mem_total:
        return Check("disk_source", UNKNOWN, "the sender's memory was not recorded")
    least, gib = min(known), 1 << 30
    words = (f"{least / gib:.3g} GiB read per run against {send_mem_total / gib:.3g} GiB of the sender's memory"
             + ("" if least > send_mem_total else ": the source is read from the page cache"))
    return Check("disk_source", MET if least > send_mem_total else NOT_MET, words)


def check_sender_work(a_per_gib: "Sequence[Optional[float]]", b_per_gib: "Sequence[Optional[float]]",
                      factor: "Optional[int]" = None) -> Check:
    """Per side, its runs' sender user CPU in seconds per GiB moved (None: not recorded)."""
    factor = factor or SAME_WORK_FACTOR
    medians = []
    for runs in (a_per_gib, b_per_gib):
        known = [float(x) for x in runs if x is not None and x == x]
        if not known:
            return Check("same_sender_work", UNKNOWN, "the senders' user CPU was not recorded on both sides")
        medians.append(statistics.median(known))
    low, high = sorted(medians)
    ratio = 1.0 if high == 0 else high / low if low > 0 else float("inf")   # both none: alike
    words = (f"sender user CPU a {medians[0]:.3g} s/GiB, b {medians[1]:.3g} s/GiB "
             f"({'more than 1000' if ratio > 1000 else f'{ratio:.3g}'}x apart; alike = within {factor}x)")
    return Check("same_sender_work", MET if ratio <= factor else NOT_MET, words)


def untestable_reason(checks: "Sequence[Check]") -> str:
    """'' when every condition is met or not recorded, else the failing ones' details joined."""
    return "; ".join(f"{c.name}: {c.detail}" for c in checks if c.state == NOT_MET)
