"""The planner's matrix fast path (zcorch.plan_matrix.matrix_cells: canonical text joined from pre-rendered fragments, rule
verdicts memoised per outer combination) gives exactly what the plain path gives: every combination's params,
cell_id(params) of them, the exclude entries and the cell rules applied cell by cell. The plain path is written
out here as the oracle; docs/performance.md has what the fast path saves."""
from __future__ import annotations

from itertools import product

import pytest

from zcorch.config.cells import cell_problems, filesystem_problem
from zcorch.config.experiment import load_experiment
from zcorch.config.schema import amount_of, writes_bytes
from zcorch.plan import expand
from zcorch.plan_matrix import _compile_excludes, cell_id

FILES = {
    "plain": """\
name: a
params: {bytes: 1MiB, source: /dev/zero}
matrix:
  send_mode: [write, sendfile, splice, vmsplice, mmap]
  recv_mode: [read, splice]
  buffer: [4KiB, 64KiB, 1MiB]
  send_cpu: [null, 0]
skip_invalid: true
""",
    "excludes": """\
name: b
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  send_mode: [sendfile, write]
  send_cpu: [null, 0]
  recv_cpu: [null, 0, 1]
  window: [auto, 1MiB]
exclude:
  - {send_cpu: null, recv_cpu: [0, 1]}
  - {send_cpu: 0, recv_cpu: null, window: auto}
  - {send_mode: sendfile, window: 1MiB}
""",
    "linked": """\
name: c
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  pinning:
    - {send_cpu: null, recv_cpu: null}
    - {send_cpu: 0, recv_cpu: 1}
    - {label: same CPU, send_cpu: 0, recv_cpu: 0}
  send_mode: [sendfile, write]
exclude:
  - {pinning: same CPU, send_mode: sendfile}
""",
    "duration": """\
name: d
params: {duration: 2s, source: /dev/zero}
matrix:
  buffer: [64KiB, 128KiB]
  streams: [1, 2]
""",
}


def plain_matrix(exp) -> "tuple[list, list]":
    """(cells [(id, params)], dropped [(id, reason)]) of the matrix, one combination at a time."""
    base = exp.include_base()
    multi = [a for a in exp.matrix if len(a.values) > 1]
    excludes = _compile_excludes(exp, base, multi)
    bytes_written = writes_bytes(exp.params, exp.matrix)
    cells, dropped, seen = [], [], set()
    for combo in product(*(range(len(a.values)) for a in multi)):
        params = base.copy()
        for a, j in zip(multi, combo):
            params.update(a.assignment(j))
        if params["duration"] is not None and not bytes_written:
            params = amount_of(params, bytes_written)
        cid = cell_id(params)
        hit = next((i for i, conds in excludes if all(combo[ai] in ok for ai, ok in conds)), None)
        if hit is not None:
            dropped.append((cid, f"excluded by exclude[{hit}]"))
            continue
        problems = cell_problems(params)
        assert filesystem_problem(params) is None
        if problems:
            dropped.append((cid, "invalid: " + "; ".join(problems)))
        elif cid not in seen:
            seen.add(cid)
            cells.append((cid, params))
    return cells, dropped


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_fast_path_gives_what_the_plain_path_gives(write_yaml, name):
    exp = load_experiment(write_yaml(FILES[name]))
    plan = expand(exp)
    cells, dropped = plain_matrix(exp)
    assert [(c.id, c.params) for c in plan.cells] == cells
    assert [(d.id, d.reason) for d in plan.dropped] == dropped
    assert len(cells) > 1 and (name == "duration" or dropped)   # the file exercises what it is named for
