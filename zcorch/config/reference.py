"""The `reference:` section: what a published study reported (source, setup, baselines, figures, claims),
next to which zcorch measures the same cells (docs/experiment-files.md, "Reference: the published study").
A figure or claim `match:`es exactly one cell, or with `of: KIND` a baseline kind's records.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Optional, Sequence

from zcorch.config import checks
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines.registry import FIGURE_REFERENCE, KINDS
from zcorch.config.checks import Checker, suggest
from zcorch import conditions, metrics
from zcorch.params import CPU_MAX, PARAM_KEYS, format_value
from zcorch.units import convert, parse_quantity, unit_dimension

METRICS = metrics.QUANTITIES   # what a figure or claim may name: metrics whose unit converts
# zcorch's baseline record kinds a study's own baseline can stand for (those that read as a word)
BASELINE_KINDS = {rk: desc for kind in KINDS for rk, desc in kind.record_kinds.items() if rk in kind.words}


def baseline_match_keys(record_kind: str) -> "tuple[str, ...]":
    """The cell parameters a baseline record kind's records are matched on (dd: filesystem)."""
    return next((k.match_keys for k in KINDS if record_kind in k.record_kinds), ())


# `command:NAME`: the command baseline NAME of the experiment's `baselines.commands` (the study's FTP, rsync...)
COMMAND_KIND_PREFIX = "command:"
_COMMAND_KIND_RE = re.compile(r"^command:[A-Za-z][A-Za-z0-9_.-]{0,39}$")
SECTION_KEYS = ("source", "setup", "bytes", "baselines", "figures", "claims", "needs", "level", "units")
LEVEL = 0.90   # the confidence a claim's intervals must have to decide it, unless the study declares its own
SOURCE_KEYS = ("title", "author", "date", "url", "venue")
BASELINE_KEYS = ("value", "command")
FIGURE_KEYS = ("label", "match", "metric", "value", "baseline", "bytes", "of", "note")
CLAIM_KEYS = ("says", "metric", "a", "b", "holds_if", "note", "of", "needs")
_HOLDS_RE = re.compile(r"^\s*a\s*(<=|>=|<|>|≤|≥)\s*(?:(\d+(?:\.\d+)?)\s*[*×x]\s*)?b\s*$")
# `a >= 0.9`: a against a constant in the metric's unit (a per-page or per-call quantity, never a total)
_HOLDS_CONST_RE = re.compile(r"^\s*a\s*(<=|>=|<|>|≤|≥)\s*(\d+(?:\.\d+)?(?:e-?\d+)?)\s*$")
_OPS = {"≤": "<=", "≥": ">="}


@dataclass(frozen=True)
class Quantity:
    """A published number or range, in the unit it was written in."""

    low: float
    high: float
    unit: str

    @property
    def is_range(self) -> bool:
        return self.low != self.high

    def to(self, unit: str) -> "tuple[float, float]":
        return convert(self.low, self.unit, unit), convert(self.high, self.unit, unit)

    def __str__(self) -> str:
        num = f"{self.low:g}" if not self.is_range else f"{self.low:g}–{self.high:g}"
        return f"{num} {self.unit}".strip()


@dataclass(frozen=True)
class Condition:
    key: str
    op: str                 # "eq" (one value), "in" (any of values), "not" (none of values)
    values: tuple


@dataclass(frozen=True)
class Match:
    conditions: "tuple[Condition, ...]"
    pos: ys.Pos = field(default=ys.Pos(0, 0), compare=False)

    def selects(self, params: "dict[str, Any]") -> bool:
        """Whether a cell's parameters (a plan cell, or a row of a runs frame: NaN for null) satisfy it."""
        return all(any(format_value(c.key, params.get(c.key)) == format_value(c.key, v) for v in c.values)
                   != (c.op == "not") for c in self.conditions)

    def describe(self) -> str:
        parts = []
        for c in self.conditions:
            vals = [format_value(c.key, v) for v in c.values]
            if c.op == "eq":
                parts.append(f"{c.key}={vals[0]}")
            elif c.op == "in":
                parts.append(f"{c.key}∈{{{', '.join(vals)}}}")
            else:
                parts.append(f"{c.key}≠{'/'.join(vals)}")
        return ", ".join(parts) or "(every cell)"


@dataclass(frozen=True)
class Source:
    title: str
    author: str = ""
    date: str = ""
    url: str = ""
    venue: str = ""


@dataclass(frozen=True)
class PublishedBaseline:
    kind: str               # a BASELINE_KINDS key
    value: Quantity
    command: str = ""
    pos: ys.Pos = field(default=ys.Pos(0, 0), compare=False)


@dataclass(frozen=True)
class Figure:
    label: str
    match: Match
    metric: str
    value: Quantity
    baseline: Optional[str] = None   # the kind to normalise with (None: not normalised)
    bytes: Optional[int] = None      # what the study moved in that measurement (totals compare per byte)
    pos: ys.Pos = field(default=ys.Pos(0, 0), compare=False)
    of: Optional[str] = None         # a baseline record kind: the figure is of that baseline (None: of a cell)
    note: str = ""                   # why ours is not like the study's, shown beside the figure


@dataclass(frozen=True)
class Claim:
    says: str
    metric: str
    a: Match
    b: Optional[Match]      # None: a is compared with the constant `factor` (`holds_if: a >= 0.9`)
    op: str                 # "<", "<=", ">", ">="
    factor: float = 1.0     # holds if metric(a) op factor × metric(b), or op factor when b is None
    note: str = ""
    pos: ys.Pos = field(default=ys.Pos(0, 0), compare=False)
    of: Optional[str] = None         # a baseline record kind: both sides are that baseline's records
    # the conditions (zcorch.conditions) under which this machine can test it: (name, number or None)
    needs: "tuple[tuple[str, Optional[int]], ...]" = ()

    def need(self, name: str) -> bool:
        return any(n == name for n, _ in self.needs)

    @property
    def condition(self) -> str:
        if self.b is None:
            return f"a {self.op} {self.factor:g}"
        return f"a {self.op} {self.factor:g} × b" if self.factor != 1 else f"a {self.op} b"


@dataclass(frozen=True)
class Reference:
    source: Source
    setup: str = ""
    bytes: Optional[int] = None      # what the study moved per transfer (the figures' default `bytes`)
    baselines: "tuple[PublishedBaseline, ...]" = ()
    figures: "tuple[Figure, ...]" = ()
    claims: "tuple[Claim, ...]" = ()
    # the conditions of the study's setting (zcorch.conditions), already part of every claim's `needs`
    needs: "tuple[tuple[str, Optional[int]], ...]" = ()
    level: float = LEVEL             # the least confidence of an interval a claim is decided on
    units: str = ""                  # what the study's own units really are, where it mislabels them

    def baseline(self, kind: Optional[str]) -> Optional[PublishedBaseline]:
        return next((b for b in self.baselines if b.kind == kind), None)

    def matches_of(self) -> "list[tuple[str, Match, Optional[str]]]":
        """Every match with its label for messages (`figures[0]`) and the baseline kind it is `of`."""
        out = [(f"reference.figures[{i}]", f.match, f.of) for i, f in enumerate(self.figures)]
        for i, c in enumerate(self.claims):
            out += [(f"reference.claims[{i}].a", c.a, c.of)]
            out += [(f"reference.claims[{i}].b", c.b, c.of)] if c.b is not None else []
        return out


def _text(node: ys.YNode) -> str:
    text = ys.as_str(node, "text")
    checks.check_no_control(text.replace("\n", " "), "text")
    return text


def _quantity(node: ys.YNode) -> Quantity:
    if isinstance(node, ys.YScalar) and node.plain and node.tag in (ys.INT, ys.FLOAT):
        raise ys.ValueProblem(f"`{node.text}` has no unit: write e.g. `{node.text} MB/s` or `{node.text} s`")
    text = ys.as_str(node, "a quantity (e.g. 857 MB/s, 465-520 MB/s)")
    try:
        low, high, unit = parse_quantity(text)
    except ValueError as exc:
        raise ys.ValueProblem(str(exc)) from None
    return Quantity(low, high, unit)


def _metric(node: ys.YNode) -> str:
    return checks.metric_name(node, METRICS, "gbit_s, mb_s, send_stime_us, send_cpu_s_per_gib: "
                                             "docs/experiment-files.md, Reference")


def _holds_if(node: ys.YNode) -> "tuple[str, float, bool]":
    """(op, factor, against a constant)."""
    text = ys.as_str(node, "a condition like `a > b` or `a <= 0.5 * b`")
    m = _HOLDS_RE.match(text)
    const = _HOLDS_CONST_RE.match(text) if not m else None
    if const:
        return _OPS.get(const.group(1), const.group(1)), float(const.group(2)), True
    if not m:
        raise ys.ValueProblem(f"`{text}` is not a condition: write `a > b`, `a < b`, `a <= K * b` or `a >= K * b` "
                              "(K a positive number)")
    factor = float(m.group(2)) if m.group(2) else 1.0
    if factor <= 0:
        raise ys.ValueProblem(f"`{text}`: the factor must be > 0")
    return _OPS.get(m.group(1), m.group(1)), factor, False


def _parse_of(chk: Checker, fields_: dict, path: str, metric: Optional[str]) -> Optional[str]:
    """The `of:` of a figure or claim (None without); problems to `chk`: baseline records are rates."""
    if "of" not in fields_:
        return None
    of = chk.value(fields_["of"][1], f"{path}.of", lambda n: checks.choice(n, tuple(BASELINE_KINDS), "baseline kind"))
    if of and metric and not metrics.get(metric).rate:
        chk.problem(fields_["of"][1].pos, f"{path}.of", f"a baseline measures a throughput: `of: {of}` needs a "
                                                        f"rate metric (mb_s, gbit_s), not `{metric}`")
        return None
    return of


def parse_match(chk: Checker, node: ys.YNode, path: str, param_parser) -> Optional[Match]:
    """A `match:` mapping (parameter -> value | [values] | {not: value | [values]}); None if unusable."""
    if not isinstance(node, ys.YMap) or not node.entries:
        chk.problem(node.pos, path, f"expected a mapping of parameters to values (e.g. {{send_mode: splice}}), "
                                    f"got {'an empty mapping' if isinstance(node, ys.YMap) else ys.describe(node)}")
        return None
    conds, ok = [], True
    for key, (kpos, child) in node.entries.items():
        kpath = f"{path}.{key}"
        if key not in PARAM_KEYS:
            chk.problem(kpos, kpath, f"unknown parameter `{key}`{suggest(key, PARAM_KEYS)}")
            ok = False
            continue
        op, items = "eq", [child]
        if isinstance(child, ys.YMap):
            if list(child.entries) != ["not"]:
                chk.problem(child.pos, kpath, "a mapping here must be {not: value} or {not: [values]}")
                ok = False
                continue
            inner = child.entries["not"][1]
            op, items = "not", inner.items if isinstance(inner, ys.YSeq) else [inner]
        elif isinstance(child, ys.YSeq):
            op, items = "in", child.items
        if not items:
            chk.problem(child.pos, kpath, "empty list: name at least one value")
            ok = False
            continue
        values = []
        for item in items:
            try:
                values.append(param_parser(key, item))
            except ys.ValueProblem as exc:
                chk.problem(item.pos, kpath, str(exc))
                ok = False
        conds.append(Condition(key, op, tuple(values)))
    return Match(tuple(conds), node.pos) if ok else None


def parse_reference(chk: Checker, node: ys.YNode, param_parser) -> Optional[Reference]:
    """The `reference:` node; problems go to `chk`. `param_parser(key, node)` parses one parameter value."""
    top = chk.mapping(node, "reference", SECTION_KEYS, "reference keys")
    if not isinstance(node, ys.YMap):
        return None
    source = Source("")
    if "source" not in top:
        chk.problem(node.pos, "reference.source", "missing `source:` (title, author, date, url of the study)")
    else:
        src = chk.mapping(top["source"][1], "reference.source", SOURCE_KEYS, "source keys")
        vals = {k: chk.value(v, f"reference.source.{k}", checks.http_url if k == "url" else _text, "")
                for k, (_, v) in src.items()}
        if "title" not in src and isinstance(top["source"][1], ys.YMap):
            chk.problem(top["source"][1].pos, "reference.source", "missing `title:`")
        source = Source(**{k: vals.get(k, "") for k in SOURCE_KEYS})
    setup = chk.field(top, "reference", "setup", _text, "")
    nbytes = chk.field(top, "reference", "bytes", checks.positive_size)
    study_needs = _needs(chk, top["needs"][1], "reference.needs") if "needs" in top else ()
    level = chk.field(top, "reference", "level", _level, LEVEL)
    units = chk.field(top, "reference", "units", _text, "")

    baselines = []
    if "baselines" in top:
        # (not `node`: that is the whole section's, as `name` in the validator is the experiment's)
        section = top["baselines"][1]
        commands = tuple(k for k in getattr(section, "entries", {}) if _COMMAND_KIND_RE.match(str(k)))
        for kind, (_, child) in chk.mapping(section, "reference.baselines", (*BASELINE_KINDS, *commands),
                                            "zcorch baseline kinds, or command:NAME").items():
            path = f"reference.baselines.{kind}"
            fields_ = chk.mapping(child, path, BASELINE_KEYS, "published baseline keys")
            if not isinstance(child, ys.YMap):
                continue
            if "value" not in fields_:
                chk.problem(child.pos, path, "missing `value:` (e.g. 6.9 Gbit/s)")
                continue
            q = chk.value(fields_["value"][1], f"{path}.value", _quantity)
            if q is not None and unit_dimension(q.unit) != "rate":
                chk.problem(fields_["value"][1].pos, f"{path}.value", f"`{q}` is not a rate (e.g. MB/s, Gbit/s)")
                q = None
            cmd = chk.field(fields_, path, "command", _text, "")
            if q is not None:
                baselines.append(PublishedBaseline(kind, q, cmd, child.pos))
    kinds = {b.kind for b in baselines}

    figures = []
    for path, item, f in _records(chk, top, "figures", FIGURE_KEYS, "figure keys",
                                  lambda f: ("match", "metric", "value")):
        match = parse_match(chk, f["match"][1], f"{path}.match", param_parser)
        metric = chk.value(f["metric"][1], f"{path}.metric", _metric)
        value = chk.value(f["value"][1], f"{path}.value", _quantity)
        label = chk.field(f, path, "label", _text, "")
        if metric and value:
            unit = metrics.get(metric).unit
            try:
                value.to(unit)
            except ValueError as exc:
                chk.problem(f["value"][1].pos, f"{path}.value", f"`{value}` does not fit metric `{metric}` "
                                                               f"({unit}): {exc}")
                value = None
        base = None
        rate = bool(metric) and metrics.get(metric).rate   # a throughput: normalised to a baseline
        of = _parse_of(chk, f, path, metric)
        if of and "baseline" in f:
            chk.problem(f["baseline"][1].pos, f"{path}.baseline", f"a figure `of: {of}` is a baseline's "
                                                                  "own number: it is not normalised to another")
        elif of:
            pass       # (nor to FIGURE_REFERENCE: a baseline's own number is no share of another's)
        elif "baseline" in f:
            base = chk.value(f["baseline"][1], f"{path}.baseline",
                             lambda n: checks.choice(n, (*BASELINE_KINDS, *sorted(k for k in kinds if k.startswith(
                                 COMMAND_KIND_PREFIX))), "baseline kind"))
            if base and base not in kinds:
                chk.problem(f["baseline"][1].pos, f"{path}.baseline",
                            f"`{base}`: the reference gives no published `{base}` under `baselines:`")
                base = None
        elif rate and FIGURE_REFERENCE in kinds:
            base = FIGURE_REFERENCE
        if base and not rate:
            chk.problem(f["baseline"][1].pos, f"{path}.baseline",
                        f"only throughput figures (gbit_s, mb_s) are normalised to a baseline, not `{metric}`")
            base = None
        fbytes = chk.value(f["bytes"][1], f"{path}.bytes", checks.positive_size) if "bytes" in f else nbytes
        fnote = chk.field(f, path, "note", _text, "")
        if match and metric and value:
            figures.append(Figure(label, match, metric, value, base, fbytes, item.pos, of, fnote or ""))

    claims = []
    for path, item, c in _records(chk, top, "claims", CLAIM_KEYS, "claim keys", _claim_keys):
        says = chk.value(c["says"][1], f"{path}.says", _text, "")
        metric = chk.value(c["metric"][1], f"{path}.metric", _metric)
        a = parse_match(chk, c["a"][1], f"{path}.a", param_parser)
        b = parse_match(chk, c["b"][1], f"{path}.b", param_parser) if "b" in c else None
        cond = chk.value(c["holds_if"][1], f"{path}.holds_if", _holds_if)
        note = chk.field(c, path, "note", _text, "")
        of = _parse_of(chk, c, path, metric)
        needs = _needs(chk, c["needs"][1], f"{path}.needs") if "needs" in c else ()
        if cond and cond[2] and "b" in c:
            chk.problem(c["b"][1].pos, f"{path}.b", f"`holds_if: {c['holds_if'][1].text}` compares a with a "
                                                    "constant: a claim with one has no `b`")
        elif cond and cond[2] and metric and metrics.get(metric).extensive:
            chk.problem(c["holds_if"][1].pos, f"{path}.holds_if",
                        f"`{metric}` is a total that grows with the bytes moved: compare a per-page or per-call "
                        "metric with a constant (e.g. send_minflt_per_page), or a total with another cell's")
        elif a and b and a == b:
            chk.problem(c["b"][1].pos, f"{path}.b", "`b` matches the same as `a`: a claim compares two cells")
        elif says is not None and metric and a and (b or (cond and cond[2])) and cond:
            claims.append(Claim(says, metric, a, b, cond[0], cond[1], note, item.pos, of, needs))
    study_needs = _study_needs(study_needs, claims)
    claims = [replace(c, needs=study_needs + tuple(n for n in c.needs if n[0] not in dict(study_needs)))
              for c in claims]
    return Reference(source, setup or "", nbytes, tuple(baselines), tuple(figures), tuple(claims),
                     study_needs, level if level is not None else LEVEL, units or "")


def _study_needs(declared, claims) -> "tuple[tuple[str, Optional[int]], ...]":
    """The study's `reference.needs` plus every host condition any claim names: they apply to all claims."""
    out = list(declared)
    for c in claims:
        out += [n for n in c.needs if conditions.BY_NAME[n[0]].study and n[0] not in dict(out)]
    return tuple(out)


def _level(node: ys.YNode) -> float:
    """`level: 90%` (or 0.9): between 50% and 99.9%."""
    text = ys.as_str(node, "a confidence level (e.g. 90%)").strip()
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ys.ValueProblem(f"`{text}` is not a confidence level (e.g. 90%)") from None
    if not 0.5 <= value < 1:
        raise ys.ValueProblem(f"`{text}`: a confidence level is between 50% and 99.9%")
    return value


def _needs(chk: Checker, node: ys.YNode, path: str) -> "tuple[tuple[str, Optional[int]], ...]":
    """`needs: [idle_hosts, cpus]` or `[{cpus: 3}]`: condition names of zcorch.conditions, each once."""
    out: "list[tuple[str, Optional[int]]]" = []
    for i, item in enumerate(_items(chk, node, path)):
        ipath = f"{path}[{i}]"
        number = None
        if isinstance(item, ys.YMap):
            if len(item.entries) != 1:
                chk.problem(item.pos, ipath, "a mapping here names one condition and its number, e.g. {cpus: 3}")
                continue
            name, (kpos, child) = next(iter(item.entries.items()))
            spec = conditions.BY_NAME.get(name)
            if spec is not None and spec.takes is None:
                chk.problem(kpos, ipath, f"`{name}` takes no number: write it as a plain name")
                continue
            number = chk.value(child, f"{ipath}.{name}", lambda n: checks.int_range(n, 1, CPU_MAX + 1))
            if number is None:
                continue
            pos = kpos
        else:
            name = chk.value(item, ipath, lambda n: ys.as_str(n, "a condition name"))
            if name is None:
                continue
            pos = item.pos
        if name not in conditions.BY_NAME:
            chk.problem(pos, ipath, f"`{name}` is not a condition{suggest(name, conditions.NAMES)} "
                                    f"(one of {', '.join(conditions.NAMES)}: docs/experiment-files.md, Reference)")
        elif any(n == name for n, _ in out):
            chk.problem(pos, ipath, f"`{name}` is named twice")
        else:
            out.append((name, number))
    return tuple(out)


def _claim_keys(c: dict) -> "tuple[str, ...]":
    """The keys a claim needs: `b` too unless `holds_if` compares `a` with a constant."""
    const = "holds_if" in c and bool(_HOLDS_CONST_RE.match(str(getattr(c["holds_if"][1], "text", ""))))
    return ("says", "metric", "a", "holds_if") + (() if const else ("b",))


def _records(chk: Checker, top: dict, key: str, keys: "tuple[str, ...]", what: str,
             required: "Callable[[dict], Sequence[str]]") -> "Iterator[tuple[str, ys.YMap, dict]]":
    """(path, node, checked fields) of each good entry of the list `reference.<key>`; problems go to `chk`."""
    if key not in top:
        return
    for i, item in enumerate(_items(chk, top[key][1], f"reference.{key}")):
        path = f"reference.{key}[{i}]"
        fields = chk.mapping(item, path, keys, what)
        missing = [k for k in required(fields) if k not in fields]
        if isinstance(item, ys.YMap) and missing:
            chk.problem(item.pos, path, f"missing {', '.join(f'`{k}:`' for k in missing)}")
        elif isinstance(item, ys.YMap):
            yield path, item, fields


def _items(chk: Checker, node: ys.YNode, path: str) -> list:
    if not isinstance(node, ys.YSeq):
        chk.problem(node.pos, path, f"expected a list, got {ys.describe(node)}")
        return []
    return node.items


# ---------------------------------------------------------------- against the expanded cells

def reference_problems(ref: Reference, cells: "list[dict]") -> "list[tuple[ys.Pos, str, str]]":
    """(pos, key, message) for every match that selects no cell or more than one of `cells` (parameter dicts);
    a match `of` a baseline kind may select several cells that agree on the kind's match keys."""
    out = []
    for label, match, of in ref.matches_of():
        hits = [p for p in cells if match.selects(p)]
        if len(hits) == 1:
            continue
        keys = baseline_match_keys(of) if of else ()
        if not hits:
            out.append((match.pos, label, f"{match.describe()} selects no cell of the experiment"))
        elif of:
            differ = [k for k in keys if len({format_value(k, h.get(k)) for h in hits}) > 1]
            if differ:
                out.append((match.pos, label, f"{match.describe()} selects cells of different "
                                              f"{' and '.join(f'`{k}`' for k in differ)}: `of: {of}` needs one "
                                              f"configuration (add {' or '.join(f'`{k}`' for k in differ)})"))
        else:
            differ = [k for k in PARAM_KEYS if len({format_value(k, h.get(k)) for h in hits}) > 1]
            out.append((match.pos, label, f"{match.describe()} selects {len(hits)} cells; one is needed: "
                                          f"add {' or '.join(f'`{k}`' for k in differ[:3])} to tell them apart"))
    for i, claim in enumerate(ref.claims):
        # idle_hosts is checked on what the workers' probe records: a cell without one could never meet it
        if claim.need("idle_hosts"):
            unprobed = [m for m in (claim.a, claim.b) if m is not None
                        for p in cells if m.selects(p) and not p.get("idle_probe")]
            if unprobed:
                out.append((claim.pos, f"reference.claims[{i}].needs",
                            f"idle_hosts is checked on each run's `host_idle_before`, which a cell records only "
                            f"with `idle_probe` set: {unprobed[0].describe()} has none (e.g. params: "
                            "{idle_probe: 200ms})"))
    return out
