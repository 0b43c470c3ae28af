"""Experiment files: the schema, its validation, and the validated `Experiment`.

`load_experiment(path)` reads one YAML file (through `zcorch.config.yamlsrc`, which keeps positions and refuses
YAML 1.1 surprises) and either returns an `Experiment` whose values are normalised (sizes in bytes,
durations in seconds, `auto`/null as None) or raises one `ConfigError` listing *every* problem as
`file:line:column: key.path: message`. Nothing here runs anything.

Values that later reach a remote command line (paths, addresses, ssh targets, interpreter, workdir,
mkfs/mount options) are checked here syntactically; later stages still pass them as argv lists, never
through a shell string.

The user reference for the format is docs/experiment-files.md; the parameters (keys, defaults, kinds,
constraints) are the table in zcorch.params, from which DEFAULTS, PARAM_KEYS and PARAM_PARSERS here derive.
Cell-level rules (which send/receive/source/sink combinations the worker can run) are `cell_problems()`,
applied by `zcorch.plan.expand`.
"""
from __future__ import annotations

import difflib
import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from zcorch.config import yamlsrc as ys
from zcorch.errors import ConfigError, WorkerError, ZcorchError
from zcorch.params import DEFAULTS, INT_MAX, PARAM_KEYS, PARAMS, SIZE_KEYS, Param, format_value, param
from zcorch.worker import native

# The parameter table (zcorch.params) is the truth; these names (and DEFAULTS, PARAM_KEYS, format_value)
# stay importable from here.
SEND_MODES = param("send_mode").choices
RECV_MODES = param("recv_mode").choices
SINK_STATES = param("sink_state").choices
ORDERS = ("sequential", "shuffle", "interleave")
FS_TYPES = ("ext2", "ext3", "ext4", "xfs", "btrfs")
RAID_LEVELS = ("raid0", "raid1", "raid10", "single")
FILESYSTEM_PLACEHOLDER = "{filesystem}"
# A per-user directory on the host that uses the path (zcorch.provision.scratch resolves it): two users or two sweeps
# never share a file, and the cell ids stay the same on every host because they hash the placeholder.
SCRATCH_PLACEHOLDER = "{scratch}"
PLACEHOLDERS = (SCRATCH_PLACEHOLDER, FILESYSTEM_PLACEHOLDER)

SIZE_PARAMS = SIZE_KEYS

TOP_KEYS = ("name", "description", "hosts", "params", "matrix", "exclude", "include", "repeats", "order", "seed",
            "baselines", "filesystems", "skip_invalid")
HOST_ROLES = ("sender", "receiver")
HOST_KEYS = ("ssh", "data_address", "identity_file", "known_hosts", "ssh_config", "python", "workdir")
BASELINE_KEYS = {"iperf3": ("duration", "per", "omit"), "dd": ("bs", "count", "scratch")}
# The same defaults as zcorch.sweep.baselines (the run stage): the seeds baselined before every table, so an
# experiment without a `baselines:` section still gets both.
BASELINE_DEFAULTS = {"iperf3": {"duration": 2.0, "per": "pair", "omit": 0},
                     "dd": {"bs": 1024 ** 2, "count": 64, "scratch": "/tmp"}}
FS_KEYS = ("path", "fs", "loop", "devices", "raid", "raid_chunk", "mkfs_options", "mount_options", "allow_destroy",
           "mountpoint")
LOOP_KEYS = ("count", "size", "dir", "direct_io")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_HOST_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE = re.compile(rf"^{_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_PYTHON_RE = re.compile(r"^[A-Za-z0-9_./+-]+$")
_MKFS_OPT_RE = re.compile(r"^[A-Za-z0-9_.,=:/+@%-]+$")
_MOUNT_OPT_RE = re.compile(r"^[A-Za-z0-9_.=:/+@%-]+$")
# `{scratch}` not preceded by a quote: YAML reads it as a flow mapping (a syntax error, or a mapping).
_UNQUOTED_PLACEHOLDER_RE = re.compile(r"(^|[\s,\[:])\{(scratch|filesystem)\}")
_INT_MAX = INT_MAX  # SO_SNDBUF / F_SETPIPE_SZ take a C int


# ---------------------------------------------------------------- the validated experiment

@dataclass
class Axis:
    """One matrix axis: a parameter and its (normalised, distinct) values, in file order."""

    key: str
    values: list
    pos: ys.Pos


@dataclass
class Experiment:
    name: str
    description: str
    path: str
    text: str                          # the raw file text (the run stage stores a byte copy)
    hosts: "str | dict"                # "localhost" or {"sender": {...}, "receiver": {...}} as in the YAML
    params: dict                       # the `params:` section, normalised (only the keys written)
    matrix: "list[Axis]"
    exclude: "list[dict]"              # each: {key: [accepted normalised values]}
    include: "list[dict]"              # each: full cell params (defaults <- params <- 1-value axes <- entry)
    baselines: dict                    # {"iperf3": {...} | False, "dd": {...} | False} (False = off)
    filesystems: dict                  # name -> normalised configuration (see docs/experiment-files.md)
    repeats: int = 1
    order: str = "sequential"
    seed: int = 0
    skip_invalid: bool = False
    locations: "dict[str, ys.Pos]" = field(default_factory=dict)  # "include[0]", "exclude[1]", "matrix" ...

    def base_params(self) -> dict:
        """Defaults overridden by the `params:` section: what every matrix cell starts from."""
        base = dict(DEFAULTS)
        base.update(self.params)
        return base

    def include_base(self) -> dict:
        """What an include entry starts from: base_params() plus every matrix axis that has one value."""
        base = self.base_params()
        base.update({axis.key: axis.values[0] for axis in self.matrix if len(axis.values) == 1})
        return base

    def where(self, key: str) -> str:
        """`file:line:column` of a section or entry, for messages."""
        pos = self.locations.get(key)
        return f"{self.path}:{pos}" if pos else self.path


# ---------------------------------------------------------------- entry points

def load_experiment(path: "str | os.PathLike") -> Experiment:
    """Read and validate an experiment file. Raises ConfigError listing every problem (file:line:col)."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the experiment file: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return parse_experiment(text, path)


def parse_experiment(text: str, path: str = "<experiment>") -> Experiment:
    """Validate experiment-file text; `path` only names it in messages and `Experiment.path`."""
    root, raw_problems = ys.parse(text, path)
    v = _Validator(path)
    lines = text.splitlines()
    for pos, key, msg in raw_problems:
        line = lines[pos.line - 1] if 0 < pos.line <= len(lines) else ""
        unquoted = _UNQUOTED_PLACEHOLDER_RE.search(line)
        if msg.startswith("YAML syntax error") and unquoted:
            msg += f"; quote a value that starts with a placeholder: \"{{{unquoted.group(2)}}}/FILE\""
        v.problem(pos, key, msg)
    if root is None:
        v.raise_if_any()
    exp = v.experiment(root, text)
    v.raise_if_any()
    return exp


def suggest(name: str, candidates) -> str:
    """'; did you mean `x`?' for the closest valid names, or '' if none is close."""
    close = difflib.get_close_matches(str(name), list(candidates), n=3, cutoff=0.6)
    if not close:
        return ""
    return "; did you mean " + " or ".join(f"`{c}`" for c in close) + "?"


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
    if p["subblocks"] > p["buffer"]:
        out.append(f"subblocks ({p['subblocks']}) > buffer ({p['buffer']} bytes): a sub-block would be empty")
    return out


def filesystem_problem(p: dict) -> Optional[str]:
    """A cell whose sink lives on `{filesystem}` must name one (a file error, never skipped)."""
    if p["sink"].startswith(FILESYSTEM_PLACEHOLDER) and p["filesystem"] is None:
        return f"sink `{p['sink']}` uses {FILESYSTEM_PLACEHOLDER} but the cell has no `filesystem`"
    return None


# ---------------------------------------------------------------- value checks shared by several keys

def check_abs_path(text: str, what: str = "path") -> str:
    if not text.startswith("/"):
        raise ys.ValueProblem(f"expected an absolute {what} (starting with /), got `{text}`")
    _check_no_control(text, what)
    if len(text) > 4096:
        raise ys.ValueProblem(f"{what} longer than 4096 characters")
    return text


def _check_no_control(text: str, what: str) -> None:
    if _CONTROL_RE.search(text):
        raise ys.ValueProblem(f"{what} `{text!r}` contains a control character (NUL, newline, tab ...)")


def _check_braces(text: str, what: str) -> None:
    if "{" in text or "}" in text:
        raise ys.ValueProblem(f"{what} `{text}` contains `{{` or `}}`; placeholders ({', '.join(PLACEHOLDERS)}) "
                              "are only for `source`, `sink` and `baselines.dd.scratch`")


def _placeholder_path(text: str, what: str, allowed: "tuple[str, ...]", directory: bool = False) -> str:
    """An absolute path, or one starting with a placeholder of `allowed` followed by `/REL`.

    `{scratch}` must be followed by a relative path of plain components (no `..`, `.` or empty ones), so
    it cannot leave the scratch directory; `directory`: `{scratch}` alone is fine (a directory).
    """
    _check_no_control(text, what)
    forms = " or ".join(f"{ph} or {ph}/DIR" if directory else f"{ph}/FILE" for ph in allowed)
    if not text.startswith("{"):
        if not text.startswith("/"):
            raise ys.ValueProblem(f"expected an absolute path (or {forms}), got `{text}`")
        check_abs_path(text, f"{what} path")
        if "{" in text or "}" in text:
            raise ys.ValueProblem(f"`{text}`: a placeholder ({', '.join(allowed)}) may only start the {what}, "
                                  f"as {forms}")
        return text
    m = re.match(r"^\{[^{}/]*\}", text)
    placeholder = m.group(0) if m else text.split("/", 1)[0]
    if placeholder not in PLACEHOLDERS:
        raise ys.ValueProblem(f"`{text}`: `{placeholder}` is not a placeholder{suggest(placeholder, allowed)} "
                              f"(the {what} may start with {', '.join(allowed)})")
    if placeholder not in allowed:
        why = " (the filesystem is the receiver's: only the sink lives on it)" \
            if placeholder == FILESYSTEM_PLACEHOLDER else ""
        raise ys.ValueProblem(f"`{text}`: {placeholder} is not allowed in the {what}{why}; use {forms}")
    rest = text[len(placeholder):]
    if rest == "" and directory:
        return text
    if not rest.startswith("/") or rest.rstrip("/") == "":
        raise ys.ValueProblem(f"`{text}`: write {placeholder}/{'DIR' if directory else 'FILE'}")
    if "{" in rest or "}" in rest:
        raise ys.ValueProblem(f"`{text}`: a placeholder may only start the {what}, once")
    if placeholder == SCRATCH_PLACEHOLDER and any(c in ("", ".", "..") for c in rest[1:].split("/")):
        raise ys.ValueProblem(f"`{text}`: {SCRATCH_PLACEHOLDER}/ must be followed by a relative path without "
                              "`..` (nor `.` or empty components): the path stays inside the scratch directory")
    if len(text) > 4096:
        raise ys.ValueProblem(f"{what} longer than 4096 characters")
    return text


def _choice(node: ys.YNode, allowed, what: str) -> str:
    text = ys.as_str(node, what)
    if text not in allowed:
        raise ys.ValueProblem(f"`{text}` is not a {what}{suggest(text, allowed)} "
                              f"(expected one of {', '.join(allowed)})")
    return text


def _positive_size(node: ys.YNode, limit: Optional[int] = None) -> int:
    n = ys.as_size(node)
    if n <= 0:
        raise ys.ValueProblem(f"expected a size > 0, got `{node.text}`")
    if limit is not None and n > limit:
        raise ys.ValueProblem(f"`{node.text}` is too large (at most {limit} bytes)")
    return n


def _int_range(node: ys.YNode, lo: int, hi: Optional[int] = None) -> int:
    n = ys.as_int(node)
    if n < lo or (hi is not None and n > hi):
        rng = f"≥ {lo}" if hi is None else f"between {lo} and {hi}"
        raise ys.ValueProblem(f"expected an integer {rng}, got {n}")
    return n


def _auto_or(node: ys.YNode, inner: Callable) -> Any:
    if isinstance(node, ys.YScalar) and (node.is_null and node.plain or node.text == "auto"):
        return None
    return inner(node)


def _null_or(node: ys.YNode, inner: Callable) -> Any:
    if isinstance(node, ys.YScalar) and node.is_null and node.plain:
        return None
    return inner(node)


def _unquoted_placeholder(node: ys.YNode) -> None:
    """`sink: {scratch}` unquoted is the YAML mapping {scratch: null}: say so instead of 'got a mapping'."""
    if isinstance(node, ys.YMap) and node.entries and set(node.entries) <= {"scratch", "filesystem"}:
        name = next(iter(node.entries))
        raise ys.ValueProblem(f"{{{name}}} without quotes is a YAML mapping: quote the value, "
                              f"e.g. \"{{{name}}}/FILE\"")


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


def _dd_scratch(node: ys.YNode) -> str:
    _unquoted_placeholder(node)
    text = ys.as_str(node, "a directory")
    return _placeholder_path(text, "dd scratch directory", (SCRATCH_PLACEHOLDER,), directory=True)


def _fs_name(node: ys.YNode) -> str:
    text = ys.as_str(node, "a filesystem name")
    if not _NAME_RE.match(text):
        raise ys.ValueProblem(f"`{text}` is not a valid name (letters, digits, `.`, `_`, `-`)")
    return text


def _positive_duration(node: ys.YNode) -> float:
    secs = ys.as_duration(node)
    if secs <= 0:
        raise ys.ValueProblem(f"expected a duration > 0, got `{node.text}`")
    return secs


# kind -> parser of one value of a Param of that kind (zcorch.params.KINDS); the constraints come from the entry.
_KIND_PARSERS: "dict[str, Callable[[ys.YNode, Param], Any]]" = {
    "choice": lambda n, p: _choice(n, p.choices, p.noun),
    "size": lambda n, p: _positive_size(n, p.max),
    "int": lambda n, p: _int_range(n, p.min, p.max),
    "cpu": lambda n, p: _int_range(n, p.min, p.max),
    "bool": lambda n, p: ys.as_bool(n),
    "duration": lambda n, p: _positive_duration(n),
    "path": _param_path,
    "name": lambda n, p: _fs_name(n),
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


# ---------------------------------------------------------------- hosts

def _ssh_target(text: str) -> str:
    """`[user@]host[:port]` or an ssh-config alias; refuses anything ssh could read as an option."""
    rest = text
    if "@" in rest:
        user, rest = rest.rsplit("@", 1)
        if not _USER_RE.match(user):
            raise ys.ValueProblem(f"`{text}`: `{user}` is not a valid user name")
    port = None
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0:
            raise ys.ValueProblem(f"`{text}`: unclosed `[` around an IPv6 address")
        host, tail = rest[1:end], rest[end + 1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ys.ValueProblem(f"`{text}`: `{host}` is not an IPv6 address") from None
        if tail:
            if not tail.startswith(":"):
                raise ys.ValueProblem(f"`{text}`: expected `:PORT` after `]`")
            port = tail[1:]
    elif rest.count(":") > 1:
        try:
            ipaddress.IPv6Address(rest)
        except ValueError:
            raise ys.ValueProblem(f"`{text}`: not [user@]host[:port] (write IPv6 addresses as [addr]:port)") from None
        host = rest
    else:
        host, _, port = rest.partition(":")
        port = port if ":" in rest else None
        _check_host(host, text)
    if port is not None and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ys.ValueProblem(f"`{text}`: port `{port}` is not a number between 1 and 65535")
    return text


def _check_host(host: str, whole: str) -> None:
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    prefix = "" if host == whole else f"`{whole}`: "
    # All-numeric labels would pass as a host name: hold them to IPv4 syntax (10.78.0.300 is a typo).
    if not host or len(host) > 253 or not _HOSTNAME_RE.match(host) or re.match(r"^[0-9.]+$", host):
        raise ys.ValueProblem(f"{prefix}`{host}` is not a valid host name or IP address")


def _address(node: ys.YNode) -> str:
    text = ys.as_str(node, "an IP address or host name")
    _check_host(text, text)
    return text


def _local_file(node: ys.YNode) -> str:
    text = ys.as_str(node, "a path")
    if not (text.startswith("/") or text.startswith("~/")):
        raise ys.ValueProblem(f"expected an absolute path or ~/..., got `{text}`")
    _check_no_control(text, "path")
    return text


def _python(node: ys.YNode) -> str:
    text = ys.as_str(node, "an interpreter name or path")
    if not _PYTHON_RE.match(text) or text.startswith("-"):
        raise ys.ValueProblem(f"`{text}` is not an interpreter name or path (e.g. python3, /usr/bin/python3)")
    return text


def _workdir(node: ys.YNode) -> str:
    text = ys.as_str(node, "a directory")
    if not (text.startswith("/") or text == "~" or text.startswith("~/")):
        raise ys.ValueProblem(f"expected an absolute directory or ~/..., got `{text}`")
    _check_no_control(text, "workdir")
    return text


HOST_PARSERS = {
    "ssh": lambda n: _ssh_target(ys.as_str(n, "[user@]host[:port]")),
    "data_address": _address,
    "identity_file": _local_file,
    "known_hosts": _local_file,
    "ssh_config": _local_file,
    "python": _python,
    "workdir": _workdir,
}


# ---------------------------------------------------------------- the validator

class _Validator:
    def __init__(self, path: str):
        self.path = path
        self.problems: "list[tuple[ys.Pos, str, str]]" = []
        self.locations: "dict[str, ys.Pos]" = {}
        self.fs_refs: "list[tuple[ys.Pos, str, str]]" = []  # (pos, key path, name) to check once all are known
        self.fs_names: "list[str]" = []  # every entry under filesystems:, valid or not (for reference checks)

    # -- reporting
    def problem(self, pos: ys.Pos, key: str, msg: str) -> None:
        self.problems.append((pos, key, msg))

    def raise_if_any(self) -> None:
        if self.problems:
            ordered = sorted(self.problems, key=lambda p: (p[0].line, p[0].column))
            raise ConfigError([f"{self.path}:{pos}: {key + ': ' if key else ''}{msg}" for pos, key, msg in ordered])

    def value(self, node: ys.YNode, key: str, parser: Callable, default: Any = None) -> Any:
        """parser(node), or record the problem at the node and return `default`."""
        try:
            return parser(node)
        except ys.ValueProblem as exc:
            self.problem(node.pos, key, str(exc))
            return default

    def mapping(self, node: ys.YNode, key: str, allowed, what: str) -> "dict[str, tuple[ys.Pos, ys.YNode]]":
        """The entries of a mapping node whose keys are all in `allowed` (unknown ones are reported)."""
        if not isinstance(node, ys.YMap):
            self.problem(node.pos, key, f"expected a mapping of {what}, got {ys.describe(node)}")
            return {}
        good = {}
        for name, (kpos, child) in node.entries.items():
            if name in allowed:
                good[name] = (kpos, child)
            else:
                self.problem(kpos, _join(key, name), f"unknown key `{name}`{suggest(name, allowed)} "
                                                    f"(expected {what}: {', '.join(allowed)})")
        return good

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
        hosts = self.hosts(get("hosts")) if "hosts" in top else "localhost"
        filesystems = self.filesystems(get("filesystems")) if "filesystems" in top else {}
        params = self.params(get("params"), "params") if "params" in top else {}
        matrix = self.matrix(get("matrix")) if "matrix" in top else []
        exclude = self.exclude(get("exclude")) if "exclude" in top else []
        include_raw = self.include(get("include")) if "include" in top else []
        repeats = self.value(get("repeats"), "repeats", lambda n: _int_range(n, 1), 1) if "repeats" in top else 1
        order = self.value(get("order"), "order", lambda n: _choice(n, ORDERS, "run order"), "sequential") \
            if "order" in top else "sequential"
        seed = self.value(get("seed"), "seed", lambda n: _int_range(n, 0), 0) if "seed" in top else 0
        skip_invalid = self.value(get("skip_invalid"), "skip_invalid", ys.as_bool, False) \
            if "skip_invalid" in top else False
        baselines = self.baselines(get("baselines"))

        for pos, key, fs in self.fs_refs:
            if fs is not None and fs not in self.fs_names:
                defined = ", ".join(self.fs_names) or "none: add a `filesystems:` section"
                self.problem(pos, key, f"`{fs}` is not a filesystem defined under `filesystems:`"
                                       f"{suggest(fs, self.fs_names)} (defined: {defined})")

        exp = Experiment(name=name, description=description, path=self.path, text=text, hosts=hosts,
                         params=params, matrix=matrix, exclude=exclude, include=[], baselines=baselines,
                         filesystems=filesystems, repeats=repeats, order=order, seed=seed,
                         skip_invalid=skip_invalid, locations=dict(self.locations))
        base = exp.include_base()
        multi = {axis.key: axis for axis in matrix if len(axis.values) > 1}
        for i, (pos, entry) in enumerate(include_raw):
            missing = [k for k in multi if k not in entry]
            if missing:
                axes = "; ".join(f"`{k}` ({', '.join(format_value(k, v) for v in multi[k].values)})"
                                 for k in missing)
                self.problem(pos, f"include[{i}]", f"does not set {axes}, which the matrix varies; an include "
                                                   "adds one cell, so set every varying axis explicitly")
            cell = dict(base)
            cell.update(entry)
            exp.include.append(cell)
        return exp

    @staticmethod
    def _name(node: ys.YNode) -> str:
        text = ys.as_str(node, "a name")
        if not _NAME_RE.match(text):
            raise ys.ValueProblem(f"`{text}` is not a valid name: it names the results directory, so use "
                                  "letters, digits, `.`, `_`, `-` (at most 100, not starting with `.`/`-`)")
        return text

    # -- parameters
    def param(self, key: str, node: ys.YNode, path: str) -> Any:
        value = self.value(node, path, lambda n: parse_param(key, n), _INVALID)
        if key == "filesystem" and value is not _INVALID:
            self.fs_refs.append((node.pos, path, value))
        return value

    def params(self, node: ys.YNode, path: str) -> dict:
        out = {}
        for key, (_, child) in self.mapping(node, path, PARAM_KEYS, "parameters").items():
            value = self.param(key, child, _join(path, key))
            if value is not _INVALID:
                out[key] = value
        return out

    def matrix(self, node: ys.YNode) -> "list[Axis]":
        axes = []
        if isinstance(node, ys.YScalar) and node.is_null:
            return axes
        for key, (kpos, child) in self.mapping(node, "matrix", PARAM_KEYS, "parameters").items():
            path = f"matrix.{key}"
            if not isinstance(child, ys.YSeq):
                self.problem(child.pos, path, f"expected a list of values (e.g. [{_example(child)}]), "
                                              f"got {ys.describe(child)}")
                continue
            if not child.items:
                self.problem(child.pos, path, "empty list: an axis needs at least one value")
                continue
            values, seen = [], {}
            for i, item in enumerate(child.items):
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
        return axes

    def exclude(self, node: ys.YNode) -> "list[dict]":
        out = []
        if not isinstance(node, ys.YSeq):
            self.problem(node.pos, "exclude", f"expected a list of mappings, got {ys.describe(node)}")
            return out
        for i, entry in enumerate(node.items):
            path = f"exclude[{i}]"
            self.locations[path] = entry.pos
            fields = self.mapping(entry, path, PARAM_KEYS, "parameters")
            if isinstance(entry, ys.YMap) and not entry.entries:
                self.problem(entry.pos, path, "empty entry would exclude every cell")
            match = {}
            for key, (_, child) in fields.items():
                items = child.items if isinstance(child, ys.YSeq) else [child]
                kpath = _join(path, key)
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

    # -- hosts
    def hosts(self, node: ys.YNode) -> "str | dict":
        if isinstance(node, ys.YScalar):
            text = self.value(node, "hosts", ys.as_str, None)
            if text is not None and text != "localhost":
                self.problem(node.pos, "hosts", f"expected `localhost` or a mapping with `sender:` and "
                                                f"`receiver:`, got `{text}`")
            return "localhost"
        roles = self.mapping(node, "hosts", HOST_ROLES, "host roles")
        out = {}
        for role in HOST_ROLES:
            if role not in roles:
                if isinstance(node, ys.YMap):
                    self.problem(node.pos, "hosts", f"missing `{role}:` (both sender and receiver are needed)")
                continue
            spec_node = roles[role][1]
            fields = self.mapping(spec_node, f"hosts.{role}", HOST_KEYS, "host keys")
            spec = {}
            for key in HOST_KEYS:
                if key in fields:
                    val = self.value(fields[key][1], f"hosts.{role}.{key}", HOST_PARSERS[key], None)
                    if val is not None:
                        spec[key] = val
                elif key in ("ssh", "data_address") and isinstance(spec_node, ys.YMap):
                    self.problem(spec_node.pos, f"hosts.{role}", f"missing required key `{key}`")
            out[role] = spec
        return out

    # -- baselines
    def baselines(self, node: "ys.YNode | None") -> dict:
        """Both kinds, defaults filled in; a kind set to `false` (or `baselines: false`) is False (off)."""
        out: dict = {kind: dict(conf) for kind, conf in BASELINE_DEFAULTS.items()}
        if node is None or isinstance(node, ys.YScalar) and node.is_null:
            return out
        if isinstance(node, ys.YScalar) and node.tag == ys.BOOL and node.text in ("false", "False", "FALSE"):
            return {kind: False for kind in out}
        for kind, (_, child) in self.mapping(node, "baselines", tuple(BASELINE_KEYS), "baseline kinds").items():
            path = f"baselines.{kind}"
            if isinstance(child, ys.YScalar) and child.is_null:
                continue
            if isinstance(child, ys.YScalar) and child.tag == ys.BOOL and child.plain:
                on = self.value(child, path, ys.as_bool, True)
                out[kind] = out[kind] if on else False
                continue
            for key, (_, v) in self.mapping(child, path, BASELINE_KEYS[kind], f"{kind} settings").items():
                val = self.value(v, f"{path}.{key}", _BASELINE_PARSERS[key], _INVALID)
                if val is not _INVALID:
                    out[kind][key] = val
        return out

    # -- filesystems
    def filesystems(self, node: ys.YNode) -> dict:
        out = {}
        if isinstance(node, ys.YScalar) and node.is_null:
            return out
        if not isinstance(node, ys.YMap):
            self.problem(node.pos, "filesystems", f"expected a mapping name -> configuration, got "
                                                  f"{ys.describe(node)}")
            return out
        for name, (kpos, child) in node.entries.items():
            path = f"filesystems.{name}"
            self.fs_names.append(name)
            self.locations[path] = kpos
            if not _NAME_RE.match(name):
                self.problem(kpos, path, f"`{name}` is not a valid name (letters, digits, `.`, `_`, `-`)")
            conf = self.filesystem(child, path)
            if conf is not None:
                out[name] = conf
        return out

    def filesystem(self, node: ys.YNode, path: str) -> Optional[dict]:
        """One entry, normalised to the keys written (sizes in bytes), or None if it has problems."""
        fields = self.mapping(node, path, FS_KEYS, "filesystem keys")
        if not isinstance(node, ys.YMap):
            return None
        forms = [k for k in ("path", "loop", "devices") if k in fields]
        if len(forms) != 1:
            got = "none" if not forms else " and ".join(f"`{f}`" for f in forms)
            self.problem(node.pos, path, f"needs exactly one of `path` (an existing directory), `loop` "
                                         f"(loop devices the run creates) or `devices`; got {got}")
            return None
        n_problems = len(self.problems)
        if forms == ["path"]:
            for k in fields:
                if k != "path":
                    self.problem(fields[k][0], f"{path}.{k}", "an existing directory (`path`) is used as it "
                                                              f"is: `{k}` does not apply")
            p = self.value(fields["path"][1], f"{path}.path", _existing_dir)
            return {"path": p} if len(self.problems) == n_problems else None

        conf: dict = {}
        if "fs" not in fields:
            self.problem(node.pos, path, f"missing required key `fs` (one of {', '.join(FS_TYPES)})")
        else:
            conf["fs"] = self.value(fields["fs"][1], f"{path}.fs", lambda n: _choice(n, FS_TYPES, "filesystem type"))
        if "loop" in fields:
            conf["loop"] = self.loop(fields["loop"][1], f"{path}.loop")
            n_dev = conf["loop"]["count"] if conf["loop"] else None
        else:
            conf["devices"] = self.device_list(fields["devices"][1], f"{path}.devices", allow_empty=False)
            n_dev = len(conf["devices"]) if conf["devices"] is not None else None
        if "raid" in fields:
            conf["raid"] = self.value(fields["raid"][1], f"{path}.raid",
                                      lambda n: _choice(n, RAID_LEVELS, "RAID level"))
        if "raid_chunk" in fields:
            conf["raid_chunk"] = self.value(fields["raid_chunk"][1], f"{path}.raid_chunk", _positive_size)
        if "mountpoint" in fields:
            conf["mountpoint"] = self.value(fields["mountpoint"][1], f"{path}.mountpoint", _existing_dir)
        for key, rx, what in (("mkfs_options", _MKFS_OPT_RE, "mkfs option"),
                              ("mount_options", _MOUNT_OPT_RE, "mount option")):
            if key in fields:
                conf[key] = self.option_list(fields[key][1], f"{path}.{key}", rx, what)
        if "allow_destroy" in fields:
            kpos, child = fields["allow_destroy"]
            if "devices" not in fields:
                self.problem(kpos, f"{path}.allow_destroy", "only applies to `devices` (loop devices the run "
                                                            "creates need no permission)")
            else:
                allowed = self.device_list(child, f"{path}.allow_destroy", allow_empty=True) or []
                listed = set(conf["devices"] or [])
                for i, dev in enumerate(allowed):
                    if conf["devices"] is not None and dev not in listed:
                        self.problem(child.items[i].pos, f"{path}.allow_destroy[{i}]",
                                     f"`{dev}` is not one of this configuration's `devices`")
                conf["allow_destroy"] = allowed
        fs, raid = conf.get("fs"), conf.get("raid")
        if fs and n_dev is not None:
            if "raid" not in fields and n_dev > 1 and fs != "btrfs":
                self.problem(node.pos, path, f"{n_dev} devices for {fs} need `raid:` (raid0, raid1 or raid10, "
                                             "built with mdadm)")
            if raid == "single" and fs != "btrfs":
                self.problem(fields["raid"][1].pos, f"{path}.raid", "`single` is a btrfs profile; for "
                                                                    f"{fs} use raid0, raid1 or raid10 (mdadm)")
            if raid in ("raid0", "raid1", "raid10") and n_dev < 2:
                self.problem(fields["raid"][1].pos, f"{path}.raid", f"{raid} needs at least 2 devices, "
                                                                    f"this configuration has {n_dev}")
        if len(self.problems) != n_problems:
            return None
        # What the filesystem manager itself will refuse (minimum sizes, device counts per level ...):
        # one set of provisioning rules, zcorch.provision.fs_config's, reported here at the entry.
        from zcorch.provision.fs_config import config_problems

        name = path.split(".", 1)[1]
        for msg in config_problems({name: conf}):
            where, _, text = msg.partition(": ")
            self.problem(node.pos, where or path, text or msg)
        return conf if len(self.problems) == n_problems else None

    def loop(self, node: ys.YNode, path: str) -> Optional[dict]:
        fields = self.mapping(node, path, LOOP_KEYS, "loop settings")
        if not isinstance(node, ys.YMap):
            return None
        conf: dict = {"count": 1}
        if "count" in fields:
            conf["count"] = self.value(fields["count"][1], f"{path}.count", lambda n: _int_range(n, 1, 64), None)
        if "size" not in fields:
            self.problem(node.pos, path, "missing required key `size` (size of each loop device, e.g. 2GiB)")
            conf["size"] = None
        else:
            conf["size"] = self.value(fields["size"][1], f"{path}.size", _positive_size, None)
        if "dir" in fields:
            conf["dir"] = self.value(fields["dir"][1], f"{path}.dir", _existing_dir, None)
        if "direct_io" in fields:
            conf["direct_io"] = self.value(fields["direct_io"][1], f"{path}.direct_io", ys.as_bool, None)
        return conf if None not in conf.values() else None

    def device_list(self, node: ys.YNode, path: str, allow_empty: bool) -> "Optional[list[str]]":
        if not isinstance(node, ys.YSeq):
            self.problem(node.pos, path, f"expected a list of device paths, got {ys.describe(node)}")
            return None
        if not node.items and not allow_empty:
            self.problem(node.pos, path, "empty list: name at least one device")
            return None
        out, seen = [], set()
        for i, item in enumerate(node.items):
            dev = self.value(item, f"{path}[{i}]", _device, None)
            if dev is None:
                continue
            if dev in seen:
                self.problem(item.pos, f"{path}[{i}]", f"`{dev}` is listed twice")
                continue
            seen.add(dev)
            out.append(dev)
        return out

    def option_list(self, node: ys.YNode, path: str, rx, what: str) -> "list[str]":
        if not isinstance(node, ys.YSeq):
            self.problem(node.pos, path, f"expected a list of {what}s (one item per argument), got "
                                         f"{ys.describe(node)}")
            return []
        out = []
        for i, item in enumerate(node.items):
            text = self.value(item, f"{path}[{i}]", lambda n: ys.as_str(n, f"a {what}"), None)
            if text is None:
                continue
            if not rx.match(text):
                extra = " or commas (one option per item)" if what == "mount option" else ""
                self.problem(item.pos, f"{path}[{i}]", f"`{text}`: a {what} may not contain whitespace, quotes "
                                                       f"or shell metacharacters{extra}")
                continue
            out.append(text)
        return out


def _existing_dir(node: ys.YNode) -> str:
    text = check_abs_path(ys.as_str(node, "a path"), "directory")
    _check_braces(text, "path")
    return text


def _device(node: ys.YNode) -> str:
    text = ys.as_str(node, "a device path")
    if not text.startswith("/dev/") or len(text) <= 5:
        raise ys.ValueProblem(f"expected a device path under /dev/, got `{text}`")
    if not re.match(r"^/dev/[A-Za-z0-9_./:+-]+$", text) or "/../" in text or text.endswith("/.."):
        raise ys.ValueProblem(f"`{text}` is not a plain device path")
    return text


def _dd_count(node: ys.YNode) -> int:
    # dd reads `count=512k` as 512*1024 blocks, and the seeds wrote it so: accept a size-like count.
    n = ys.as_size(node, "a block count (e.g. 16384 or 512k)")
    if n < 1:
        raise ys.ValueProblem(f"expected a count ≥ 1, got `{node.text}`")
    return n


_BASELINE_PARSERS = {
    "duration": _positive_duration,
    "per": lambda n: _choice(n, ("pair", "sweep"), "baseline frequency"),
    "omit": lambda n: _int_range(n, 0),
    "bs": lambda n: _positive_size(n, _INT_MAX),
    "count": _dd_count,
    "scratch": _dd_scratch,
}


class _Invalid:
    def __repr__(self) -> str:
        return "<invalid>"


_INVALID = _Invalid()


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _example(node: ys.YNode) -> str:
    return node.text if isinstance(node, ys.YScalar) and node.text else "a, b"
