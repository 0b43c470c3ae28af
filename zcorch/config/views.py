"""The `report:` section: the views (small-multiple charts and their tables) the report draws: `x`, `hue` and
`facet` name parameters or linked axes, `metric` one of zcorch.metrics (docs/experiment-files.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from zcorch import metrics
from zcorch.config import yamlsrc as ys
from zcorch.config.checks import Checker, metric_name, suggest
from zcorch.params import PARAM_KEYS

SECTION_KEYS = ("views",)
VIEW_KEYS = ("x", "hue", "facet", "metric", "title")


@dataclass(frozen=True)
class View:
    x: "tuple[str, ...]"                 # one parameter, or linked ones whose combinations share the axis
    hue: "tuple[str, ...]" = ()
    facet: "tuple[str, ...]" = ()
    metric: str = "gbit_s"
    title: str = ""
    pos: ys.Pos = field(default=ys.Pos(0, 0), compare=False)


def _param(node: ys.YNode, axes: "Sequence[str]" = ()) -> str:
    name = ys.as_str(node, "a parameter name")
    if name not in PARAM_KEYS and name not in axes:
        known = list(PARAM_KEYS) + list(axes)
        also = f" or a linked axis of the matrix ({', '.join(axes)})" if axes else ""
        raise ys.ValueProblem(f"`{name}` is not a parameter{also}{suggest(name, known)}")
    return name


def _metric(node: ys.YNode) -> str:
    return metric_name(node, metrics.BY_NAME, "gbit_s, mb_s, send_host_busy_s_per_gib, send_stime_us")


def parse_report(chk: Checker, node: ys.YNode, axes: "Sequence[str]" = ()) -> "tuple[View, ...]":
    """The `report:` node's views; problems go to `chk`. `axes`: the linked axes' names, usable as parameters."""
    top = chk.mapping(node, "report", SECTION_KEYS, "report keys")
    if "views" not in top:
        return ()
    vnode = top["views"][1]
    if not isinstance(vnode, ys.YSeq):
        chk.problem(vnode.pos, "report.views", f"expected a list of views, got {ys.describe(vnode)}")
        return ()
    views = []
    for i, item in enumerate(vnode.items):
        path = f"report.views[{i}]"
        f = chk.mapping(item, path, VIEW_KEYS, "view keys")
        if not isinstance(item, ys.YMap):
            continue
        if "x" not in f:
            chk.problem(item.pos, path, "missing `x:` (the parameter along the horizontal axis)")
            continue
        x = _params(chk, f["x"][1], f"{path}.x", axes)
        hue = _params(chk, f["hue"][1], f"{path}.hue", axes) if "hue" in f else []
        facet = _params(chk, f["facet"][1], f"{path}.facet", axes) if "facet" in f else []
        metric = chk.value(f["metric"][1], f"{path}.metric", _metric) if "metric" in f else "gbit_s"
        title = chk.field(f, path, "title", ys.as_str, "")
        used = [*x, *hue, *facet]
        dup = sorted({p for p in used if used.count(p) > 1})
        if dup:
            chk.problem(item.pos, path, f"`{dup[0]}` is used twice: x, hue and facet must be different parameters")
            continue
        if x and metric and len(x) == len(f["x"][1].items if isinstance(f["x"][1], ys.YSeq) else [1]):
            views.append(View(tuple(x), tuple(hue), tuple(facet), metric, title or "", item.pos))
    return tuple(views)


def _params(chk: Checker, node: ys.YNode, path: str, axes: "Sequence[str]" = ()) -> "list[str]":
    """One parameter (or linked axis) name or a list of them."""
    items = node.items if isinstance(node, ys.YSeq) else [node]
    if isinstance(node, ys.YSeq) and not items:
        chk.problem(node.pos, path, "empty list: name at least one parameter")
    out = []
    for j, it in enumerate(items):
        name = chk.value(it, f"{path}[{j}]" if isinstance(node, ys.YSeq) else path, lambda n: _param(n, axes))
        if name:
            out.append(name)
    return out
