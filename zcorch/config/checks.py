"""What every section parser of an experiment file shares: `Checker` collects problems (position, key path,
message) and raises them together as one ConfigError; the value checks raise `yamlsrc.ValueProblem`, which
`Checker.value` records at the node. `parse_data` runs a parser on plain data written as YAML (one schema).
"""
from __future__ import annotations

import difflib
import posixpath
import re
from typing import Any, Callable, Optional, TypeVar

import yaml

from zcorch.config import yamlsrc as ys
from zcorch.errors import ConfigError
from zcorch.params import DURATION_MAX as MAX_DURATION
from zcorch.params import SIZE_MAX as MAX_SIZE

# Names that become directory names (experiment name, filesystems entries).
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
NAME_RULE = "letters, digits, `.`, `_`, `-`"
FILESYSTEM_PLACEHOLDER = "{filesystem}"
# A per-user directory on the host that uses the path: cell ids hash the placeholder, the same on every host.
SCRATCH_PLACEHOLDER = "{scratch}"
PLACEHOLDERS = (SCRATCH_PLACEHOLDER, FILESYSTEM_PLACEHOLDER)

CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

T = TypeVar("T")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def suggest(name: str, candidates) -> str:
    """'; did you mean `x`?' for the closest valid names, or '' if none is close."""
    close = difflib.get_close_matches(str(name), list(candidates), n=3, cutoff=0.6)
    return "; did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else ""


class Checker:
    """Collects the problems of one file (or one piece of data) and the positions of its entries."""

    def __init__(self, path: str):
        self.path = path
        self.problems: "list[tuple[ys.Pos, str, str]]" = []
        self.locations: "dict[str, ys.Pos]" = {}   # "include[0]", "filesystems.x" ... for later messages

    def problem(self, pos: ys.Pos, key: str, msg: str) -> None:
        self.problems.append((pos, key, msg))

    def raise_if_any(self) -> None:
        if self.problems:
            ordered = sorted(self.problems, key=lambda p: (p[0].source is not None, p[0].line, p[0].column))
            raise ConfigError([f"{ys.where(self.path, pos)}: {key + ': ' if key else ''}{msg}"
                               for pos, key, msg in ordered])

    def value(self, node: ys.YNode, key: str, parser: Callable, default: Any = None) -> Any:
        """parser(node), or record the problem at the node and return `default`."""
        try:
            return parser(node)
        except ys.ValueProblem as exc:
            self.problem(node.pos, key, str(exc))
            return default

    def field(self, fields: "dict[str, tuple[ys.Pos, ys.YNode]]", path: str, key: str, parser: Callable,
              default: Any = None) -> Any:
        """`value` of the entry `key` of a checked mapping (`mapping`'s result), or `default` without one."""
        return self.value(fields[key][1], join(path, key), parser, default) if key in fields else default

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
                self.problem(kpos, join(key, name), f"unknown key `{name}`{suggest(name, allowed)} "
                                                    f"(expected {what}: {', '.join(allowed)})")
        return good


def read_document(text: str, path: str, **kwargs: Any) -> "tuple[Checker, ys.YNode]":
    """A Checker of `path` and the root of its one YAML document; ConfigError for what YAML refuses."""
    root, raw = ys.parse(text, path, **kwargs)
    chk = Checker(path)
    chk.problems += raw
    chk.raise_if_any()
    assert root is not None
    return chk, root


def named_entries(chk: Checker, node: ys.YNode, section: str, keys: "tuple[str, ...]", what: str,
                  entry: "Callable[[Checker, dict, ys.YMap, str, str], Optional[T]]") -> "dict[str, T]":
    """A `section:` of named entries (`filesystems:`, `networks:`) -> {name: entry(chk, fields, node, path, name)}
    of the entries without problems, each a mapping of `keys`; every problem goes to `chk` at its place."""
    out: "dict[str, T]" = {}
    if is_null(node):
        return out
    if not isinstance(node, ys.YMap):
        chk.problem(node.pos, section, f"expected a mapping name -> configuration, got {ys.describe(node)}")
        return out
    for name, (kpos, child) in node.entries.items():
        path = f"{section}.{name}"
        chk.locations[path] = kpos
        n_problems = len(chk.problems)
        if not NAME_RE.match(name):
            chk.problem(kpos, path, f"`{name}` is not a valid name ({NAME_RULE})")
        fields = chk.mapping(child, path, keys, what)
        conf = entry(chk, fields, child, path, name) if isinstance(child, ys.YMap) else None
        if conf is not None and len(chk.problems) == n_problems:
            out[name] = conf
    return out


def parse_data(section: str, data: Any, parser: "Callable[[Checker, ys.YNode], T]", path: str) -> T:
    """`parser` applied to plain data as if it were the `section:` of a file; ConfigError if it has problems."""
    try:
        text = yaml.safe_dump({section: data}, default_flow_style=False, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {section}: cannot be written as YAML: {exc}") from None
    chk, root = read_document(text, path)
    assert isinstance(root, ys.YMap)
    out = parser(chk, root.entries[section][1])
    chk.raise_if_any()
    return out


def is_off(node: ys.YNode) -> bool:
    """A plain `false` (a section or kind turned off)."""
    return isinstance(node, ys.YScalar) and node.tag == ys.BOOL and node.plain and \
        node.text in ("false", "False", "FALSE")


def is_null(node: "ys.YNode | None") -> bool:
    return node is None or isinstance(node, ys.YScalar) and node.is_null


# ---------------------------------------------------------------- value checks (raise ValueProblem)

def check_no_control(text: str, what: str) -> None:
    if CONTROL_RE.search(text):
        raise ys.ValueProblem(f"{what} `{text!r}` contains a control character (NUL, newline, tab ...)")


def check_abs_path(text: str, what: str = "path") -> str:
    if not text.startswith("/"):
        raise ys.ValueProblem(f"expected an absolute {what} (starting with /), got `{text}`")
    check_no_control(text, what)
    if len(text) > 4096:
        raise ys.ValueProblem(f"{what} longer than 4096 characters")
    return text


def _normpath(text: str) -> str:
    return posixpath.normpath(re.sub(r"/+", "/", text))


def dev_path(text: str) -> Optional[str]:
    """`text` normalised if it names /dev or a path under it (`//dev/./sda`, `/dev/x/../sda` too), else None."""
    norm = _normpath(text)
    return norm if norm == "/dev" or norm.startswith("/dev/") else None


def http_url(node: ys.YNode) -> str:
    """An absolute http(s) URL (it becomes a link in the report: `javascript:` and the like never may)."""
    text = ys.as_str(node, "a URL").strip()
    check_no_control(text, "URL")
    m = re.match(r"^(https?)://[^\s/?#]+", text, re.IGNORECASE)
    if not m or re.search(r"[\s<>\"`]", text):
        raise ys.ValueProblem(f"`{text}` is not an http:// or https:// URL (the report makes it a link: only "
                              "those are allowed)")
    return text


def kernel_fs_path(text: str) -> Optional[str]:
    """`text` normalised if it is /proc, /sys or under them (kernel settings, never data), else None."""
    norm = _normpath(text)
    return norm if norm.split("/")[1:2] in (["proc"], ["sys"]) else None


def check_braces(text: str, what: str) -> None:
    if "{" in text or "}" in text:
        raise ys.ValueProblem(f"{what} `{text}` contains `{{` or `}}`; placeholders ({', '.join(PLACEHOLDERS)}) "
                              "are only for `source`, `sink` and `baselines.dd.scratch`")


def placeholder_path(text: str, what: str, allowed: "tuple[str, ...]", directory: bool = False) -> str:
    """An absolute path, or a placeholder of `allowed` followed by `/REL` (`{scratch}`: plain components only,
    so it cannot leave the scratch directory); `directory`: `{scratch}` alone is fine."""
    check_no_control(text, what)
    forms = " or ".join(f"{ph} or {ph}/DIR" if directory else f"{ph}/FILE" for ph in allowed)
    if not text.startswith("{"):
        if not text.startswith("/"):
            raise ys.ValueProblem(f"expected an absolute path (or {forms}), got `{text}`")
        check_abs_path(text, f"{what} path")
        if kernel_fs_path(text):
            raise ys.ValueProblem(f"`{text}` is under {'/' + kernel_fs_path(text).split('/')[1]}: kernel settings and "
                                  f"state, never a {what} (network settings belong in `networks:`, which restores them)")
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


def unquoted_placeholder(node: ys.YNode) -> None:
    """`sink: {scratch}` unquoted is the YAML mapping {scratch: null}: say so instead of 'got a mapping'."""
    if isinstance(node, ys.YMap) and node.entries and set(node.entries) <= {"scratch", "filesystem"}:
        name = next(iter(node.entries))
        raise ys.ValueProblem(f"{{{name}}} without quotes is a YAML mapping: quote the value, "
                              f"e.g. \"{{{name}}}/FILE\"")


def choice(node: ys.YNode, allowed, what: str) -> str:
    text = ys.as_str(node, what)
    if text not in allowed:
        raise ys.ValueProblem(f"`{text}` is not a {what}{suggest(text, allowed)} "
                              f"(expected one of {', '.join(allowed)})")
    return text


def metric_name(node: ys.YNode, known, examples: str) -> str:
    """A metric of `known` (zcorch.metrics names); `examples` say which in the message."""
    text = ys.as_str(node, "a metric name")
    if text not in known:
        raise ys.ValueProblem(f"`{text}` is not a metric{suggest(text, known)} (e.g. {examples})")
    return text


def name(node: ys.YNode, what: str = "a name") -> str:
    text = ys.as_str(node, what)
    if not NAME_RE.match(text):
        raise ys.ValueProblem(f"`{text}` is not a valid name ({NAME_RULE})")
    return text


def positive_size(node: ys.YNode, limit: Optional[int] = None) -> int:
    n = ys.as_size(node)
    if n <= 0:
        raise ys.ValueProblem(f"expected a size > 0, got `{node.text}`")
    limit = MAX_SIZE if limit is None else min(limit, MAX_SIZE)
    if n > limit:
        raise ys.ValueProblem(f"`{node.text}` is too large (at most {limit} bytes)")
    return n


def int_range(node: ys.YNode, lo: int, hi: Optional[int] = None) -> int:
    n = ys.as_int(node)
    if n < lo or (hi is not None and n > hi):
        rng = f"≥ {lo}" if hi is None else f"between {lo} and {hi}"
        raise ys.ValueProblem(f"expected an integer {rng}, got {n}")
    return n


def positive_duration(node: ys.YNode) -> float:
    secs = ys.as_duration(node)
    if secs <= 0:
        raise ys.ValueProblem(f"expected a duration > 0, got `{node.text}`")
    if not secs <= MAX_DURATION:  # also inf (a 400-digit number) and nan
        raise ys.ValueProblem(f"`{node.text}` is too long (at most 7 days = {MAX_DURATION:.0f}s)")
    return secs

