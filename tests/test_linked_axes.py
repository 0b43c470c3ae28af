"""Linked matrix axes (a named axis whose values set parameters together) and per-side buffers, from the file
to the plan, to a real localhost run's results frame, report view and tables."""
from __future__ import annotations

import pytest

from fixtures_run import TAG_VAR
from fixtures_spec import at, only_problem, problems_of
from zcorch.analysis import plots
from zcorch.analysis.load import load
from zcorch.analysis.report import cells_table, results_section
from zcorch.analysis.stats import varying_params
from zcorch.cli.plan import render
from zcorch.config.experiment import linked_axes_of, load_experiment, parse_experiment, views_of
from zcorch.errors import ConfigError
from zcorch.plan import expand, load_plan
from zcorch.sweep.pipeline import run_sweep

LINKED = """\
name: pin
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  send_mode: [sendfile, write]
  pinning:
    - {send_cpu: null, recv_cpu: null}
    - {send_cpu: 0, recv_cpu: 1}
    - {label: same CPU, send_cpu: 0, recv_cpu: 0}
baselines: false
report:
  views: [{x: pinning, hue: send_mode}]
"""

EXCLUDES = """\
name: pin
params: {bytes: 1MiB, source: /dev/zero, timeout: 10s}
matrix:
  send_mode: [sendfile, write]
  send_cpu: [null, 0]
  recv_cpu: [null, 0, 1]
exclude:
  - {send_cpu: null, recv_cpu: [0, 1]}
  - {send_cpu: 0, recv_cpu: null}
baselines: false
"""


# ---------------------------------------------------------------- the plan

def test_a_linked_axis_expands_to_its_combinations_with_the_ids_of_the_exclude_based_file(write_yaml):
    plan = load_plan(write_yaml(LINKED))
    assert len(plan.cells) == 6 and not plan.dropped
    same = load_plan(write_yaml(EXCLUDES, "excludes.yaml"))
    assert {c.id for c in plan.cells} == {c.id for c in same.cells}  # ids from the parameters only
    # file order: first axis outermost, the linked axis's values in their order
    assert [(c.params["send_mode"], c.params["send_cpu"], c.params["recv_cpu"]) for c in plan.cells] == [
        ("sendfile", None, None), ("sendfile", 0, 1), ("sendfile", 0, 0),
        ("write", None, None), ("write", 0, 1), ("write", 0, 0)]
    axis = plan.experiment.linked_axes()[0]
    assert axis.labels == ["send_cpu=none recv_cpu=none", "send_cpu=0 recv_cpu=1", "same CPU"]
    assert plan.varying == ["send_mode", "send_cpu", "recv_cpu"] and plan.linked == [axis]
    text = render(plan)
    header = next(line for line in text.splitlines() if line.startswith("#"))
    assert header.split()[:4] == ["#", "id", "pinning", "send_mode"]
    assert "same CPU" in text and "send_cpu=0 recv_cpu=1" in text


def test_a_linked_axis_as_the_outer_axis_and_with_parameters_of_the_id(write_yaml):
    # linked axis first (outer loop) and per-side buffers inside it: same cells as written one by one
    path = write_yaml("""\
        name: t
        params: {buffer: 64KiB, source: /dev/zero}
        matrix:
          sender: [{send_mode: sendfile, send_buffer: null}, {send_mode: write, send_buffer: 8KiB}]
          recv_cpu: [null, 1]
    """)
    plan = load_plan(path)
    inc = load_plan(write_yaml("""\
        name: t
        params: {buffer: 64KiB, source: /dev/zero}
        include:
          - {send_mode: sendfile, recv_cpu: null}
          - {send_mode: sendfile, recv_cpu: 1}
          - {send_mode: write, send_buffer: 8KiB, recv_cpu: null}
          - {send_mode: write, send_buffer: 8KiB, recv_cpu: 1}
    """, "inc.yaml"))
    assert [c.id for c in plan.cells] == [c.id for c in inc.cells]
    assert [c.params["send_buffer"] for c in plan.cells] == [None, None, 8192, 8192]


def test_exclude_by_the_axis_parameters_or_by_its_labels(write_yaml):
    by_params = LINKED.replace("baselines:", "exclude:\n  - {send_mode: write, send_cpu: 0, recv_cpu: 0}\nbaselines:")
    by_label = LINKED.replace("baselines:", "exclude:\n  - {send_mode: write, pinning: same CPU}\nbaselines:")
    one_key = LINKED.replace("baselines:", "exclude:\n  - {recv_cpu: 0}\nbaselines:")
    a, b, c = (load_plan(write_yaml(t, f"{i}.yaml")) for i, t in enumerate((by_params, by_label, one_key)))
    assert len(a.cells) == len(b.cells) == 5 and {x.id for x in a.cells} == {x.id for x in b.cells}
    assert [d.reason for d in b.dropped] == ["excluded by exclude[0]"]
    assert len(c.cells) == 4 and all(x.params["recv_cpu"] != 0 for x in c.cells)
    # both keys of one linked axis must hold: (send_cpu 0, recv_cpu 1) is not (0, 0)
    both = LINKED.replace("baselines:", "exclude:\n  - {send_cpu: 0, recv_cpu: 0}\nbaselines:")
    assert len(load_plan(write_yaml(both, "both.yaml")).cells) == 4


def test_set_replaces_a_linked_axis(write_yaml):
    path = write_yaml(LINKED)
    plan = load_plan(path, ["pinning=[{send_cpu: 0, recv_cpu: 1}]"])
    assert [(c.params["send_cpu"], c.params["recv_cpu"]) for c in plan.cells] == [(0, 1), (0, 1)]
    one = load_plan(path, ["pinning={label: mine, send_cpu: 1, recv_cpu: 1}"])
    assert one.experiment.linked_axes()[0].labels == ["mine"] and len(one.cells) == 2
    assert "pinning" in one.experiment.effective  # the effective document keeps the axis (resume reads it)
    with pytest.raises(ConfigError, match=r"--set pinning=\[\{send_cpu: 0, recv_cpu: x\}\].*matrix.pinning\[0\].recv_cpu"):
        load_plan(path, ["pinning=[{send_cpu: 0, recv_cpu: x}]"])


def test_include_must_set_every_parameter_of_a_varying_linked_axis(write_yaml):
    path = write_yaml(LINKED.replace("baselines:", "include:\n  - {send_mode: splice, send_cpu: 1}\nbaselines:"))
    p = only_problem(path)
    assert at(p, path, 10) and "include[0]" in p and "linked axis `pinning` (send_cpu, recv_cpu" in p
    ok = write_yaml(LINKED.replace("baselines:", "include:\n  - {send_mode: write, send_cpu: 1, recv_cpu: 1}\n"
                                                 "baselines:"), "ok.yaml")
    plan = load_plan(ok)
    labels = {a.key: a.label_of(plan.cells[-1].params) for a in plan.experiment.linked_axes()}
    assert len(plan.cells) == 7 and labels == {"pinning": "send_cpu=1 recv_cpu=1"}


# ---------------------------------------------------------------- validation: file:line and the key

@pytest.mark.parametrize("matrix, line, key, words", [
    ("  pinning: [{send_cpu: 0, recv_cpux: 1}]", 4, "matrix.pinning[0].recv_cpux",
     "unknown parameter `recv_cpux`; did you mean `recv_cpu"),
    ("  pinning: [{send_cpu: 0, recv_cpu: 1}, {send_cpu: 1}]", 4, "matrix.pinning[1]",
     "lacks recv_cpu: every value of a linked axis sets the same parameters"),
    ("  pinning: [{send_cpu: 0}, {send_cpu: 0}]", 4, "matrix.pinning[1]", "duplicate value"),
    ("  pinning: [{label: a, send_cpu: 0}, {label: a, send_cpu: 1}]", 4, "matrix.pinning[1]", "duplicate label `a`"),
    ("  pinning: [{send_cpu: 0}, 3]", 4, "matrix.pinning[1]", "expected a mapping of parameters"),
    ("  pinning: [{send_cpu: -1}]", 4, "matrix.pinning[0].send_cpu", "between 0 and 65535"),
    ("  send_cpu: [{send_cpu: 0, recv_cpu: 1}]", 4, "matrix.send_cpu[0]", "`send_cpu` is a parameter"),
    ("  status: [{send_cpu: 0}, {send_cpu: 1}]", 4, "matrix.status", "cannot name a linked axis"),
    ("  send_cpu: [0, 1]\n  pinning: [{send_cpu: 0, recv_cpu: 1}]", 5, "matrix.pinning",
     "`send_cpu` is set by two axes (`matrix.send_cpu` and `matrix.pinning`)"),
    ("  pinning: 3", 4, "matrix.pinning", "unknown key `pinning`"),
    ("  pinning: [{label: \"\", send_cpu: 0}]", 4, "matrix.pinning[0].label", "not a usable label"),
])
def test_bad_linked_axes_name_file_line_and_key(write_yaml, matrix, line, key, words):
    path = write_yaml("name: t\nparams: {bytes: 1MiB}\nmatrix:\n" + matrix + "\n")
    p = only_problem(path)
    assert at(p, path, line), p
    assert f": {key}: " in p and words in p, p


def test_an_exclude_label_that_is_not_one_of_the_axis_is_an_error(write_yaml):
    path = write_yaml(LINKED.replace("baselines:", "exclude:\n  - {pinning: same CPUs}\nbaselines:"))
    p = only_problem(path)
    assert at(p, path, 10) and "exclude[0].pinning" in p and "did you mean `same CPU`" in p


def test_views_name_linked_axes_and_nothing_else(write_yaml):
    assert [v.x for v in views_of(LINKED)] == [("pinning",)]
    assert [a.key for a in linked_axes_of(LINKED)] == ["pinning"]
    bad = LINKED.replace("x: pinning", "x: pining")
    with pytest.raises(ConfigError, match=r"report.views\[0\].x: `pining` is not a parameter or a linked axis "
                                          r"of the matrix \(pinning\); did you mean `pinning`"):
        parse_experiment(bad, "exp.yaml")
    with pytest.raises(ConfigError, match="report.views"):
        views_of(bad)


# ---------------------------------------------------------------- per-side buffers in the cell rules

def test_cell_rules_use_each_sides_own_buffer(write_yaml):
    path = write_yaml("name: t\nparams: {buffer: 64KiB, send_buffer: 4, subblocks: 8}\n")
    assert "subblocks (8) > send_buffer (4 bytes)" in only_problem(path)
    ok = write_yaml("name: t\nparams: {buffer: 4, recv_buffer: 64KiB, send_buffer: 64KiB, subblocks: 8}\n", "ok.yaml")
    assert len(load_plan(ok).cells) == 1  # `buffer` itself is used by no side
    assert any("subblocks (8) > buffer (4 bytes)" in p for p in problems_of(write_yaml(
        "name: t\nparams: {buffer: 4, subblocks: 8}\n", "shared.yaml")))


# ---------------------------------------------------------------- a real run: frame, view, tables

@pytest.mark.slow
def test_a_localhost_run_has_the_axis_column_its_view_and_integer_cpus(tmp_path, tag, monkeypatch):
    monkeypatch.setenv(TAG_VAR, tag)
    exp = tmp_path / "pin.yaml"
    exp.write_text(LINKED)
    result = run_sweep(str(exp), output=str(tmp_path / "rs"), command=["test"])
    assert result.status == "complete"
    df = load(tmp_path / "rs")
    assert list(df.columns).index("pinning") == list(df.columns).index("send_cpu") - 1
    by_cell = dict(zip(df["cell"], df["pinning"]))
    plan = expand(load_experiment(str(exp)))
    assert by_cell == {c.id: plan.experiment.linked_axes()[0].label_of(c.params) for c in plan.cells}
    assert varying_params(df) == ["send_mode", "pinning"]
    assert varying_params(df, with_members=True) == ["send_mode", "pinning", "send_cpu", "recv_cpu"]
    # the declared view: x = the axis's labels in file order (not alphabetical), colour = send mode
    (view,) = views_of((tmp_path / "rs" / "experiment.yaml").read_text())
    plot = plots.small_multiples(df, view, name="view-1")
    assert plot.figure is not None
    ticks = [t.get_text() for t in plot.figure.axes[0].get_xticklabels()]
    assert ticks == ["send_cpu=none recv_cpu=none", "send_cpu=0 recv_cpu=1", "same CPU"]
    # the default view and the Results tables take the axis too
    default, _ = plots.default_view(df)
    assert default.x == ("pinning",) and default.hue == ("send_mode",)
    section = results_section(df)
    (_, table), = section["tables"]
    assert table.header[1:] == ["send_cpu=none recv_cpu=none", "send_cpu=0 recv_cpu=1", "same CPU"]
    cells = cells_table(df)
    at = cells.header.index("send_mode")   # the table leads with the modes, the cell id comes last
    assert cells.header[at:at + 4] == ["send_mode", "pinning", "send_cpu", "recv_cpu"]
    cpus = {v for row in cells.rows for v in row[at + 2:at + 4]}
    assert cpus == {"", "0", "1"}  # integers, never 0.0, though the column holds NaN and floats (unpinned: blank)
    assert df["send_cpu"].dtype.kind == "f"  # (pandas made the column float: the labels must not show it)
    # the end-of-run summary names the axis and its labels as `zcorch plan` does
    head, *rows = result.summary().splitlines()[:1 + len(plan.cells)]
    assert head.split()[:2] == ["cell", "pinning"]
    assert sum("same CPU" in r for r in rows) == len({c.params["send_mode"] for c in plan.cells})
