"""One section of an experiment document, read alone for the analysis of a result set: the rest is not validated
again (its hosts may come from an inventory no longer there). ConfigError (file:line) for the section's problems.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from zcorch.config import yamlsrc as ys
from zcorch.config.checks import Checker, read_document
from zcorch.config.param_values import parse_param
from zcorch.config.reference import Reference, parse_reference
from zcorch.config.schema import Axis
from zcorch.config.validate import Validator
from zcorch.config.views import View, parse_report
from zcorch.params import PARAM_KEYS


def _section_of(text: str, path: str, key: str, parse: Callable[[Checker, ys.YNode], Any], absent: Any) -> Any:
    """One top-level section of an experiment document, parsed alone (`absent` without it)."""
    chk, root = read_document(text, path)
    node = root.get(key) if isinstance(root, ys.YMap) else None
    if node is None:
        return absent
    section = parse(chk, node)
    chk.raise_if_any()
    return section


def views_of(text: str, path: str = "<experiment>") -> "tuple[View, ...]":
    """The `report:` views of an experiment document alone (() without; a view may name a linked axis)."""
    axes = tuple(a.key for a in linked_axes_of(text, path))
    return _section_of(text, path, "report", lambda chk, node: parse_report(chk, node, axes), ())


def linked_axes_of(text: str, path: str = "<experiment>") -> "list[Axis]":
    """The linked axes of an experiment document's `matrix:` alone ([] without)."""
    def parse(chk: Checker, node: ys.YNode) -> "list[Axis]":
        v = Validator(path)
        axes = [a for a in v.matrix(node) if a.linked]  # the plain axes' problems are the run's business
        names = [k for k in node.entries if k not in PARAM_KEYS] if isinstance(node, ys.YMap) else []
        chk.problems += [p for p in v.problems if p[1].startswith(tuple(f"matrix.{a}" for a in names))]
        return axes
    return _section_of(text, path, "matrix", parse, [])


def reference_of(text: str, path: str = "<experiment>") -> Optional[Reference]:
    """The `reference:` section of an experiment document alone (None without one)."""
    return _section_of(text, path, "reference", lambda chk, node: parse_reference(chk, node, parse_param), None)
