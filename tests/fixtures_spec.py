"""Helpers for the spec/plan tests: real experiment files written to tmp_path, and their errors."""
from __future__ import annotations

import re
import textwrap

import pytest

from zcorch.errors import ConfigError
from zcorch.config.experiment import load_experiment

MINIMAL = "name: t\n"


@pytest.fixture
def write_yaml(tmp_path):
    """write_yaml(text, name="exp.yaml") -> path of a real file holding the dedented text."""
    def write(text: str, name: str = "exp.yaml") -> str:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"))
        return str(path)
    return write


def problems_of(path: str) -> "list[str]":
    """Every problem load_experiment (and expand) reports for a file; fails if it loads cleanly."""
    from zcorch.plan import expand

    with pytest.raises(ConfigError) as info:
        expand(load_experiment(path))
    assert info.value.exit_status == 2
    return info.value.problems


def only_problem(path: str) -> str:
    problems = problems_of(path)
    assert len(problems) == 1, problems
    return problems[0]


def at(problem: str, path: str, line: int, column: "int | None" = None) -> bool:
    """Does the problem start with path:line[:column]:?"""
    m = re.match(rf"^{re.escape(path)}:(\d+):(\d+): ", problem)
    return bool(m) and int(m.group(1)) == line and (column is None or int(m.group(2)) == column)
