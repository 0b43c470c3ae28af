"""The analysis metrics: one declaration of every figure a run frame (zcorch.load) offers for comparison (its
unit, meaning, side, better direction, how the sides combine, whether extensive); `--metric`, verdicts, report
axes and `reference:` derive from it. Stdlib only: the config layer imports it without pandas.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Iterable, Optional

from zcorch.params import METRICS as WORKER_METRICS, replace_block
from zcorch.units import UNIT_DIMENSIONS, unit_dimension

SIDES = ("send", "recv", "total", "none")
BETTER = ("higher", "lower", None)
# How the sender's and the receiver's figure of one metric combine into the `total_*` figure.
COMBINE = {
    "sum": "the sender's plus the receiver's",
    # Both workers on one kernel (same_host) read one /proc/stat: adding them would count the machine twice.
    "host": "the sender's plus the receiver's; on one machine (same_host) the larger, counted once",
}
_SIDE_WORDS = {"send": "sender", "recv": "receiver", "total": "both sides", "none": ""}


class AnalysisMetric(namedtuple("AnalysisMetric", ("name", "unit", "side", "better", "combine", "extensive", "label",
                                                   "help"))):
    """One metric column of a run frame. side: "send", "recv", "total" or "none" (of the transfer); better: None
    = descriptive; combine: a key of COMBINE or None; extensive: a total over the transfer (compared per byte)."""

    __slots__ = ()

    @property
    def quantity(self) -> bool:
        """Whether the unit is one zcorch.units converts (a published figure can be written in it)."""
        return any(self.unit in units for units in UNIT_DIMENSIONS.values())

    @property
    def rate(self) -> bool:
        """A throughput (Gbit/s, MB/s): figures of any rate unit compare with each other and with a baseline."""
        return self.quantity and unit_dimension(self.unit) == "rate"

    @property
    def directed(self) -> bool:
        return self.better is not None

    def worse(self, change: float) -> bool:
        """Whether a change (candidate minus base) is in the bad direction (a rise of CPU, a fall of Gbit/s)."""
        if self.better is None:
            raise ValueError(f"metric {self.name!r} is descriptive: it has no better direction")
        return change < 0 if self.better == "higher" else change > 0

    @property
    def axis_label(self) -> str:
        """`label (unit)`: a plot axis, a history page."""
        return f"{self.label} ({self.unit})" if self.unit else self.label

    @property
    def parts(self) -> "tuple[str, str]":
        """(sender's column, receiver's column) of a `total` entry."""
        base = self.name[len("total_"):]
        return f"send_{base}", f"recv_{base}"


def _sides(base: str, unit: str, label: str, help: str, better: Optional[str], combine: Optional[str] = None,
           total: bool = False, extensive: bool = False, sides: Iterable[str] = ("send", "recv")) -> tuple:
    """The per-side entries `<side>_<base>` of one figure, and `total_<base>` (computed by `combine`)."""
    out = tuple(AnalysisMetric(f"{side}_{base}", unit, side, better, combine, extensive, f"{side} {label}",
                               f"{_SIDE_WORDS[side]}: {help}") for side in sides)
    if total:
        out += (AnalysisMetric(f"total_{base}", unit, "total", better, combine, extensive, f"both {label}",
                               f"both sides: {help}"),)
    return out


# The derived columns of zcorch.analysis.frames, in the frame's order.
_DERIVED_RUN: "tuple[AnalysisMetric, ...]" = (
    AnalysisMetric("gbit_s", "Gbit/s", "none", "higher", None, False, "throughput",
                   "bytes / wall time as the receiver saw it (the data has landed, an fsync included), else the "
                   "sender's"),
    AnalysisMetric("mb_s", "MB/s", "none", "higher", None, False, "throughput",
                   "bytes / wall time in 10^6 bytes per second, as gbit_s"),
    *_sides("cpu_s_per_gib", "s/GiB", "process CPU",
            "user + system CPU seconds of the worker process per GiB moved (netperf's service demand)",
            "lower", combine="sum", total=True),
    AnalysisMetric("send_sys_share", "share", "send", None, None, False, "send system share",
                   "sender: the system share (0..1) of its process CPU"),
    *_sides("host_busy_s", "s", "host CPU busy",
            "busy CPU seconds of the whole machine over the worker's window (/proc/stat: user, nice, system, "
            "irq, softirq; all CPUs; not steal, the hypervisor's time for other guests)", None, extensive=True),
    *_sides("host_busy_cpus", "CPUs", "host CPUs busy", "busy host CPU seconds / the window: CPUs busy on average",
            None),
    *_sides("host_busy_s_per_gib", "s/GiB", "host CPU",
            "busy CPU seconds of the whole machine per GiB the side moved (softirq and interrupts included)",
            "lower", combine="host", total=True),
    *_sides("host_softirq_s_per_gib", "s/GiB", "host softirq CPU",
            "softirq CPU seconds of the whole machine per GiB the side moved (most of the network stack's "
            "receive work)", "lower"),
    *_sides("host_background_cpus", "CPUs", "host CPUs busy before",
            "CPUs busy with other work just before the run: (1 - host_idle_before) × CPUs, from the `idle_probe` "
            "window (NaN unprobed); above 0.1 the run's host is shared (`host_shared`, `cpu_resolution`)", None),
    *_sides("host_steal_cpus", "CPUs", "hypervisor steal",
            "CPUs the hypervisor gave to other guests over the worker's window (/proc/stat steal / the window): "
            "not in the host's busy CPU (no work of this machine), but CPU the transfer did not get", None),
    *_sides("host_own_s_per_gib", "s/GiB", "host CPU, own",
            "host CPU per GiB less the background the idle probe saw before the run (busy CPU − background CPUs × "
            "window, never below the worker's process CPU): the transfer's own share of a shared host; NaN unprobed",
            "lower", combine="host", total=True),
    # A claim about faults "per page" compares this, never a total against a constant (a total grows with bytes).
    *_sides("minflt_per_page", "count", "minor faults per page",
            "minor page faults of the worker per 4 KiB page the side moved (1: a fault for every page)", None),
    AnalysisMetric("zc_copied_share", "share", "none", None, None, False, "zero-copy completions copied",
                   "share (0..1) of the kernel's zero-copy completion reports marked as copied"),
    AnalysisMetric("zc_recv_mapped_share", "share", "none", None, None, False, "zero-copy receive mapped",
                   "share (0..1) of the received bytes TCP_ZEROCOPY_RECEIVE mapped"),
    # From meta.json's per-host calibration (frames.add_copy_units): one memcpy of a GiB on the side's host.
    *_sides("copy_s_per_gib", "s/GiB", "one copy", "CPU seconds one memcpy of a GiB costs on the side's host "
            "(the calibration yardstick)", None),
    *_sides("cpu_copies", "copies", "process CPU",
            "process CPU per GiB in units of one memcpy of a GiB on that host", "lower"),
    *_sides("host_busy_copies", "copies", "host CPU",
            "host CPU per GiB in units of one memcpy of a GiB on that host", "lower"),
)

# With a `control:`, each run's figure over the control's of the same round: drift that moves both cancels.
CONTROL_SUFFIX = "_vs_control"
CONTROL_BASES = ("gbit_s", "total_host_busy_s_per_gib")


def _vs_control(base: AnalysisMetric) -> AnalysisMetric:
    return AnalysisMetric(base.name + CONTROL_SUFFIX, "ratio", "none", base.better, None, False,
                          f"{base.label} / control",
                          f"`{base.name}` of the run over that of the control cell's ok run of the same repeat "
                          "in the same result set (1 for the control; NaN when that run failed or no control "
                          "is declared), or over the rate of a baseline control's test of that round (`control: "
                          "iperf3`: gbit_s only; a network baseline has no host CPU per GiB)")


DERIVED: "tuple[AnalysisMetric, ...]" = _DERIVED_RUN + tuple(
    _vs_control(next(m for m in _DERIVED_RUN if m.name == b)) for b in CONTROL_BASES)
# {ratio column: the column it divides}
CONTROL_RATIOS: "dict[str, str]" = {b + CONTROL_SUFFIX: b for b in CONTROL_BASES}

# Not one number per run (a list per CPU), so no metric to compare although its unit is a quantity.
_NOT_SCALAR = frozenset(("host_per_cpu_us",))


def _worker_entries() -> tuple:
    entries = (AnalysisMetric(f"{side}_{m.name}", m.unit, side, None, None, m.extent == "total", f"{side} {m.name}",
                              f"{_SIDE_WORDS[side]} {m.help}")
               for m in WORKER_METRICS if m.name not in _NOT_SCALAR
               for side in ("send", "recv") if m.side in (side, "both"))
    return tuple(e for e in entries if e.quantity)   # an id or a flag (host_boot_id) is no figure to compare


ANALYSIS_METRICS: "tuple[AnalysisMetric, ...]" = DERIVED + _worker_entries()
BY_NAME: "dict[str, AnalysisMetric]" = {m.name: m for m in ANALYSIS_METRICS}
# What `zcorch compare` and `zcorch history` can follow: every metric with a better direction.
DIRECTED: "tuple[str, ...]" = tuple(m.name for m in ANALYSIS_METRICS if m.directed)
# What a published figure can be written in (zcorch.config.reference): metrics whose unit zcorch.units converts.
QUANTITIES: "tuple[str, ...]" = tuple(m.name for m in ANALYSIS_METRICS if m.quantity)
RATES: "frozenset[str]" = frozenset(m.name for m in ANALYSIS_METRICS if m.rate)
TOTALS: "tuple[AnalysisMetric, ...]" = tuple(m for m in ANALYSIS_METRICS if m.side == "total")
# The default figures of zcorch.summarize: throughput and each side's process CPU per GiB.
SUMMARY: "tuple[str, ...]" = ("mb_s", "gbit_s", "send_cpu_s_per_gib", "recv_cpu_s_per_gib")


def get(name: str) -> AnalysisMetric:
    """The metric `name`; KeyError when the table has none."""
    return BY_NAME[name]


def directed(name: str) -> AnalysisMetric:
    """The metric `name` if it has a better direction, else ValueError naming the choices."""
    m = BY_NAME.get(name)
    if m is None or not m.directed:
        what = "has no better direction (a descriptive figure)" if m is not None else "is not a metric"
        raise ValueError(f"{name!r} {what}; the metric must be one of {', '.join(DIRECTED)}")
    return m


def axis_label(name: str) -> str:
    """`label (unit)` of a metric, the name itself for a column the table does not declare."""
    m = BY_NAME.get(name)
    return m.axis_label if m is not None else name


# ---------------------------------------------------------------- docs table

def markdown_table() -> str:
    """The derived metrics as Markdown (docs/experiment-files.md "Analysis metrics")."""
    rows = ["| metric | unit | better | sides | meaning |", "|---|---|---|---|---|"]
    for m in DERIVED:
        sides = f"total: {COMBINE[m.combine]}" if m.side == "total" else m.side
        rows.append(f"| `{m.name}` | {m.unit} | {m.better or '–'} | {sides} | {m.help.replace('|', '/')} |")
    return "\n".join(rows)


def render_docs(text: str) -> str:
    """`text` with its `analysis-metrics` block replaced by markdown_table(); ValueError without one."""
    return replace_block(text, "analysis-metrics", markdown_table())


if __name__ == "__main__":   # python -m zcorch.metrics FILE: rewrite the generated block of FILE
    import sys

    from zcorch.params import rewrite_docs

    rewrite_docs(sys.argv[1], render_docs)
