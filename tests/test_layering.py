"""The package layout is the architecture: imports only point down the stages, never up or in a circle.

    cli ─► sweep ─► provision, lab ─► hosts, results ─► plan ─► config ─► worker ─► core (errors, units, params)
    (hosts may also use worker: the dry-run hosts show the commands of zcorch.worker.remote's jobs)
    analysis ─► results, config, core

Every `import zcorch...`/`from zcorch... import` in every module counts, also those inside functions
(a lazy import is still a dependency). The worker package ships to bare hosts: it may import only the
standard library, the core and the built `zcorch._native`.
"""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

import zcorch

PACKAGE = Path(zcorch.__file__).parent
CORE = "core"   # the top-level modules of zcorch (errors, units, params, _version, ...)

# layer -> the layers it may import (itself always allowed).
ALLOWED = {
    CORE: set(),
    "worker": {CORE},
    "config": {"worker", CORE},
    "plan": {"config", "worker", CORE},
    "hosts": {"config", "worker", CORE},
    "results": {"config", CORE},
    "provision": {"hosts", "results", "plan", "config", "worker", CORE},
    "lab": {"provision", "hosts", "config", CORE},
    "sweep": {"provision", "hosts", "results", "plan", "config", "worker", CORE},
    "analysis": {"results", "config", CORE},
    "cli": {"sweep", "provision", "lab", "hosts", "results", "plan", "config", "analysis", "worker", CORE},
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("_native", "__main__"):
        return CORE if len(parts) == 1 or parts[1] == "_native" else "cli"
    sub = parts[1]
    if (PACKAGE / sub).is_dir():
        return sub
    if sub in ("plan", "plan_matrix"):
        return "plan"
    return CORE


def zcorch_imports(path: Path) -> "list[tuple[int, str]]":
    """(line, module) of every zcorch module the file imports, resolved to the deepest module name."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "zcorch"]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import (the layout uses absolute imports)"
            if node.module and node.module.split(".")[0] == "zcorch":
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    is_module = (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() or \
                        (PACKAGE.parent / sub.replace(".", "/")).is_dir()
                    out.append((node.lineno, sub if is_module else node.module))
    return out


def all_modules() -> "dict[str, Path]":
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_imports_point_down_the_stages():
    wrong = []
    for mod, path in sorted(all_modules().items()):
        src = layer_of(mod)
        for line, target in zcorch_imports(path):
            dst = layer_of(target)
            if dst != src and dst not in ALLOWED[src]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {mod} ({src}) imports {target} ({dst})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycles():
    modules = all_modules()
    graph = {m: {t for _, t in zcorch_imports(p) if t in modules and t != m} for m, p in modules.items()}
    # A package __init__ importing its own submodules is not a cycle of stages: skip parent -> child edges.
    graph = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}
    state: "dict[str, int]" = {}
    stack: "list[str]" = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("path", sorted((PACKAGE / "worker").glob("*.py")), ids=lambda p: p.name)
def test_worker_package_is_stdlib_only(path):
    """What ships to hosts imports the standard library, the core and zcorch._native, nothing else."""
    tree = ast.parse(path.read_text(), str(path))
    third_party = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        for name in names:
            top = name.split(".")[0]
            # cffi/_cffi_backend: preflight probes whether the host has them (remote.py), nothing more
            if top != "zcorch" and top not in sys.stdlib_module_names and top not in ("cffi", "_cffi_backend"):
                third_party.append(f"{path.name}:{node.lineno}: {name}")
    assert not third_party, third_party


def test_layering_rules_catch_an_upward_import(tmp_path):
    """The checker itself: an analysis module importing the sweep stage is reported."""
    assert "sweep" not in ALLOWED["analysis"]
    probe = PACKAGE / "analysis" / "frames.py"
    assert any(layer_of(t) == "results" for _, t in zcorch_imports(probe)), \
        "frames reads result sets: the walker must see that import"
    fake = tmp_path / "x.py"
    fake.write_text("def f():\n    from zcorch.sweep import runner\n")
    assert zcorch_imports(fake) == [(2, "zcorch.sweep.runner")]
    assert os.path.isdir(PACKAGE / "sweep")
