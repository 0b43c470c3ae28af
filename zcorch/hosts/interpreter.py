"""How zcorch starts a Python interpreter on a host so that nothing is imported from the current directory.

`python -m/-c/-` put the current directory first on sys.path, and zcorch runs as root from anywhere: a
`json.py` there would run as root. So every interpreter runs with `-P` (3.11+) or as `python -c BOOTSTRAP`,
which drops that entry before any import. Not `-I`: it also drops PYTHONPATH and the user site directory.
`module_of(argv)` is the inverse of `python_argv`, for the dry run.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

# Drops the '' -c put first (absent under PYTHONSAFEPATH=1). Double quotes only: logs single-quote it.
_DROP_CWD = 'import sys; sys.path[:1] == [""] and sys.path.pop(0)'
_RUN_MODULE = _DROP_CWD + '; import runpy; runpy.run_module("{module}", run_name="__main__", alter_sys=True)'
# bytes: the program's own coding (UTF-8) applies, whatever the host's locale says
_RUN_STDIN = _DROP_CWD + '; exec(compile(sys.stdin.buffer.read(), "<stdin>", "exec"))'
STDIN = "-"


def python_argv(python: str, module: Optional[str], flags: Sequence[str] = (), safe_path: bool = False) -> List[str]:
    """[python, *flags, ...] running `module` (None: the program the caller writes to stdin), arguments to be
    appended; safe_path: the interpreter is 3.11+ (-P), else the -c bootstrap."""
    if module is not None and not all(part.isidentifier() for part in module.split(".")):
        raise ValueError(f"not a module name: {module!r}")
    if safe_path:
        return [python, *flags, "-P", *(["-m", module] if module else [STDIN])]
    return [python, *flags, "-c", _RUN_MODULE.format(module=module) if module else _RUN_STDIN]


def module_of(argv: Sequence[str]) -> Optional[Tuple[str, int]]:
    """(module, index of its first argument) of an argv python_argv made ("-" for a program on stdin), or None."""
    for i, a in enumerate(argv[1:], 1):
        if a == "-m" and i + 1 < len(argv):
            return argv[i + 1], i + 2
        if a == STDIN:
            return STDIN, i + 1
        if a == "-c" and i + 1 < len(argv):
            code = argv[i + 1]
            if code == _RUN_STDIN:
                return STDIN, i + 2
            head, _, tail = _RUN_MODULE.partition("{module}")
            if code.startswith(head) and code.endswith(tail):
                return code[len(head):len(code) - len(tail)], i + 2
            return None
        if not a.startswith("-"):
            return None
    return None
