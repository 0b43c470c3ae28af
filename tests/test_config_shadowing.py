"""What a config function builds from its variables must not be overwritten by a loop on the way: the shape
of the bug that named an experiment after its reference's command baseline (the validator set
`name` from the file, then a loop over `reference.baselines` set `name` to each command's, and
`Experiment(name=name, ...)` took the last). Read with `ast`: a variable passed by keyword to a class a
function builds is not rebound inside a loop before that call (and not set again after the loop), as a loop
variable or by a plain assignment that does not read it (an accumulator such as `n = n + 1` reads it)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rebinds(loop: ast.AST) -> "dict[str, int]":
    """name -> first line of each plain rebinding inside `loop`: a loop variable (its own or a nested
    loop's), or an assignment whose value does not read the name (an accumulator `n = n + 1` does)."""
    out: "dict[str, int]" = {}
    for node in ast.walk(loop):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            targets, value = [node.target], None
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        reads = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} if value is not None else set()
        for name in _bound_names(targets):
            if name not in reads:
                out.setdefault(name, node.lineno)
    return out


def _bound_names(targets: list) -> "list[str]":
    """The names an assignment binds: `a`, `a, (b, *c)`; not `a[k]` or `a.b`, which change what a holds."""
    out = []
    for t in targets:
        if isinstance(t, ast.Name):
            out.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            out += _bound_names(t.elts)
        elif isinstance(t, ast.Starred):
            out += _bound_names([t.value])
    return out


def _builds(node: ast.AST) -> bool:
    """A call of a class (a capitalised name: Experiment(...), HostSpec(...)): what a config function builds."""
    if not isinstance(node, ast.Call):
        return False
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    return name[:1].isupper()


def overwritten_results(source: str) -> "list[tuple[int, str]]":
    """(line, name) of each keyword argument of a class built after a loop that rebinds it."""
    out = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        loops = [n for n in ast.walk(fn) if isinstance(n, (ast.For, ast.AsyncFor, ast.While))]
        for ret in (n for n in ast.walk(fn) if _builds(n)):
            args = {kw.value.id for kw in ret.keywords if isinstance(kw.value, ast.Name)}
            for loop in (lp for lp in loops if lp.end_lineno < ret.lineno):
                # (set again between the loop and the return: the loop's value is not what is returned)
                later = set(_bound_names([t for n in ast.walk(fn) if isinstance(n, ast.Assign)
                                          and loop.end_lineno < n.lineno < ret.lineno for t in n.targets]))
                out.update((line, name) for name, line in _rebinds(loop).items() if name in args - later)
    return sorted(out)


def test_the_checker_finds_the_bug_it_is_for():
    bug = ("def experiment(top, reference):\n    name = top['name']\n    n = 0\n"
           "    for b in reference.baselines:\n        name = b.kind[8:]\n        n = n + 1\n"
           "    return Experiment(name=name, count=n)\n")
    assert overwritten_results(bug) == [(5, "name")]
    assert overwritten_results(bug.replace("        name = b.kind", "        command = b.kind")) == []
    assert overwritten_results(bug.replace("for b in", "for name in")) == [(4, "name")]
    # a loop variable of the same name, set again after the loop: what is returned is the later value
    assert overwritten_results(bug.replace("    n = 0\n", "    for name in top:\n        pass\n    name = top['name']\n"
                                           ).replace("        name = b.kind", "        command = b.kind")) == []


def test_no_config_result_is_overwritten_by_a_loop():
    found = [f"{path.relative_to(ROOT)}:{line}: `{name}`"
             for path in sorted((ROOT / "zcorch" / "config").rglob("*.py"))
             for line, name in overwritten_results(path.read_text())]
    assert not found, "a loop rebinds a variable the function then returns in a call: " + ", ".join(found)
