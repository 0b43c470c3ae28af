"""YAML with positions, built from PyYAML's composer nodes: unlike `yaml.safe_load` it refuses duplicate keys,
keeps each value's text, tag and line:column, and its typed accessors refuse YAML 1.1's implicit typing
(`no` -> False, `010` -> 8) saying how to write the value instead."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Optional, Union

import yaml

from zcorch.errors import ConfigError
from zcorch.units import parse_duration, parse_size

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

STR = "tag:yaml.org,2002:str"
INT = "tag:yaml.org,2002:int"
FLOAT = "tag:yaml.org,2002:float"
BOOL = "tag:yaml.org,2002:bool"
NULL = "tag:yaml.org,2002:null"
MERGE = "tag:yaml.org,2002:merge"
TIMESTAMP = "tag:yaml.org,2002:timestamp"   # `date: 2006-11-16`: read as its text by as_str
_SCALAR_TAGS = {STR, INT, FLOAT, BOOL, NULL, TIMESTAMP}

_DECIMAL_RE = re.compile(r"^-?(0|[1-9][0-9]*)$")
_PLAIN_FLOAT_RE = re.compile(r"^-?(0|[1-9][0-9]*)(\.[0-9]+)?$")
_PREFIXED_INT_RE = re.compile(r"^[-+]?0[oOxXbB][0-9a-fA-F_]+$")
_TRUE_FALSE = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}


@dataclass(frozen=True)
class Pos:
    """1-based line and column of a node in its file; `source`: where else it came from (`--set bytes=1GiB`)."""

    line: int
    column: int
    source: Optional[str] = None

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


def read_text(path: str, what: str) -> "tuple[str, str]":
    """(text, sha256 hex) of a UTF-8 file; ConfigError naming `what` when it cannot be read or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return text, hashlib.sha256(raw).hexdigest()


def where(path: str, pos: Pos) -> str:
    """`file:line:column` of a position, or the source it came from (`--set KEY=VALUE`)."""
    return pos.source if pos.source else f"{path}:{pos}"


def _pos(mark) -> Pos:
    return Pos(mark.line + 1, mark.column + 1)


@dataclass
class YScalar:
    text: str        # the scalar exactly as written (without quotes)
    tag: str         # what YAML 1.1 resolved it to (or the explicit tag)
    plain: bool      # unquoted: only plain scalars get implicit YAML 1.1 typing
    pos: Pos

    @property
    def is_null(self) -> bool:
        return self.tag == NULL

    def yaml_value(self):
        """What a YAML 1.1 loader (yaml.safe_load) would make of this scalar."""
        node = yaml.ScalarNode(self.tag, self.text, style=None if self.plain else '"')
        return _constructor.construct_object(node)


@dataclass
class YSeq:
    items: list
    pos: Pos


@dataclass
class YMap:
    # key -> (position of the key, value node); insertion order = file order
    entries: dict = field(default_factory=dict)
    pos: Pos = Pos(0, 0)

    def get(self, key: str):
        entry = self.entries.get(key)
        return None if entry is None else entry[1]


YNode = Union[YScalar, YSeq, YMap]

_constructor = yaml.constructor.SafeConstructor()


def describe(node: YNode) -> str:
    """A short human description of a node for 'expected X, got Y' messages."""
    if isinstance(node, YMap):
        return "a mapping"
    if isinstance(node, YSeq):
        return "a list"
    return "nothing (null)" if node.is_null else f"`{node.text}`"


class ValueProblem(ValueError):
    """A scalar does not have the type the schema expects; the message says what to write."""


def parse(text: str, filename: str, document: str = "an experiment file",
          empty: str = "an experiment needs at least `name:`") -> "tuple[Optional[YNode], list[tuple[Pos, str, str]]]":
    """Parse one YAML document: (root or None, problems as (pos, key path, message))."""
    try:
        loader = _Loader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        msg = " ".join(str(p) for p in (exc.context, exc.problem) if p)
        if "expected a single document" in msg:
            msg = f"more than one YAML document (`---`); {document} holds exactly one"
        return None, [(_pos(mark) if mark is not None else Pos(1, 1), "", f"YAML syntax error: {msg}")]
    except yaml.YAMLError as exc:  # e.g. a reader error (control characters)
        return None, [(Pos(1, 1), "", f"YAML error: {exc}")]
    if root is None:
        return None, [(Pos(1, 1), "", f"the file is empty; {empty}")]
    problems: "list[tuple[Pos, str, str]]" = []
    return _convert(root, "", problems, {}), problems


def _convert(node, path: str, problems: list, seen: dict) -> YNode:
    # Aliases give the same node object twice: convert once (also guards against alias loops).
    key = id(node)
    if key in seen:
        return seen[key]
    if isinstance(node, yaml.ScalarNode):
        tag = node.tag
        if tag not in _SCALAR_TAGS:
            problems.append((_pos(node.start_mark), path, f"unsupported YAML tag `{tag}`"))
            tag = STR
        out: YNode = YScalar(node.value, tag, not node.style, _pos(node.start_mark))  # C loader: "" = plain
    else:
        is_seq = isinstance(node, yaml.SequenceNode)
        out = YSeq([], _pos(node.start_mark)) if is_seq else YMap({}, _pos(node.start_mark))
        seen[key] = out
        if node.tag != ("tag:yaml.org,2002:seq" if is_seq else "tag:yaml.org,2002:map"):
            problems.append((out.pos, path, f"unsupported YAML tag `{node.tag}`"))
    if isinstance(out, YSeq):
        out.items.extend(_convert(n, f"{path}[{i}]", problems, seen) for i, n in enumerate(node.value))
    elif isinstance(out, YMap):
        merged: "list[YMap]" = []
        for knode, vnode in node.value:
            if isinstance(knode, yaml.ScalarNode) and knode.tag == MERGE:
                merged.extend(_merge_sources(vnode, path, problems, seen))
                continue
            if not isinstance(knode, yaml.ScalarNode) or knode.tag not in (STR, INT, BOOL, NULL, FLOAT):
                problems.append((_pos(knode.start_mark), path, "keys must be plain names, not lists or mappings"))
                continue
            name = knode.value  # `on:` as a key stays the text "on": the schema then names it as unknown
            kpos = _pos(knode.start_mark)
            child_path = f"{path}.{name}" if path else name
            if name in out.entries:
                first = out.entries[name][0]
                problems.append((kpos, child_path, f"duplicate key `{name}` (first defined at line {first.line}); "
                                                   "YAML would silently keep only the last one"))
                continue
            out.entries[name] = (kpos, _convert(vnode, child_path, problems, seen))
        # `<<: *anchor` merges: keys written explicitly win, earlier merge sources win over later ones.
        for src in merged:
            for name, entry in src.entries.items():
                out.entries.setdefault(name, entry)
    seen[key] = out
    return out


def _merge_sources(vnode, path: str, problems: list, seen: dict) -> "list[YMap]":
    value = _convert(vnode, path, problems, seen)
    sources = value.items if isinstance(value, YSeq) else [value]
    good = [s for s in sources if isinstance(s, YMap)]
    if len(good) != len(sources):
        problems.append((value.pos, path, "`<<` merges mappings only"))
    return good


# ---------------------------------------------------------------- typed accessors (raise ValueProblem)

def _yaml11_surprise(node: YScalar) -> Optional[str]:
    """A message if YAML 1.1 reads this plain scalar as something other than what it looks like."""
    if not node.plain or node.tag == STR:
        return None
    text = node.text
    if node.tag == BOOL:
        if text in _TRUE_FALSE:
            return None
        value = node.yaml_value()
        return (f"`{text}` is read by YAML 1.1 as the boolean {str(value).lower()}; "
                f"write true/false for a boolean, or quote it ('{text}') for the string")
    if node.tag == INT and not _DECIMAL_RE.match(text):
        return (f"`{text}` is read by YAML 1.1 as the number {node.yaml_value()} (octal/hex/base-60/underscores); "
                f"write a plain decimal number, or quote it ('{text}') for the string")
    if node.tag == FLOAT and not _PLAIN_FLOAT_RE.match(text):
        return (f"`{text}` is read by YAML 1.1 as the number {node.yaml_value()}; "
                f"write a plain decimal number, or quote it ('{text}') for the string")
    return None


def _scalar(node: YNode, expected: str) -> YScalar:
    if not isinstance(node, YScalar):
        raise ValueProblem(f"expected {expected}, got {describe(node)}")
    surprise = _yaml11_surprise(node)
    if surprise:
        raise ValueProblem(surprise)
    return node


def as_str(node: YNode, expected: str = "a string") -> str:
    s = _scalar(node, expected)
    if s.plain and s.tag in (BOOL, NULL):
        if s.tag == NULL:
            raise ValueProblem(f"expected {expected}, got nothing (null)")
        raise ValueProblem(f"`{s.text}` is read by YAML as a boolean; quote it ('{s.text}') if you mean the string")
    return s.text


def as_int(node: YNode, expected: str = "an integer") -> int:
    s = _scalar(node, expected)
    if s.plain and s.tag == INT:
        return int(s.text)
    if _PREFIXED_INT_RE.match(s.text):
        raise ValueProblem(f"`{s.text}`: write integers in decimal (YAML 1.1 and 1.2 disagree on 0o/0x/0b numbers)")
    raise ValueProblem(f"expected {expected}, got {describe(s)}")


def as_bool(node: YNode) -> bool:
    s = _scalar(node, "true or false")
    if s.plain and s.tag == BOOL:
        return _TRUE_FALSE[s.text]
    raise ValueProblem(f"expected true or false, got {describe(s)}")


def as_size(node: YNode, expected: str = "a size (bytes, or e.g. 64KiB, 1MiB, 1GB)") -> int:
    return _as_unit(node, expected, parse_size)


def as_duration(node: YNode, expected: str = "a duration (e.g. 500ms, 5s, 2m)") -> float:
    return _as_unit(node, expected, parse_duration)


def _as_unit(node: YNode, expected: str, parse):
    """A number with a unit, read by `parse` (zcorch.units); its ValueError becomes the problem."""
    s = _scalar(node, expected)
    if s.tag in (BOOL, NULL) and s.plain:
        raise ValueProblem(f"expected {expected}, got {describe(s)}")
    try:
        return parse(s.text)
    except ValueError as exc:
        raise ValueProblem(str(exc)) from None


# ---------------------------------------------------------------- back to plain data

def to_data(node: YNode):
    """A tree as plain data (as yaml.safe_load makes it): `yaml.safe_dump(to_data(tree))` reads back the same."""
    if isinstance(node, YMap):
        return {name: to_data(child) for name, (_, child) in node.entries.items()}
    if isinstance(node, YSeq):
        return [to_data(item) for item in node.items]
    return node.yaml_value()


def with_source(node: YNode, source: str) -> YNode:
    """The same tree with every position replaced by `source` (messages then name it, not a line)."""
    pos = Pos(0, 0, source)
    if isinstance(node, YMap):
        return YMap({k: (pos, with_source(v, source)) for k, (_, v) in node.entries.items()}, pos)
    if isinstance(node, YSeq):
        return YSeq([with_source(item, source) for item in node.items], pos)
    return YScalar(node.text, node.tag, node.plain, pos)
