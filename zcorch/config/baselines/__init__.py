"""The `baselines:` section: what the sweep measures besides the cells, one module per kind (registry.py).
`Baselines` holds each kind's settings by name (None when off; `.commands`: a tuple).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, Mapping, Tuple

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines.commands import CommandBaseline  # noqa: F401
from zcorch.config.baselines.dd import DdBaseline  # noqa: F401
from zcorch.config.baselines.iperf3 import Iperf3Baseline  # noqa: F401
from zcorch.config.baselines.kind import BaselineKind
from zcorch.config.baselines.qperf import QperfBaseline  # noqa: F401
from zcorch.config.baselines.registry import BY_NAME, KINDS
from zcorch.config.checks import Checker


class _Baselines:
    """The settings of every registered kind (off: None, or ()): a frozen dataclass, one field per kind."""

    def __post_init__(self) -> None:
        for kind in KINDS:   # a list kind holds a tuple, whatever sequence it was given
            if isinstance(kind.off, tuple):
                object.__setattr__(self, kind.name, tuple(getattr(self, kind.name)))

    def get(self, name: str) -> Any:
        return getattr(self, name)

    def enabled(self) -> Iterator[Tuple[BaselineKind, Any]]:
        """(kind, settings) of every kind that runs, in registry order."""
        for kind in KINDS:
            conf = getattr(self, kind.name)
            if conf is not None and conf != ():
                yield kind, conf

    def kinds(self) -> "list[tuple[str, Any]]":
        """[(name, settings | None)] of the kinds with one settings block (not the list kinds), in order."""
        return [(k.name, getattr(self, k.name)) for k in KINDS if not isinstance(k.off, tuple)]

    @classmethod
    def from_mapping(cls, data: "Mapping | bool | None", path: str = "<baselines>") -> "Baselines":
        """Validate plain data (as the section would be written) through the file's parser."""
        return checks.parse_data("baselines", data, parse_baselines, path)


Baselines = dataclasses.make_dataclass(
    "Baselines", [(k.name, Any, dataclasses.field(default_factory=k.default)) for k in KINDS], bases=(_Baselines,),
    frozen=True)
Baselines.__module__ = __name__   # pickled and copied by its name here
Baselines.__doc__ = _Baselines.__doc__


BASELINES_OFF = Baselines(**{k.name: k.off for k in KINDS})


def parse_baselines(chk: Checker, node: "ys.YNode | None") -> Baselines:
    """The `baselines:` node (None: not written); problems go to `chk`."""
    if checks.is_null(node):
        return Baselines()
    assert node is not None
    if checks.is_off(node):
        return BASELINES_OFF
    if isinstance(node, ys.YMap) and not node.entries:
        # `{}` reads as "none" to some and as "the defaults" to others: neither is guessed
        chk.problem(node.pos, "baselines", "an empty mapping names no baseline: write `baselines: false` to run none, "
                                           "or leave the key out for the defaults (" + ", ".join(BY_NAME) + ")")
        return Baselines()
    out: Dict[str, Any] = {}
    for name, (_, child) in chk.mapping(node, "baselines", tuple(BY_NAME), "baseline kinds").items():
        if checks.is_null(child):
            continue
        out[name] = BY_NAME[name].parse(chk, child, f"baselines.{name}")
    return Baselines(**out)


def bind_cells(chk: Checker, baselines: Baselines, node: "ys.YNode | None", largest_bytes: "int | None") -> Baselines:
    """Each kind's settings bound to the cells (dd's `count: cells`); a problem goes to `chk` at its section."""
    out: Dict[str, Any] = {}
    for kind in KINDS:
        conf = baselines.get(kind.name)
        try:
            out[kind.name] = kind.bind_cells(conf, largest_bytes)
        except ys.ValueProblem as exc:
            at = node.get(kind.name) if isinstance(node, ys.YMap) else node
            chk.problem(at.pos if at is not None else ys.Pos(0, 0), f"baselines.{kind.name}", str(exc))
            out[kind.name] = conf
    return Baselines(**out)
