"""Experiment files: the schema, its validation, and the validated `Experiment`.

`load_experiment(path)` reads one YAML file (through `zcorch.config.yamlsrc`, which keeps positions and refuses
YAML 1.1 surprises) and either returns an `Experiment` whose values are normalised (sizes in bytes,
durations in seconds, `auto`/null as None) or raises one `ConfigError` listing *every* problem as
`file:line:column: key.path: message`. Nothing here runs anything.

The sections with their own schema are parsed by their modules, into frozen dataclasses: `hosts:` by
zcorch.config.hosts, `baselines:` by zcorch.config.baselines, `filesystems:` by zcorch.config.filesystems
(all reporting through one zcorch.config.checks.Checker). Values that later reach a remote command line
(paths, addresses, ssh targets, interpreter, workdir, mkfs/mount options) are checked syntactically there;
later stages still pass them as argv lists, never through a shell string.

The user reference for the format is docs/experiment-files.md; the parameters (keys, defaults, kinds,
constraints) are the table in zcorch.params, from which DEFAULTS, PARAM_KEYS and PARAM_PARSERS here derive.
Cell-level rules (which send/receive/source/sink combinations the worker can run) are `cell_problems()`,
applied by `zcorch.plan.expand`.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import yaml

from zcorch import metrics
from zcorch.config import overrides as _overrides
from zcorch.config import yamlsrc as ys
from zcorch.config.baselines import Baselines, parse_baselines
from zcorch.config.checks import FILESYSTEM_PLACEHOLDER, NAME_RE, NAME_RULE, Checker, suggest
from zcorch.config.checks import choice as _choice
from zcorch.config.checks import int_range as _int_range
from zcorch.config.checks import join as _join
from zcorch.config.checks import placeholder_path as _placeholder_path
from zcorch.config.checks import positive_duration as _positive_duration
from zcorch.config.checks import positive_size as _positive_size
from zcorch.config.checks import unquoted_placeholder as _unquoted_placeholder
from zcorch.config.checks import dev_path as _dev_path
from zcorch.config.filesystems import FilesystemConfig, device_list, parse_filesystems
from zcorch.config.hosts import INVENTORY, LOCALHOST, Hosts, parse_hosts
from zcorch.config.inventory import InventoryPair
from zcorch.config.networks import NetworkConfig, parse_networks
from zcorch.config.reference import COMMAND_KIND_PREFIX, Reference, parse_reference
from zcorch.config.views import View, parse_report
from zcorch.errors import WorkerError, ZcorchError
from zcorch.params import DEFAULTS, PARAM_KEYS, PARAMS, SIZE_KEYS, Param, format_value, param, side_value
from zcorch.worker import native

# The parameter table (zcorch.params) is the truth; these names (and DEFAULTS, PARAM_KEYS, format_value)
# stay importable from here.
SEND_MODES = param("send_mode").choices
RECV_MODES = param("recv_mode").choices
SINK_STATES = param("sink_state").choices
ORDERS = ("sequential", "shuffle", "interleave")

SIZE_PARAMS = SIZE_KEYS

# Beyond these the plan (one dict per cell, one Run per repeat) exhausts memory before anything runs.
MAX_REPEATS = 10000
MAX_RUNS = 1_000_000
TOP_KEYS = ("name", "description", "hosts", "params", "matrix", "exclude", "include", "repeats", "order", "seed",
            "baselines", "filesystems", "skip_invalid", "allow_destroy", "reference", "report", "networks",
            "allow_network_changes")
# A linked axis (matrix entry that is not a parameter) names a results column: not one zcorch has already.
_AXIS_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
RESERVED_AXIS_NAMES = tuple(sorted({"cell", "repeat", "status", "reason", "started", "wall_s", "log", "sweep",
                                    "params", "matrix", "label", "same_host", "zc_verdict", *metrics.BY_NAME}))
LABEL_KEY = "label"   # the key naming a value of a linked axis
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# `{scratch}` not preceded by a quote: YAML reads it as a flow mapping (a syntax error, or a mapping).
_UNQUOTED_PLACEHOLDER_RE = re.compile(r"(^|[\s,\[:])\{(scratch|filesystem)\}")


# ---------------------------------------------------------------- the validated experiment

@dataclass
class Axis:
    """One matrix axis, its (normalised, distinct) values in file order.

    A plain axis: `key` is a parameter and `values` its values. A linked axis (`linked`): `key` is the
    axis's own name (not a parameter), each value a mapping {parameter: value} with the same parameters
    (`params`), and `labels` one name per value (written `label:`, else derived: `send_cpu=0 recv_cpu=1`).
    """

    key: str
    values: list
    pos: ys.Pos
    linked: bool = False
    labels: "list[str]" = field(default_factory=list)

    @property
    def params(self) -> "tuple[str, ...]":
        """The parameters the axis sets."""
        return tuple(self.values[0]) if self.linked else (self.key,)

    def assignment(self, j: int) -> dict:
        """{parameter: value} of the axis's j-th value."""
        return dict(self.values[j]) if self.linked else {self.key: self.values[j]}

    def label_of(self, params: dict) -> Optional[str]:
        """A linked axis's label for a cell's parameters: the label of the value they hold, else one derived
        from them (an include cell off the axis); None for a plain axis."""
        if not self.linked:
            return None
        mine = {k: params.get(k) for k in self.params}
        # compared as written, so a frame's row (NaN for null, 0.0 for 0 in a column with nulls) finds its label
        shown = {k: format_value(k, v) for k, v in mine.items()}
        for value, label in zip(self.values, self.labels):
            if all(shown[k] == format_value(k, v) for k, v in value.items()):
                return label
        return default_label(mine)


def default_label(assignment: dict) -> str:
    """The label of a linked-axis value written without `label:`: `send_cpu=0 recv_cpu=1` (`none` for null)."""
    return " ".join(f"{k}={format_value(k, v)}" for k, v in assignment.items())


def _same(a: Any, b: Any) -> bool:
    # `True == 1` in Python: a boolean never equals an integer here
    return type(a) is type(b) and a == b


@dataclass
class Experiment:
    name: str
    description: str
    path: str
    text: str                          # the raw file text (the run stage stores a byte copy)
    hosts: Hosts                       # localhost, or the sender's and receiver's HostSpec
    params: dict                       # the `params:` section, normalised (only the keys written)
    matrix: "list[Axis]"
    exclude: "list[dict]"              # each: {key: [accepted normalised values]} (a linked axis: [labels])
    include: "list[dict]"              # each: full cell params (defaults <- params <- 1-value axes <- entry)
    baselines: Baselines               # .iperf3 / .dd: their settings, None = off
    filesystems: "dict[str, FilesystemConfig]"   # name -> configuration, in file order
    repeats: int = 1
    order: str = "sequential"
    seed: int = 0
    skip_invalid: bool = False
    locations: "dict[str, ys.Pos]" = field(default_factory=dict)  # "include[0]", "exclude[1]", "matrix" ...
    allow_destroy: "tuple[str, ...]" = ()   # devices the user lets a `sink` overwrite (besides /dev/null)
    hosts_required: bool = False            # the file says `hosts: inventory` (hosts come from --hosts)
    inventory: Optional[InventoryPair] = None   # the pair given with --hosts / ZCORCH_HOSTS (then `hosts` is its)
    overrides: "tuple[str, ...]" = ()       # the --set KEY=VALUE applied, as given, in order
    effective: Optional[str] = None         # with --hosts or --set: the document as run (YAML text); else None
    reference: Optional[Reference] = None   # the published study this experiment reproduces (config.reference)
    views: "tuple[View, ...]" = ()          # `report: {views: [...]}`: the report's declared views (config.views)
    networks: "dict[str, NetworkConfig]" = field(default_factory=dict)  # `networks:` name -> configuration
    allow_network_changes: bool = False     # the top-level opt-in: `networks:` may change both hosts (localhost too)

    def network_allowed(self, role: str) -> bool:
        """Whether a `networks:` entry may change `role`'s host: the top-level `allow_network_changes: true`,
        or (remote hosts) the host's own `allow_network_changes: true` (hosts section or inventory)."""
        if self.allow_network_changes:
            return True
        return not self.hosts.localhost and bool(self.hosts.spec(role).allow_network_changes)

    def effective_text(self) -> str:
        """The experiment as it runs: `text` itself, or with --hosts/--set the effective document."""
        return self.text if self.effective is None else self.effective

    def base_params(self) -> dict:
        """Defaults overridden by the `params:` section: what every matrix cell starts from."""
        base = dict(DEFAULTS)
        base.update(self.params)
        return base

    def include_base(self) -> dict:
        """What an include entry starts from: base_params() plus every matrix axis that has one value."""
        base = self.base_params()
        for axis in self.matrix:
            if len(axis.values) == 1:
                base.update(axis.assignment(0))
        return base

    def linked_axes(self) -> "list[Axis]":
        """The linked axes of the matrix, in file order."""
        return [a for a in self.matrix if a.linked]

    def axis_labels(self, params: dict) -> "dict[str, str]":
        """{linked axis name: label} of a cell's parameters (Axis.label_of)."""
        return {a.key: a.label_of(params) for a in self.matrix if a.linked}

    def where(self, key: str) -> str:
        """`file:line:column` of a section or entry, for messages."""
        pos = self.locations.get(key)
        return ys.where(self.path, pos) if pos else self.path


# ---------------------------------------------------------------- entry points

def load_experiment(path: "str | os.PathLike", overrides: "Sequence[str]" = (),
                    hosts: Optional[InventoryPair] = None) -> Experiment:
    """Read and validate an experiment file. Raises ConfigError listing every problem (file:line:col).

    overrides: `--set KEY=VALUE` strings (zcorch.config.overrides), applied before validation.
    hosts: a pair of an inventory (zcorch.config.inventory), used instead of the file's `hosts:`.
    """
    path = os.fspath(path)
    text, _ = ys.read_text(path, "the experiment file")
    return parse_experiment(text, path, overrides, hosts)


def parse_experiment(text: str, path: str = "<experiment>", overrides: "Sequence[str]" = (),
                     hosts: Optional[InventoryPair] = None) -> Experiment:
    """Validate experiment-file text; `path` only names it in messages and `Experiment.path`.

    With `overrides` or `hosts` (see load_experiment), `Experiment.effective` is the document as run.
    """
    ovs = _overrides.parse_overrides(overrides)
    root, raw_problems = ys.parse(text, path)
    v = _Validator(path, hosts)
    lines = text.splitlines()
    for pos, key, msg in raw_problems:
        line = lines[pos.line - 1] if 0 < pos.line <= len(lines) else ""
        unquoted = _UNQUOTED_PLACEHOLDER_RE.search(line)
        if msg.startswith("YAML syntax error") and unquoted:
            msg += f"; quote a value that starts with a placeholder: \"{{{unquoted.group(2)}}}/FILE\""
        v.problem(pos, key, msg)
    if root is None:
        v.raise_if_any()
    targets: "list[str]" = []
    if hosts is not None:
        for ov in [ov for ov in ovs if ov.key.split(".")[0] == "hosts"]:
            v.problem(ov.value.pos, "hosts", f"the hosts come from {hosts.describe()} (--hosts / ZCORCH_HOSTS): "
                                             "change them there, not with --set")
            ovs.remove(ov)
    if ovs and isinstance(root, ys.YMap):
        root, problems, targets = _overrides.apply(root, ovs, TOP_KEYS, PARAM_KEYS)
        for problem in problems:
            v.problem(*problem)
    exp = v.experiment(root, text)
    v.raise_if_any()
    exp.inventory = hosts
    exp.overrides = tuple(ov.text for ov in ovs)
    if ovs or hosts is not None:
        exp.effective = _effective_document(root, exp, targets)
        _check_effective(exp)
    return exp


class _Dumper(yaml.SafeDumper):
    """safe_dump without anchors (a value the file wrote once through an alias is written out each time)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _effective_document(root: ys.YNode, exp: Experiment, targets: "list[str]") -> str:
    """The document as it runs: the file's data with the --set values and the inventory's hosts, under a
    comment header naming the file, the pair and each --set (comments of the file itself are not kept)."""
    data = ys.to_data(root)
    source = os.path.abspath(exp.path) if not exp.path.startswith("<") else exp.path
    head = ["# zcorch run: the experiment as this sweep runs it, not the file as written:",
            f"#   file:  {_one_line(source)}"]
    if exp.inventory is not None:
        inv = exp.inventory
        head.append(f"#   hosts: pair `{inv.pair}` of the inventory {_one_line(inv.path)} "
                    f"(sha256 {inv.sha256[:16]}...)")
        hosts = exp.hosts.to_data()
        if "hosts" in data:
            data["hosts"] = hosts
        else:  # after name/description, where a file writes it
            items = list(data.items())
            at = sum(1 for k, _ in items[:2] if k in ("name", "description"))
            data = dict(items[:at] + [("hosts", hosts)] + items[at:])
    for text, target in zip(exp.overrides, targets):
        head.append(f"#   --set {_one_line(text)}" + (f"   ({target})" if target != text.partition("=")[0] else ""))
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=None,
                     width=110)
    return "\n".join(head) + "\n" + body


def _one_line(text: str) -> str:
    """`text` for a comment line: control characters (a newline in a --set value or a file name) escaped."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: json.dumps(m.group(0))[1:-1], text)


def _check_effective(exp: Experiment) -> None:
    """The effective document must read back to the experiment that runs (--resume and reports read it)."""
    again = parse_experiment(exp.effective or "", exp.path)
    fields_ = ("name", "description", "hosts", "params", "exclude", "include", "baselines", "filesystems",
               "repeats", "order", "seed", "skip_invalid", "allow_destroy", "reference", "views", "networks",
               "allow_network_changes")
    differ = [f for f in fields_ if getattr(again, f) != getattr(exp, f)]
    if [(a.key, a.values, a.labels) for a in again.matrix] != [(a.key, a.values, a.labels) for a in exp.matrix]:
        differ.append("matrix")
    if differ:  # a bug, not a user mistake
        raise AssertionError(f"{exp.path}: the effective document reads back differently ({', '.join(differ)})")


# ---------------------------------------------------------------- cell-level rules (the worker's)

def _mode_caps(side: str, mode: str) -> "frozenset[str]":
    """Capabilities the locally built C core declares for a mode (zcorch.worker.native caches them)."""
    try:
        caps = native.mode_capabilities()
    except WorkerError as exc:
        raise ZcorchError(f"cannot tell which cells the worker can run: {exc}. The controller builds it on "
                          "`pip install -e .`; in a checkout, `python3 native/build.py --out .`") from None
    if mode not in caps[side]:
        raise ZcorchError(f"{'send' if side == 'send' else 'receive'} mode `{mode}` is not in the native module "
                          f"{native.native_path()} (built from older sources?): rebuild it with "
                          "`python3 native/build.py --out .` or `pip install -e .`")
    return caps[side][mode]


def cell_problems(p: dict) -> "list[str]":
    """Why the worker cannot run a cell with these parameters (empty if it can).

    The mode-specific checks come from the capabilities each mode declares in the C core (the worker
    refuses the same cells), so they are caught at plan time instead of as failed runs.
    """
    out = []
    send, recv, source, sink = p["send_mode"], p["recv_mode"], p["source"], p["sink"]
    send_caps, recv_caps = _mode_caps("send", send), _mode_caps("recv", recv)
    if "file_sink" in recv_caps and sink == "/dev/null":
        out.append(f"receive mode `{recv}` needs a regular file as sink, not /dev/null")
    if "no_sink" in recv_caps and sink != "/dev/null":
        out.append(f"receive mode `{recv}` keeps no data: its sink must be /dev/null, not `{sink}`")
    if send_caps & {"file_source", "mappable_source"} and source == "mem":
        out.append(f"send mode `{send}` reads from a file; source `mem` is not one (use a path or /dev/zero)")
    if "mappable_source" in send_caps and source == "/dev/zero":
        out.append(f"send mode `{send}` cannot map /dev/zero; use a regular file as source")
    if p["gift"] and "gift" not in send_caps | recv_caps:
        gifted = sorted({m for modes in native.mode_capabilities().values() for m, c in modes.items() if "gift" in c})
        out.append(f"`gift` (SPLICE_F_GIFT) only applies to the {'/'.join(gifted)} modes")
    if sink == "/dev/null" and p["fsync"]:
        out.append("`fsync` needs a regular file as sink, not /dev/null")
    if sink == "/dev/null" and p["sink_state"] != "fresh":
        out.append(f"sink_state `{p['sink_state']}` needs a regular file as sink, not /dev/null")
    for side, key in (("send", "send_buffer"), ("recv", "recv_buffer")):  # each side's own buffer (params.side_value)
        buf = side_value(side, p, "buffer")
        if p["subblocks"] > buf:
            what = key if p.get(key) is not None else "buffer"
            out.append(f"subblocks ({p['subblocks']}) > {what} ({buf} bytes): a sub-block would be empty")
            if what == "buffer":
                break  # one message for the shared size
    if p.get("streams", 1) > 1:
        for side, mode, caps in (("send", send, send_caps), ("receive", recv, recv_caps)):
            if "one_stream" in caps:
                out.append(f"{side} mode `{mode}` handles one stream only; `streams: {p['streams']}` needs another")
    return out


def filesystem_problem(p: dict) -> Optional[str]:
    """A cell whose sink lives on `{filesystem}` must name one (a file error, never skipped)."""
    if p["sink"].startswith(FILESYSTEM_PLACEHOLDER) and p["filesystem"] is None:
        return f"sink `{p['sink']}` uses {FILESYSTEM_PLACEHOLDER} but the cell has no `filesystem`"
    return None


# ---------------------------------------------------------------- value checks of parameters

def _auto_or(node: ys.YNode, inner: Callable) -> Any:
    if isinstance(node, ys.YScalar) and (node.is_null and node.plain or node.text == "auto"):
        return None
    return inner(node)


def _null_or(node: ys.YNode, inner: Callable) -> Any:
    if isinstance(node, ys.YScalar) and node.is_null and node.plain:
        return None
    return inner(node)


def _param_path(node: ys.YNode, p: Param) -> str:
    """A `path` parameter: one of its words (source `mem`), an absolute path, or a placeholder path."""
    _unquoted_placeholder(node)
    words = [f"`{w}`" for w in p.choices]
    text = ys.as_str(node, " or ".join(words + ["an absolute path"]))
    if text in p.choices:
        return text
    if words and not text.startswith(("/", "{")):
        forms = " or ".join(f"{ph}/FILE" for ph in p.placeholders)
        raise ys.ValueProblem(f"expected {', '.join(words)}, an absolute path (e.g. /dev/zero) or {forms}, "
                              f"got `{text}`")
    return _placeholder_path(text, p.key, p.placeholders)


def _cpu_list(node: ys.YNode) -> str:
    """A CPU list (`0-3`, `0,2`, `5`) as its canonical text "0,1,2,3" (one string: the matrix varies it)."""
    text = ys.as_str(node, "a CPU list (e.g. `0-3` or `0,2`)")
    try:
        cpus = native.parse_cpus(text)
    except ValueError as exc:
        raise ys.ValueProblem(f"`{text}`: {exc} (expected a CPU list such as `0-3` or `0,2`)") from None
    return ",".join(str(c) for c in cpus or ())


def _fs_name(node: ys.YNode, noun: str = "filesystem") -> str:
    text = ys.as_str(node, f"a {noun} name")
    if not NAME_RE.match(text):
        raise ys.ValueProblem(f"`{text}` is not a valid name ({NAME_RULE})")
    return text


# kind -> parser of one value of a Param of that kind (zcorch.params.KINDS); the constraints come from the entry.
_KIND_PARSERS: "dict[str, Callable[[ys.YNode, Param], Any]]" = {
    "choice": lambda n, p: _choice(n, p.choices, p.noun),
    "size": lambda n, p: _positive_size(n, p.max),
    "int": lambda n, p: _int_range(n, p.min, p.max),
    "cpu": lambda n, p: _int_range(n, p.min, p.max),
    "bool": lambda n, p: ys.as_bool(n),
    "duration": lambda n, p: _positive_duration(n),
    "path": _param_path,
    "name": lambda n, p: _fs_name(n, p.noun or "filesystem"),
    "cpus": lambda n, p: _cpu_list(n),
}
_UNSET_WRAPPERS = {None: lambda node, inner: inner(node), "auto": _auto_or, "null": _null_or}


def _param_parser(p: Param) -> "Callable[[ys.YNode], Any]":
    kind, wrap = _KIND_PARSERS[p.kind], _UNSET_WRAPPERS[p.unset]
    return lambda node: wrap(node, lambda n: kind(n, p))


PARAM_PARSERS: "dict[str, Callable[[ys.YNode], Any]]" = {p.key: _param_parser(p) for p in PARAMS}


def parse_param(key: str, node: ys.YNode) -> Any:
    """One parameter value from its node (raises ValueProblem). Lists get a hint about `matrix:`."""
    if isinstance(node, ys.YSeq):
        raise ys.ValueProblem(f"expected one value, got a list; to vary `{key}`, make it a `matrix:` axis")
    return PARAM_PARSERS[key](node)


# ---------------------------------------------------------------- the validator

class _Validator(Checker):
    def __init__(self, path: str, hosts: Optional[InventoryPair] = None):
        super().__init__(path)
        self.given_hosts = hosts  # --hosts: replaces the file's `hosts:` (which is still checked)
        self.fs_refs: "list[tuple[ys.Pos, str, str]]" = []  # (pos, key path, name) to check once all are known
        self.fs_names: "list[str]" = []  # every entry under filesystems:, valid or not (for reference checks)
        self.net_refs: "list[tuple[ys.Pos, str, str]]" = []   # the same for `network` values and networks:
        self.net_names: "list[str]" = []
        self.allow_destroy: "tuple[str, ...]" = ()  # read before the parameters: the sink rule needs it
        self.linked: "list[Axis]" = []  # the matrix's linked axes (exclude entries may name them)

    # -- the whole file
    def experiment(self, root: ys.YNode, text: str) -> Experiment:
        if not isinstance(root, ys.YMap):
            self.problem(root.pos, "", f"expected a mapping (name:, params:, matrix: ...), got {ys.describe(root)}")
            return None  # type: ignore[return-value]
        top = self.mapping(root, "", TOP_KEYS, "top-level keys")
        for name, (kpos, _) in top.items():
            self.locations[name] = kpos

        def get(name):
            return top[name][1] if name in top else None

        name = "?"
        if "name" not in top:
            self.problem(root.pos, "name", "missing required key `name` (it names the results directory)")
        else:
            name = self.value(get("name"), "name", self._name, "?")
        description = self.value(get("description"), "description", ys.as_str, "") if "description" in top else ""
        file_hosts = parse_hosts(self, get("hosts"), inventory_ok=True) if "hosts" in top else LOCALHOST
        hosts = LOCALHOST if file_hosts is None else file_hosts
        if self.given_hosts is not None:
            hosts = self.given_hosts.hosts
        elif file_hosts is None:
            self.problem(get("hosts").pos, "hosts",
                         f"`{INVENTORY}`: this experiment runs on two hosts you name when you run it: "
                         "`zcorch run FILE --hosts INVENTORY[:PAIR]` (or set ZCORCH_HOSTS=INVENTORY[:PAIR]); "
                         "`zcorch lab inventory` prints the inventory of the lab (docs/experiment-files.md, "
                         "Inventory files)")
        if "allow_destroy" in top:
            self.allow_destroy = tuple(device_list(self, get("allow_destroy"), "allow_destroy", allow_empty=True)
                                       or ())
        filesystems = {}
        if "filesystems" in top:
            fs_node = get("filesystems")
            self.fs_names = list(fs_node.entries) if isinstance(fs_node, ys.YMap) else []
            filesystems = parse_filesystems(self, fs_node)
        networks = {}
        if "networks" in top:
            net_node = get("networks")
            self.net_names = list(net_node.entries) if isinstance(net_node, ys.YMap) else []
            networks = parse_networks(self, net_node)
        allow_net = self.value(get("allow_network_changes"), "allow_network_changes", ys.as_bool, False) \
            if "allow_network_changes" in top else False
        params = self.params(get("params"), "params") if "params" in top else {}
        matrix = self.matrix(get("matrix")) if "matrix" in top else []
        self.linked = [a for a in matrix if a.linked]
        exclude = self.exclude(get("exclude")) if "exclude" in top else []
        include_raw = self.include(get("include")) if "include" in top else []
        repeats = self.value(get("repeats"), "repeats", lambda n: _int_range(n, 1, MAX_REPEATS), 1) \
            if "repeats" in top else 1
        order = self.value(get("order"), "order", lambda n: _choice(n, ORDERS, "run order"), "sequential") \
            if "order" in top else "sequential"
        seed = self.value(get("seed"), "seed", lambda n: _int_range(n, 0), 0) if "seed" in top else 0
        skip_invalid = self.value(get("skip_invalid"), "skip_invalid", ys.as_bool, False) \
            if "skip_invalid" in top else False
        baselines = parse_baselines(self, get("baselines"))
        reference = parse_reference(self, get("reference"), parse_param) if "reference" in top else None
        if reference is not None and baselines.commands:  # (none at all: e.g. --set baselines=false)
            names = [c.name for c in baselines.commands]
            for b in reference.baselines:
                name = b.kind[len(COMMAND_KIND_PREFIX):] if b.kind.startswith(COMMAND_KIND_PREFIX) else None
                if name is not None and name not in names:
                    self.problem(b.pos, f"reference.baselines.{b.kind}", f"no command baseline `{name}` in "
                                 f"baselines.commands{suggest(name, names)} (there: {', '.join(names)})")
        views = parse_report(self, get("report"), tuple(a.key for a in matrix if a.linked)) if "report" in top else ()
        # Counted from the axis lengths, before anything is expanded (excludes can only lower it).
        n_cells = math.prod(len(axis.values) for axis in matrix) + len(include_raw)
        if n_cells * repeats > MAX_RUNS:
            where = "matrix" if "matrix" in top else "repeats" if "repeats" in top else "include"
            self.problem(self.locations[where], where, f"{n_cells} cells × {repeats} repeats = "
                                                       f"{n_cells * repeats} runs, more than the limit of {MAX_RUNS}")

        for pos, key, fs in self.fs_refs:
            if fs is not None and fs not in self.fs_names:
                defined = ", ".join(self.fs_names) or "none: add a `filesystems:` section"
                self.problem(pos, key, f"`{fs}` is not a filesystem defined under `filesystems:`"
                                       f"{suggest(fs, self.fs_names)} (defined: {defined})")

        # (`hosts: inventory` without --hosts: the hosts are unknown, and that problem is already reported)
        self._check_networks(hosts, allow_net, hosts_known=file_hosts is not None or self.given_hosts is not None)

        exp = Experiment(name=name, description=description, path=self.path, text=text, hosts=hosts,
                         params=params, matrix=matrix, exclude=exclude, include=[], baselines=baselines,
                         filesystems=filesystems, repeats=repeats, order=order, seed=seed,
                         skip_invalid=skip_invalid, locations=dict(self.locations),
                         allow_destroy=self.allow_destroy, hosts_required=file_hosts is None,
                         reference=reference, views=views, networks=networks, allow_network_changes=allow_net)
        base = exp.include_base()
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
            cell = dict(base)
            cell.update(entry)
            exp.include.append(cell)
        return exp

    def _check_networks(self, hosts: Hosts, allow_all: bool, hosts_known: bool = True) -> None:
        """`network` values name an entry of `networks:`, and the hosts let them change their network."""
        used = False
        for pos, key, net in self.net_refs:
            if net is None:
                continue
            used = True
            if net not in self.net_names:
                defined = ", ".join(self.net_names) or "none: add a `networks:` section"
                self.problem(pos, key, f"`{net}` is not a network defined under `networks:`"
                                       f"{suggest(net, self.net_names)} (defined: {defined})")
        if not used or allow_all or not hosts_known:
            return
        pos, key, _ = next(r for r in self.net_refs if r[2] is not None)
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

    @staticmethod
    def _name(node: ys.YNode) -> str:
        text = ys.as_str(node, "a name")
        if not NAME_RE.match(text):
            raise ys.ValueProblem(f"`{text}` is not a valid name: it names the results directory, so use "
                                  f"{NAME_RULE} (at most 100, not starting with `.`/`-`)")
        return text

    # -- parameters
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
        if key == "filesystem" and value is not _INVALID:
            self.fs_refs.append((node.pos, path, value))
        if key == "network" and value is not _INVALID:
            self.net_refs.append((node.pos, path, value))
        return value

    def params(self, node: ys.YNode, path: str) -> dict:
        out = {}
        for key, (_, child) in self.mapping(node, path, PARAM_KEYS, "parameters").items():
            value = self.param(key, child, _join(path, key))
            if value is not _INVALID:
                out[key] = value
        return out

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
                    first, second = (owner[p], axis.key)
                    self.problem(axis.pos, f"matrix.{axis.key}",
                                 f"`{p}` is set by two axes (`matrix.{first}` and `matrix.{second}`): a parameter "
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


def _label_of_axis(node: ys.YNode, axis: Axis) -> str:
    """One of a linked axis's labels (an exclude entry naming the axis)."""
    text = ys.as_str(node, f"a label of the linked axis `{axis.key}`")
    if text not in axis.labels:
        raise ys.ValueProblem(f"`{text}` is not a value of the linked axis `{axis.key}`{suggest(text, axis.labels)} "
                              f"(its labels: {'; '.join(axis.labels)})")
    return text


def _axis_label(node: ys.YNode) -> str:
    text = ys.as_str(node, "a label (text)")
    if not text.strip() or _CONTROL_RE.search(text) or len(text) > 100:
        raise ys.ValueProblem(f"`{text}` is not a usable label: one line of at most 100 characters")
    return text


class _Invalid:
    def __repr__(self) -> str:
        return "<invalid>"


_INVALID = _Invalid()


def _example(node: ys.YNode) -> str:
    return node.text if isinstance(node, ys.YScalar) and node.text else "a, b"


def _section_of(text: str, path: str, key: str, parse: Callable[[Checker, ys.YNode], Any], absent: Any) -> Any:
    """One top-level section of an experiment document, parsed alone (`absent` without it); ConfigError
    (file:line) when the document or the section has problems. The rest of the file is not validated again."""
    root, raw = ys.parse(text, path)
    chk = Checker(path)
    for problem in raw:
        chk.problem(*problem)
    chk.raise_if_any()
    node = root.get(key) if isinstance(root, ys.YMap) else None
    if node is None:
        return absent
    section = parse(chk, node)
    chk.raise_if_any()
    return section


def views_of(text: str, path: str = "<experiment>") -> "tuple[View, ...]":
    """The `report:` views of an experiment document alone (() without), like reference_of (a view may name a
    linked axis of the matrix)."""
    axes = tuple(a.key for a in linked_axes_of(text, path))
    return _section_of(text, path, "report", lambda chk, node: parse_report(chk, node, axes), ())


def linked_axes_of(text: str, path: str = "<experiment>") -> "list[Axis]":
    """The linked axes of an experiment document's `matrix:` alone ([] without), like reference_of: the analysis
    of a result set names its cells by them (zcorch.analysis.frames.add_linked_axes)."""
    def parse(chk: Checker, node: ys.YNode) -> "list[Axis]":
        v = _Validator(path)
        axes = [a for a in v.matrix(node) if a.linked]  # the plain axes' problems are the run's business
        chk.problems += [p for p in v.problems if p[1].startswith(tuple(f"matrix.{a}" for a in _linked_names(node)))]
        return axes
    return _section_of(text, path, "matrix", parse, [])


def _linked_names(node: ys.YNode) -> "list[str]":
    return [k for k in node.entries if k not in PARAM_KEYS] if isinstance(node, ys.YMap) else []


def reference_of(text: str, path: str = "<experiment>") -> Optional[Reference]:
    """The `reference:` section of an experiment document alone (None without one), for analysis of a result
    set: the rest of the file is not validated again (its hosts may come from an inventory no longer there).
    ConfigError (file:line) when the section itself has problems."""
    return _section_of(text, path, "reference", lambda chk, node: parse_reference(chk, node, parse_param), None)
