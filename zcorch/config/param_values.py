"""Parameter values: `PARAM_PARSERS[key](node)` returns the normalised value of a parameter of the table
(zcorch.params) from its YAML node, or raises `ys.ValueProblem`; `parse_param` adds a hint for lists.
"""
from __future__ import annotations

from typing import Any, Callable

from zcorch.config import yamlsrc as ys
from zcorch.config.checks import NAME_RE, NAME_RULE
from zcorch.config.checks import choice as _choice
from zcorch.config.checks import placeholder_path as _placeholder_path
from zcorch.config.checks import unquoted_placeholder as _unquoted_placeholder
from zcorch.params import PARAMS, Param, limit_problem
from zcorch.worker import native  # parse_cpus only: pure Python, no compiled module needed


def _auto_or(node: ys.YNode, inner: Callable) -> Any:
    auto = isinstance(node, ys.YScalar) and (node.is_null and node.plain or node.text == "auto")
    return None if auto else inner(node)


def _null_or(node: ys.YNode, inner: Callable) -> Any:
    return None if isinstance(node, ys.YScalar) and node.is_null and node.plain else inner(node)


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


def _in_limits(p: Param, value: Any) -> Any:
    """A numeric parameter's value within the table's limits (the worker's own, with the same message)."""
    problem = limit_problem(p, value)
    if problem:
        raise ys.ValueProblem(problem)
    return value


# kind -> parser of one value of a Param of that kind (zcorch.params.KINDS)
_KIND_PARSERS: "dict[str, Callable[[ys.YNode, Param], Any]]" = {
    "choice": lambda n, p: _choice(n, p.choices, p.noun),
    "size": lambda n, p: _in_limits(p, ys.as_size(n)),
    "int": lambda n, p: _in_limits(p, ys.as_int(n)),
    "cpu": lambda n, p: _in_limits(p, ys.as_int(n)),
    "bool": lambda n, p: ys.as_bool(n),
    "duration": lambda n, p: _in_limits(p, ys.as_duration(n)),
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
