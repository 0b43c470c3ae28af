"""The `baselines:` section: what the run stage (zcorch.sweep.baselines) measures before the cells.

    baselines:                      # not written: both kinds with their defaults (as the seeds did)
      iperf3: {duration: 2s, per: pair, omit: 0}     # `per: sweep` = once; `pair` = per (window, buffer)
      dd: {bs: 1MiB, count: 64, scratch: "{scratch}"}  # count may be size-like (512k blocks)
    baselines: false                # neither; `iperf3: false` / `dd: false` turn one off

`Baselines.iperf3` / `.dd` are None when that kind is off.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

from zcorch.config import checks
from zcorch.params import INT_MAX
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import SCRATCH_PLACEHOLDER, Checker

PER_CHOICES = ("pair", "sweep")
DD_MAX_BYTES = 64 * 1024 ** 3  # bs × count: the file dd writes (the host's free space is checked too)


@dataclass(frozen=True)
class Iperf3Baseline:
    """iperf3 between the hosts' data addresses (plain and -Z) before the cells."""

    duration: float = 2.0    # seconds (iperf3 -t, rounded up to whole seconds)
    per: str = "pair"        # "pair": once per distinct (window, buffer) of the cells; "sweep": once
    omit: int = 0            # iperf3 -O: seconds of slow start left out


@dataclass(frozen=True)
class DdBaseline:
    """dd write + read on the receiver, in each directory a sink lives in."""

    bs: int = 1024 ** 2
    count: int = 64
    # Where dd writes when the sink is a device (/dev/null): the per-user scratch directory by default (a
    # predictable name in a shared /tmp is anyone's to pre-create); may be {scratch}[/DIR] or a directory.
    scratch: str = SCRATCH_PLACEHOLDER


@dataclass(frozen=True)
class Baselines:
    iperf3: Optional[Iperf3Baseline] = Iperf3Baseline()
    dd: Optional[DdBaseline] = DdBaseline()

    def kinds(self) -> "list[tuple[str, Any]]":
        """[("iperf3", Iperf3Baseline | None), ("dd", DdBaseline | None)], in file order."""
        return [("iperf3", self.iperf3), ("dd", self.dd)]

    @classmethod
    def from_mapping(cls, data: "Mapping | bool | None", path: str = "<baselines>") -> "Baselines":
        """Validate plain data (as the section would be written) through the file's parser."""
        return checks.parse_data("baselines", data, parse_baselines, path)


BASELINES_OFF = Baselines(iperf3=None, dd=None)
_KINDS = {"iperf3": Iperf3Baseline, "dd": DdBaseline}


def _dd_count(node: ys.YNode) -> int:
    # dd reads `count=512k` as 512*1024 blocks, and the seeds wrote it so: accept a size-like count.
    n = ys.as_size(node, "a block count (e.g. 16384 or 512k)")
    if n < 1:
        raise ys.ValueProblem(f"expected a count ≥ 1, got `{node.text}`")
    return n


def _dd_scratch(node: ys.YNode) -> str:
    checks.unquoted_placeholder(node)
    text = ys.as_str(node, "a directory")
    if checks.dev_path(text):  # dd writes its file there: never among devices
        raise ys.ValueProblem(f"`{text}` is under /dev: the dd scratch directory must be a real directory "
                              f"(e.g. {SCRATCH_PLACEHOLDER})")
    return checks.placeholder_path(text, "dd scratch directory", (SCRATCH_PLACEHOLDER,), directory=True)


_PARSERS = {
    "iperf3": {
        "duration": checks.positive_duration,
        "per": lambda n: checks.choice(n, PER_CHOICES, "baseline frequency"),
        "omit": lambda n: checks.int_range(n, 0),
    },
    "dd": {
        "bs": lambda n: checks.positive_size(n, INT_MAX),
        "count": _dd_count,
        "scratch": _dd_scratch,
    },
}
assert all({f.name for f in fields(_KINDS[k])} == set(p) for k, p in _PARSERS.items())


def parse_baselines(chk: Checker, node: "ys.YNode | None") -> Baselines:
    """The `baselines:` node (None: not written); problems go to `chk`."""
    if checks.is_null(node):
        return Baselines()
    assert node is not None
    if checks.is_off(node):
        return BASELINES_OFF
    out = {kind: cls() for kind, cls in _KINDS.items()}
    for kind, (_, child) in chk.mapping(node, "baselines", tuple(_KINDS), "baseline kinds").items():
        path = f"baselines.{kind}"
        if checks.is_null(child):
            continue
        if isinstance(child, ys.YScalar) and child.tag == ys.BOOL and child.plain:
            if not chk.value(child, path, ys.as_bool, True):
                out[kind] = None
            continue
        values, nodes = {}, {}
        for key, (_, v) in chk.mapping(child, path, tuple(_PARSERS[kind]), f"{kind} settings").items():
            val = chk.value(v, f"{path}.{key}", _PARSERS[kind][key], None)
            if val is not None:
                values[key], nodes[key] = val, v
        out[kind] = replace(out[kind], **values)
        dd = out[kind]
        if isinstance(dd, DdBaseline) and dd.bs * dd.count > DD_MAX_BYTES:
            at = "count" if "count" in nodes else "bs" if "bs" in nodes else None
            chk.problem(nodes[at].pos if at else child.pos, f"{path}.{at}" if at else path,
                        f"bs × count = {dd.bs * dd.count} bytes, more than the limit of {DD_MAX_BYTES} "
                        f"(64GiB) for dd's file")
    return Baselines(**out)
