"""The analysis names no baseline tool: what it needs of one (its rate, the record kinds a throughput is a share
of, those shown per filesystem, its version's row) is declared by the kind in zcorch/config/baselines/, so
adding a tool touches only its module and the registry. Code only: names and strings that are not docstrings."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from zcorch.config.baselines.registry import KINDS

ANALYSIS = Path(__file__).resolve().parent.parent / "zcorch" / "analysis"


def tool_words() -> "set[str]":
    """Every registered kind that runs a tool: its name, its record kinds and its tools' programs."""
    words = set()
    for kind in KINDS:
        tools = kind.tools(kind.default())
        if tools:
            words |= {kind.name, *kind.record_kinds, *(t.program for t in tools)}
    return words


def docstring_lines(source: str) -> "set[int]":
    """Line numbers of the module's, classes' and functions' docstrings."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def named_tools(source: str, words: "set[str]") -> "list[tuple[int, str]]":
    pattern = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True))
                         + r")(?![A-Za-z0-9])")
    skip = docstring_lines(source)
    hits = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NAME, tokenize.STRING) and tok.start[0] not in skip:
            # names split at underscores too: dd_write_mb_s names dd
            text = tok.string.replace("_", " ") if tok.type == tokenize.NAME else tok.string
            if pattern.search(text):
                hits.append((tok.start[0], tok.string))
    return hits


def test_the_registry_has_the_tools_this_test_looks_for():
    assert {"iperf3", "dd", "qperf"} <= tool_words()


def test_the_scan_finds_a_tool_in_code_and_not_in_a_docstring():
    words = tool_words()
    assert named_tools('"""iperf3 in a docstring"""\nx = ("dd_write",)\n', words) == [(2, '"dd_write"')]
    assert named_tools("dd_write_mb_s = 1\n", words) == [(1, "dd_write_mb_s")]
    assert named_tools("add_derived = 1\nqperfx = 2\n", words) == []


def test_the_analysis_package_names_no_baseline_tool():
    words = tool_words()
    found = {f"{path.relative_to(ANALYSIS.parent.parent)}:{line}: {text}"
             for path in sorted(ANALYSIS.rglob("*.py")) for line, text in named_tools(path.read_text(), words)}
    assert not found, "declare it on the BaselineKind (zcorch/config/baselines) instead:\n" + "\n".join(sorted(found))


def test_each_kind_reads_the_rate_of_its_own_records():
    from zcorch.analysis.frames import _baseline_rate
    from zcorch.config.baselines.registry import rate_of

    assert rate_of("iperf3", {"bits_per_second": 9.4e9, "MB_per_s": 1.0}) == 9.4e9
    assert rate_of("qperf", {"bits_per_second": 8e9, "bytes_per_second": 1e9}) == 8e9
    assert rate_of("dd_write", {"MB_per_s": 500.0, "bytes": 1, "wall_s": 1.0}) == 500.0 * 8e6
    assert rate_of("dd_read", {"MB_per_s": None}) is None           # a failed dd: no rate, not a guess
    assert rate_of("not-a-kind", {"bits_per_second": 1.0}) is None  # an unknown kind is not guessed at
    assert _baseline_rate("dd_write", {"MB_per_s": 125.0}) == (1.0, 125.0)
