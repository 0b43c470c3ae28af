"""One section of an experiment document, read alone: what the analysis of a result set needs.

A result set stores the experiment as it ran; its report, comparisons and reproduction read back only
the sections they use (`report:` views, the matrix's linked axes, `reference:`) without validating the rest
again (its hosts may come from an inventory no longer there). Each raises ConfigError (file:line) when the
document or the section itself has problems.
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
    """One top-level section of an experiment document, parsed alone (`absent` without it); ConfigError
    (file:line) when the document or the section has problems. The rest of the file is not validated again."""
    chk, root = read_document(text, path)
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
        v = Validator(path)
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
