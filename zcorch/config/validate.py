"""The experiment validator: `Validator(path).experiment(root, text)` checks every top-level key of a parsed
document against the schema and returns the `Experiment`, collecting every problem (`file:line:column: key:
message`); sections with their own schema are parsed by their modules through the same Checker.
"""
from __future__ import annotations

import math
import re
from typing import Any, Optional, Sequence

from zcorch.config import yamlsrc as ys
from zcorch.config.baselines import bind_cells, parse_baselines
from zcorch.config.baselines.kind import NETWORK
from zcorch.config.baselines.registry import BY_NAME, KINDS
from zcorch.config.checks import CONTROL_RE, NAME_RE, NAME_RULE, Checker, suggest
from zcorch.config.checks import choice as _choice
from zcorch.config.checks import dev_path as _dev_path
from zcorch.config.checks import int_range as _int_range
from zcorch.config.checks import join as _join
from zcorch.config.filesystems import device_list, parse_filesystems
from zcorch.config.hosts import INVENTORY, LOCALHOST, Hosts, parse_hosts
from zcorch.config.inventory import InventoryPair
from zcorch.config.networks import parse_networks
from zcorch.config.param_values import parse_param
from zcorch.config.reference import COMMAND_KIND_PREFIX, parse_reference
from zcorch.config.schema import (DEFAULT_CALIBRATION_MAX_AGE_S, LABEL_KEY, MAX_REPEATS, MAX_RUNS, ORDERS, REPEAT_POLICY_KEYS, RESERVED_AXIS_NAMES,
                                  TOP_KEYS, Axis, Experiment, RepeatPolicy, amount_of, default_label, include_base,
                                  largest_bytes, writes_bytes)
from zcorch.config.views import parse_report
from zcorch.params import PARAM_KEYS, format_value, param

# A linked axis (matrix entry that is not a parameter) names a results column: letters, digits, `_`.
_AXIS_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")


def _same(a: Any, b: Any) -> bool:
    # `True == 1` in Python: a boolean never equals an integer here
    return type(a) is type(b) and a == b


class Validator(Checker):
    """Checks one experiment document's tree; every problem found stays in `problems`."""

    def __init__(self, path: str, hosts: Optional[InventoryPair] = None, overrides: "Sequence[str]" = (),
                 unknown_hosts: bool = False):
        super().__init__(path)
        self.given_hosts = hosts  # --hosts: replaces the file's `hosts:` (which is still checked)
        self.unknown_hosts = unknown_hosts  # `zcorch plan` of a `hosts: inventory` file without --hosts
        self.overrides = tuple(overrides)  # the --set texts applied to the tree (kept in the Experiment)
        # `filesystem`/`network` values as (pos, key path, name), checked once every section entry is known
        self.refs: "dict[str, list[tuple[ys.Pos, str, str]]]" = {"filesystem": [], "network": []}
        self.names: "dict[str, list[str]]" = {"filesystem": [], "network": []}
        self.allow_destroy: "tuple[str, ...]" = ()  # read before the parameters: the sink rule needs it
        self.linked: "list[Axis]" = []  # the matrix's linked axes (exclude entries may name them)

    def experiment(self, root: ys.YNode, text: str) -> Experiment:
        if not isinstance(root, ys.YMap):
            self.problem(root.pos, "", f"expected a mapping (name:, params:, matrix: ...), got {ys.describe(root)}")
            return None  # type: ignore[return-value]
        top = self.mapping(root, "", TOP_KEYS, "top-level keys")
        self.locations.update((key, kpos) for key, (kpos, _) in top.items())

        def get(key):
            return top.get(key, (None, None))[1]

        name = "?"
        if "name" not in top:
            self.problem(root.pos, "name", "missing required key `name` (it names the results directory)")
        else:
            name = self.value(get("name"), "name", self._name, "?")
        description = self.field(top, "", "description", ys.as_str, "")
        file_hosts = parse_hosts(self, get("hosts"), inventory_ok=True) if "hosts" in top else LOCALHOST
        hosts = LOCALHOST if file_hosts is None else file_hosts
        if self.given_hosts is not None:
            hosts = self.given_hosts.hosts
        elif file_hosts is None and not self.unknown_hosts:
            self.problem(get("hosts").pos, "hosts",
                         f"`{INVENTORY}`: this experiment runs on two hosts you name when you run it: "
                         "`zcorch run FILE --hosts INVENTORY[:PAIR]` (or set ZCORCH_HOSTS=INVENTORY[:PAIR]); "
                         "`zcorch lab inventory` prints the inventory of the lab (docs/experiment-files.md, "
                         "Inventory files)")
        if "allow_destroy" in top:
            self.allow_destroy = tuple(device_list(self, get("allow_destroy"), "allow_destroy", allow_empty=True)
                                       or ())
        named = {}
        for key, parse in (("filesystem", parse_filesystems), ("network", parse_networks)):
            node = get(key + "s")
            self.names[key] = list(node.entries) if isinstance(node, ys.YMap) else []
            named[key] = parse(self, node) if node is not None else {}
        filesystems, networks = named["filesystem"], named["network"]
        allow_net = self.field(top, "", "allow_network_changes", ys.as_bool, False)
        params = self.params(get("params"), "params") if "params" in top else {}
        matrix = self.matrix(get("matrix")) if "matrix" in top else []
        self.linked = [a for a in matrix if a.linked]
        exclude = self.exclude(get("exclude")) if "exclude" in top else []
        include_raw = self.include(get("include")) if "include" in top else []
        policy = self.repeats(get("repeats")) if "repeats" in top else None
        repeats = policy if isinstance(policy, int) else policy.max if policy is not None else 1
        policy = policy if isinstance(policy, RepeatPolicy) else None
        order = self.field(top, "", "order", lambda n: _choice(n, ORDERS, "run order"), "sequential")
        control = self.control(get("control")) if "control" in top else None
        if control is not None:
            order = self._control_order(order, "order" in top, get("order"), policy, get("repeats"))
        seed = self.field(top, "", "seed", lambda n: _int_range(n, 0), 0)
        skip_invalid = self.field(top, "", "skip_invalid", ys.as_bool, False)
        cal_age = self.field(top, "", "calibration_max_age", ys.as_duration, DEFAULT_CALIBRATION_MAX_AGE_S)
        baselines = parse_baselines(self, get("baselines"))
        if isinstance(control, str):
            self._control_baseline(control, get("control"), baselines, get("baselines"))
        reference = parse_reference(self, get("reference"), parse_param) if "reference" in top else None
        if reference is not None and baselines.commands:  # (none at all: e.g. --set baselines=false)
            names = [c.name for c in baselines.commands]
            for b in reference.baselines:  # (not `name`: that is the experiment's)
                command = b.kind[len(COMMAND_KIND_PREFIX):] if b.kind.startswith(COMMAND_KIND_PREFIX) else None
                if command is not None and command not in names:
                    self.problem(b.pos, f"reference.baselines.{b.kind}", f"no command baseline `{command}` in "
                                 f"baselines.commands{suggest(command, names)} (there: {', '.join(names)})")
        views = parse_report(self, get("report"), tuple(a.key for a in matrix if a.linked)) if "report" in top else ()
        # Counted from the axis lengths, before anything is expanded (excludes can only lower it).
        n_cells = math.prod(len(axis.values) for axis in matrix) + len(include_raw)
        if n_cells * repeats > MAX_RUNS:
            where = "matrix" if "matrix" in top else "repeats" if "repeats" in top else "include"
            self.problem(self.locations[where], where, f"{n_cells} cells × {repeats} repeats = "
                                                       f"{n_cells * repeats} runs, more than the limit of {MAX_RUNS}")

        for what, refs in self.refs.items():
            names = self.names[what]
            for pos, key, ref in refs:   # (not `name`: that is the experiment's)
                if ref is not None and ref not in names:
                    defined = ", ".join(names) or f"none: add a `{what}s:` section"
                    self.problem(pos, key, f"`{ref}` is not a {what} defined under `{what}s:`"
                                           f"{suggest(ref, names)} (defined: {defined})")

        # (`hosts: inventory` without --hosts: the hosts are unknown, and that problem is already reported)
        self._check_networks(hosts, allow_net, hosts_known=file_hosts is not None or self.given_hosts is not None)

        base = include_base(params, matrix)
        include: "list[dict]" = []
        multi = {axis.key: axis for axis in matrix if len(axis.values) > 1}
        for i, (pos, entry) in enumerate(include_raw):
            missing = [k for k, axis in multi.items() if any(p not in entry for p in axis.params)]
            if missing:
                axes = "; ".join(f"`{k}` ({', '.join(format_value(k, v) for v in multi[k].values)})"
                                 if not multi[k].linked else
                                 f"the linked axis `{k}` ({', '.join(multi[k].params)}: {'; '.join(multi[k].labels)})"
                                 for k in missing)
                self.problem(pos, f"include[{i}]", f"does not set {axes}, which the matrix varies; an include "
                                                   "adds one cell, so set every varying axis explicitly")
            include.append(amount_of({**base, **entry}, "bytes" in entry or writes_bytes(params, matrix)))
        # settings sized by the cells (dd's `count: cells`): bound now, so --set bytes=... scales them too
        baselines = bind_cells(self, baselines, get("baselines"), largest_bytes(params, matrix, include))
        return Experiment(name=name, description=description, path=self.path, text=text, hosts=hosts,
                          params=params, matrix=matrix, exclude=exclude, include=include, baselines=baselines,
                          filesystems=filesystems, repeats=repeats, repeat_policy=policy, order=order, seed=seed,
                          skip_invalid=skip_invalid, locations=dict(self.locations),
                          allow_destroy=self.allow_destroy, hosts_required=file_hosts is None,
                          inventory=self.given_hosts, overrides=self.overrides,
                          reference=reference, views=views, networks=networks, allow_network_changes=allow_net,
                          calibration_max_age=cal_age, control=control)

    def _check_networks(self, hosts: Hosts, allow_all: bool, hosts_known: bool = True) -> None:
        """The hosts let the `network` values change their network."""
        used = [r for r in self.refs["network"] if r[2] is not None]
        if not used or allow_all or not hosts_known:
            return
        pos, key, _ = used[0]
        if hosts.localhost:
            self.problem(pos, key, "a `network` changes the MTU of the loopback device and net.* sysctls, "
                                   "which every program on this machine shares: allow it explicitly with "
                                   "`allow_network_changes: true` at the top of the file (the values are "
                                   "restored after the cells)")
            return
        refused = [r for r in ("sender", "receiver") if not hosts.spec(r).allow_network_changes]
        if refused:
            self.problem(pos, key, f"a `network` changes the data link's MTU and net.* sysctls on both hosts, "
                                   f"but {' and '.join(refused)} ({', '.join(hosts.spec(r).ssh for r in refused)}) "
                                   "did not allow it: add `allow_network_changes: true` to the host (hosts "
                                   "section or inventory; `zcorch lab inventory` has it) or at the top of the file")

    def repeats(self, node: ys.YNode) -> "int | RepeatPolicy":
        """`repeats: N` (every cell N times) or `repeats: {min, max, target_ci}` (until stable, RepeatPolicy)."""
        if not isinstance(node, ys.YMap):
            return self.value(node, "repeats", lambda n: _int_range(n, 1, MAX_REPEATS), 1)
        fields = self.mapping(node, "repeats", REPEAT_POLICY_KEYS, "the repeat policy")
        missing = [k for k in REPEAT_POLICY_KEYS if k not in fields]
        if missing:
            self.problem(node.pos, "repeats", f"missing {', '.join(f'`{k}`' for k in missing)}: repeat until stable "
                                              "needs all of min, max and target_ci (e.g. {min: 3, max: 30, "
                                              "target_ci: 2%}); for a fixed count write `repeats: N`")
        lo = self.field(fields, "repeats", "min", lambda n: _int_range(n, 1, MAX_REPEATS))
        hi = self.field(fields, "repeats", "max", lambda n: _int_range(n, 1, MAX_REPEATS))
        target = self.field(fields, "repeats", "target_ci", _percentage)
        if lo is not None and hi is not None and hi < lo:
            self.problem(fields["max"][1].pos, "repeats.max", f"{hi} is below repeats.min ({lo})")
            return 1
        return 1 if None in (lo, hi, target) else RepeatPolicy(lo, hi, target)

    def control(self, node: ys.YNode) -> "Optional[dict | str]":
        """`control: {parameter or linked axis: value}` (the cell every other is divided by, run by run) or
        `control: <kind>` (a network baseline kind run once every round); None when invalid."""
        if isinstance(node, ys.YScalar) and not node.is_null:
            kinds = [k.name for k in NETWORK_KINDS]
            if node.text in kinds:
                return node.text
            what = ("a baseline kind that does not measure the path alone" if node.text in BY_NAME
                    else f"not a baseline kind{suggest(node.text, kinds)}")
            self.problem(node.pos, "control", f"`{node.text}` is {what}: `control:` names a network baseline kind "
                                              f"({', '.join(kinds)}: its test runs once in every round) or a cell "
                                              "of the matrix by its parameters, e.g. "
                                              "`control: {send_mode: write, recv_mode: read}`")
            return None
        if not isinstance(node, ys.YMap):
            self.problem(node.pos, "control", f"expected a mapping of parameters naming one cell of the matrix "
                                              f"(e.g. {{send_mode: write, recv_mode: read}}), got {ys.describe(node)}")
            return None
        if not node.entries:
            self.problem(node.pos, "control", "empty: name the control cell by its parameters "
                                              "(e.g. {send_mode: write, recv_mode: read})")
            return None
        linked = {a.key: a for a in self.linked}
        out: dict = {}
        ok = True
        for key, (kpos, child) in node.entries.items():
            path = f"control.{key}"
            if key in linked:
                value = self.value(child, path, lambda n, a=linked[key]: _label_of_axis(n, a), _INVALID)
            elif key in PARAM_KEYS:
                if isinstance(child, (ys.YSeq, ys.YMap)):
                    self.problem(child.pos, path, f"expected one value of `{key}` (the control is one cell), "
                                                  f"got {ys.describe(child)}")
                    value = _INVALID
                else:
                    value = self.param(key, child, path)
            else:
                names = PARAM_KEYS + tuple(linked)
                self.problem(kpos, path, f"unknown key `{key}`{suggest(key, names)} (the control is named by "
                                         "parameters of its cell, or a linked axis and one of its labels)")
                value = _INVALID
            if value is _INVALID:
                ok = False
            else:
                out[key] = value
        return out if ok else None

    def _control_baseline(self, kind: str, node: ys.YNode, baselines: Any, section: Optional[ys.YNode]) -> None:
        """`control: <kind>` runs that kind's test with its settings under `baselines:`: the kind must be on."""
        if baselines.get(kind) is not None:
            return
        where = f" (`baselines:` at line {section.pos.line})" if section is not None and section.pos.source is None \
            else " (it is off unless written under `baselines:`)" if section is None else ""
        self.problem(node.pos, "control", f"`{kind}`: control: {kind} runs the {kind} baseline's test in every "
                                          f"round, but that baseline is not on{where}: add `{kind}: true` (or "
                                          f"its settings, e.g. `{kind}: {{duration: 1s}}`) under `baselines:`")

    def _control_order(self, order: str, written: bool, order_node: Optional[ys.YNode], policy,
                       repeats_node: Optional[ys.YNode]) -> str:
        """The run order with a control: every round visits every cell (`sequential` is refused)."""
        if written and order == "sequential":
            self.problem(order_node.pos, "order", "`sequential` runs every repeat of a cell before the next cell, "
                                                  "so the control's runs would be minutes away from the runs "
                                                  "divided by them: with `control:` write `order: interleave` "
                                                  "(the default with a control) or `order: shuffle`")
        if isinstance(policy, RepeatPolicy):
            self.problem(repeats_node.pos, "repeats", "`repeats: {min, max, target_ci}` stops each cell at its "
                                                      "own round, so later rounds would lack the control: with "
                                                      "`control:` write a fixed `repeats: N`")
        return order if written else "interleave"

    @staticmethod
    def _name(node: ys.YNode) -> str:
        text = ys.as_str(node, "a name")
        if not NAME_RE.match(text):
            raise ys.ValueProblem(f"`{text}` is not a valid name: it names the results directory, so use "
                                  f"{NAME_RULE} (at most 100, not starting with `.`/`-`)")
        return text

    def param(self, key: str, node: ys.YNode, path: str) -> Any:
        value = self.value(node, path, lambda n: parse_param(key, n), _INVALID)
        if isinstance(value, str) and param(key).kind == "path":
            dev = _dev_path(value)
            allowed = param(key).devices + (self.allow_destroy if key == "sink" else ())
            if dev is not None and dev not in allowed:
                extra = " or a device listed in the top-level `allow_destroy:`" if key == "sink" else ""
                self.problem(node.pos, path, f"`{value}` is under /dev: the {key} may only be "
                                             f"{', '.join(param(key).devices)}{extra} (or a file)")
                return _INVALID
        if key in self.refs and value is not _INVALID:
            self.refs[key].append((node.pos, path, value))
        return value

    def params(self, node: ys.YNode, path: str) -> dict:
        fields = self.mapping(node, path, PARAM_KEYS, "parameters")
        values = {key: self.param(key, child, _join(path, key)) for key, (_, child) in fields.items()}
        return {key: value for key, value in values.items() if value is not _INVALID}

    def matrix(self, node: ys.YNode) -> "list[Axis]":
        axes: "list[Axis]" = []
        if isinstance(node, ys.YScalar) and node.is_null:
            return axes
        if not isinstance(node, ys.YMap):
            self.problem(node.pos, "matrix", f"expected a mapping of parameters (or linked axes) to lists of "
                                             f"values, got {ys.describe(node)}")
            return axes
        for key, (kpos, child) in node.entries.items():
            path = f"matrix.{key}"
            if key not in PARAM_KEYS and not _is_linked(child):
                self.problem(kpos, path, f"unknown key `{key}`{suggest(key, PARAM_KEYS)} (expected a parameter: "
                                         f"{', '.join(PARAM_KEYS)}; or a linked axis: a name of your own with a "
                                         "list of mappings of parameters)")
                continue
            if not isinstance(child, ys.YSeq):
                self.problem(child.pos, path, f"expected a list of values (e.g. [{_example(child)}]), "
                                              f"got {ys.describe(child)}")
                continue
            if not child.items:
                self.problem(child.pos, path, "empty list: an axis needs at least one value")
                continue
            if key not in PARAM_KEYS:
                axis = self.linked_axis(key, kpos, child)
                if axis is not None:
                    axes.append(axis)
                continue
            values, seen = [], {}
            for i, item in enumerate(child.items):
                if isinstance(item, ys.YMap):
                    self.problem(item.pos, f"{path}[{i}]", f"`{key}` is a parameter: its values are single values; "
                                                           "to set parameters together, give the linked axis a name "
                                                           "of its own (docs/experiment-files.md, Linked axes)")
                    continue
                value = self.param(key, item, f"{path}[{i}]")
                if value is _INVALID:
                    continue
                hkey = (type(value), value)
                if hkey in seen:
                    self.problem(item.pos, f"{path}[{i}]", f"duplicate value (same as {path}[{seen[hkey]}])")
                    continue
                seen[hkey] = i
                values.append(value)
            if values:
                axes.append(Axis(key, values, kpos))
        # a parameter is set by one axis only (a plain one, or one linked axis)
        owner: "dict[str, str]" = {}
        for axis in axes:
            for p in axis.params:
                if p in owner:
                    self.problem(axis.pos, f"matrix.{axis.key}",
                                 f"`{p}` is set by two axes (`matrix.{owner[p]}` and `matrix.{axis.key}`): a parameter "
                                 "belongs to one axis; put its values in one of them")
                else:
                    owner[p] = axis.key
        return axes

    def linked_axis(self, name: str, kpos: ys.Pos, node: ys.YSeq) -> Optional[Axis]:
        """A linked axis `name: [{param: value, ...}, ...]` (each value may carry a `label:`)."""
        path = f"matrix.{name}"
        ok = True
        if not _AXIS_NAME_RE.match(name) or name in RESERVED_AXIS_NAMES or name.startswith(("send_", "recv_")):
            self.problem(kpos, path, f"`{name}` cannot name a linked axis: it becomes a column of the results, so use "
                                     "letters, digits and `_` (starting with a letter), not a column zcorch already "
                                     f"has ({', '.join(RESERVED_AXIS_NAMES)}, send_*, recv_*, metric names)")
            ok = False
        values: "list[dict]" = []
        labels: "list[str]" = []
        written: "list[Optional[str]]" = []
        keys: Optional["tuple[str, ...]"] = None
        for i, item in enumerate(node.items):
            ipath = f"{path}[{i}]"
            if not isinstance(item, ys.YMap):
                self.problem(item.pos, ipath, f"expected a mapping of parameters (e.g. {{send_cpu: 0, recv_cpu: 1}}): "
                                              f"every value of the linked axis `{name}` sets its parameters together, "
                                              f"got {ys.describe(item)}")
                ok = False
                continue
            value: dict = {}
            label: Optional[str] = None
            for key, (pos, child) in item.entries.items():
                if key == LABEL_KEY:
                    label = self.value(child, f"{ipath}.{key}", _axis_label, None)
                    ok = ok and label is not None
                    continue
                if key not in PARAM_KEYS:
                    self.problem(pos, f"{ipath}.{key}", f"unknown parameter `{key}`{suggest(key, PARAM_KEYS)} "
                                                        f"(a linked axis sets parameters; `{LABEL_KEY}:` names a value)")
                    ok = False
                    continue
                v = self.param(key, child, f"{ipath}.{key}")
                if v is _INVALID:
                    ok = False
                    continue
                value[key] = v
            if not value and ok:
                self.problem(item.pos, ipath, "sets no parameter: a value of a linked axis sets at least one")
                ok = False
                continue
            if keys is None:
                keys = tuple(value)
            elif set(value) != set(keys) and ok:
                missing = [k for k in keys if k not in value]
                extra = [k for k in value if k not in keys]
                what = "; ".join(x for x in (f"lacks {', '.join(missing)}" if missing else "",
                                             f"adds {', '.join(extra)}" if extra else "") if x)
                self.problem(item.pos, ipath, f"{what}: every value of a linked axis sets the same parameters "
                                              f"({', '.join(keys)}, as `{path}[0]`); write null for a parameter "
                                              "left unset (its default)")
                ok = False
                continue
            value = {k: value[k] for k in keys}  # the first value's order
            dup = next((j for j, other in enumerate(values) if all(_same(other[k], value[k]) for k in keys)), None)
            if dup is not None:
                self.problem(item.pos, ipath, f"duplicate value (the same parameters as {path}[{dup}])")
                ok = False
                continue
            values.append(value)
            written.append(label)
        if not ok or not values:
            return None
        labels = [w if w is not None else default_label(v) for w, v in zip(written, values)]
        for j, label in enumerate(labels):
            if labels.index(label) != j:
                self.problem(node.items[j].pos, f"{path}[{j}]", f"duplicate label `{label}` (also "
                                                                f"{path}[{labels.index(label)}]): labels name the values")
                return None
        return Axis(name, values, kpos, linked=True, labels=labels)

    def exclude(self, node: ys.YNode) -> "list[dict]":
        out = []
        if not isinstance(node, ys.YSeq):
            self.problem(node.pos, "exclude", f"expected a list of mappings, got {ys.describe(node)}")
            return out
        linked = {a.key: a for a in self.linked}
        for i, entry in enumerate(node.items):
            path = f"exclude[{i}]"
            self.locations[path] = entry.pos
            fields = self.mapping(entry, path, PARAM_KEYS + tuple(linked), "parameters or linked axes")
            if isinstance(entry, ys.YMap) and not entry.entries:
                self.problem(entry.pos, path, "empty entry would exclude every cell")
            match = {}
            for key, (_, child) in fields.items():
                items = child.items if isinstance(child, ys.YSeq) else [child]
                kpath = _join(path, key)
                if key in linked:  # by the labels of a linked axis
                    parse = lambda it, axis=linked[key]: _label_of_axis(it, axis)  # noqa: E731
                    vals = [self.value(it, f"{kpath}[{j}]" if isinstance(child, ys.YSeq) else kpath, parse, _INVALID)
                            for j, it in enumerate(items)]
                else:
                    vals = [self.param(key, it, f"{kpath}[{j}]" if isinstance(child, ys.YSeq) else kpath)
                            for j, it in enumerate(items)]
                match[key] = [v for v in vals if v is not _INVALID]
            out.append(match)
        return out

    def include(self, node: ys.YNode) -> "list[tuple[ys.Pos, dict]]":
        out = []
        if not isinstance(node, ys.YSeq):
            self.problem(node.pos, "include", f"expected a list of mappings, got {ys.describe(node)}")
            return out
        for i, entry in enumerate(node.items):
            path = f"include[{i}]"
            self.locations[path] = entry.pos
            if not isinstance(entry, ys.YMap):
                self.problem(entry.pos, path, f"expected a mapping of parameters, got {ys.describe(entry)}")
                continue
            out.append((entry.pos, self.params(entry, path)))
        return out


def _is_linked(node: ys.YNode) -> bool:
    """A matrix entry that reads as a linked axis: a list whose items are mappings."""
    return isinstance(node, ys.YSeq) and bool(node.items) and any(isinstance(it, ys.YMap) for it in node.items)


NETWORK_KINDS = tuple(k for k in KINDS if k.phase == NETWORK)   # what `control: <kind>` may name


def _label_of_axis(node: ys.YNode, axis: Axis) -> str:
    """One of a linked axis's labels (an exclude entry naming the axis)."""
    text = ys.as_str(node, f"a label of the linked axis `{axis.key}`")
    if text not in axis.labels:
        raise ys.ValueProblem(f"`{text}` is not a value of the linked axis `{axis.key}`{suggest(text, axis.labels)} "
                              f"(its labels: {'; '.join(axis.labels)})")
    return text


def _axis_label(node: ys.YNode) -> str:
    text = ys.as_str(node, "a label (text)")
    if not text.strip() or CONTROL_RE.search(text) or len(text) > 100:
        raise ys.ValueProblem(f"`{text}` is not a usable label: one line of at most 100 characters")
    return text


_INVALID = object()  # what a value that failed its check parses to (problem recorded)


def _percentage(node: ys.YNode) -> float:
    """`2%` -> 2.0: a percentage above 0, written with its `%` (above 100% too: a very noisy median's interval)."""
    text = ys.as_str(node, "a percentage such as `2%`") if isinstance(node, ys.YScalar) and not node.is_null \
        and node.tag == ys.STR else None
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*", text or "")
    if not m:
        shown = node.text if isinstance(node, ys.YScalar) else ys.describe(node)
        raise ys.ValueProblem(f"expected a percentage of the median such as `2%`, got `{shown}`")
    value = float(m.group(1))
    if not 0 < value < 1e9:
        raise ys.ValueProblem(f"expected a percentage above 0%, got {m.group(1)}%")
    return value


def _example(node: ys.YNode) -> str:
    return node.text if isinstance(node, ys.YScalar) and node.text else "a, b"
