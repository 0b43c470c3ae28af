"""Expansion: cells, include/exclude, order, stable ids, cell-level rules, `zcorch plan` output."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from fixtures_analysis import zcorch_cli
from fixtures_spec import at, only_problem, problems_of
from zcorch.params import ID_OMIT_AT_DEFAULT
from zcorch.plan import canonical, cell_id, estimate, expand, load_plan, runs_json
from zcorch.cli.plan import render
from zcorch.config.experiment import PARAM_KEYS, load_experiment


def combos(plan, *keys):
    return [tuple(c.params[k] for k in keys) for c in plan.cells]


# ---------------------------------------------------------------- expansion

def test_cartesian_product_in_file_order(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        params: {bytes: 1MiB}
        matrix:
          send_mode: [write, vmsplice]
          buffer: [64KiB, 1MiB, 4KiB]
    """))
    assert combos(plan, "send_mode", "buffer") == [
        ("write", 65536), ("write", 1 << 20), ("write", 4096),
        ("vmsplice", 65536), ("vmsplice", 1 << 20), ("vmsplice", 4096)]
    assert all(c.origin == "matrix" for c in plan.cells)
    assert plan.varying == ["send_mode", "buffer"]  # parameter-table order


def test_run_params_are_complete_and_normalised(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        params: {bytes: 16GiB, timeout: 2m, send_cpu: 1}
        matrix:
          window: [auto, 1MiB]
    """))
    for run in plan.runs:
        assert set(run.params) == set(PARAM_KEYS)
        assert run.params["bytes"] == 16 << 30 and run.params["timeout"] == 120.0
        assert run.params["buffer"] == 128 * 1024 and run.params["send_cpu"] == 1
        assert run.params["recv_cpu"] is None and run.params["pipe_size"] is None
        assert run.params["gift"] is False and run.params["sink_state"] == "fresh"
    assert [r.params["window"] for r in plan.runs] == [None, 1 << 20]


def test_no_matrix_is_one_cell(write_yaml):
    plan = load_plan(write_yaml("name: t\nrepeats: 2\n"))
    assert len(plan.cells) == 1 and [r.repeat for r in plan.runs] == [0, 1]


def test_exclude_matches_merged_params_and_list_values(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        params: {sink: /tmp/x.dat}
        matrix:
          send_mode: [write, vmsplice, msg_zerocopy]
          recv_mode: [read, mmap, vmsplice]
        exclude:
          - {recv_mode: [mmap, vmsplice], sink: /tmp/x.dat, send_mode: msg_zerocopy}
          - {send_mode: vmsplice, recv_mode: read}
          - {sink: /dev/null}
    """))
    kept = combos(plan, "send_mode", "recv_mode")
    assert ("msg_zerocopy", "mmap") not in kept and ("msg_zerocopy", "vmsplice") not in kept
    assert ("vmsplice", "read") not in kept and ("msg_zerocopy", "read") in kept
    assert len(kept) == 6
    reasons = sorted(d.reason for d in plan.dropped)
    assert reasons == ["excluded by exclude[0]"] * 2 + ["excluded by exclude[1]"]
    # a fixed parameter that never matches: the entry excludes nothing and says so
    assert any("exclude[2] matches no cell" in w for w in plan.warnings)


def test_include_adds_cells_not_subject_to_exclude(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        params: {bytes: 1MiB}
        matrix:
          send_mode: [write, vmsplice]
          buffer: [64KiB]
        exclude:
          - {send_mode: vmsplice}
        include:
          - {send_mode: vmsplice, source: /dev/zero}
          - {send_mode: msg_zerocopy, buffer: 1MiB}
    """))
    assert [(c.params["send_mode"], c.params["source"], c.params["buffer"], c.origin) for c in plan.cells] == [
        ("write", "mem", 65536, "matrix"),
        ("vmsplice", "/dev/zero", 65536, "include[0]"),     # single-valued axis buffer applies
        ("msg_zerocopy", "mem", 1 << 20, "include[1]"),     # the entry wins
    ]


def test_identical_cells_are_merged(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        repeats: 2
        matrix:
          send_mode: [write, vmsplice]
        include:
          - {send_mode: write, buffer: 128KiB}
          - {send_mode: msg_zerocopy}
          - {send_mode: msg_zerocopy}
    """))
    assert [c.params["send_mode"] for c in plan.cells] == ["write", "vmsplice", "msg_zerocopy"]
    assert len(plan.runs) == 6 and len({(r.id, r.repeat) for r in plan.runs}) == 6
    assert [o for o, _ in plan.merged] == ["include[0]", "include[2]"]
    assert any("include[0] is identical to cell" in w for w in plan.warnings)


# ---------------------------------------------------------------- order

ORDER_FILE = """
    name: t
    repeats: 3
    order: {order}
    seed: {seed}
    matrix:
      buffer: [4KiB, 8KiB, 16KiB, 32KiB, 64KiB, 128KiB, 256KiB, 512KiB]
"""


def _runs(write_yaml, order, seed=0, name="o.yaml"):
    plan = load_plan(write_yaml(ORDER_FILE.format(order=order, seed=seed), name))
    return plan, [(r.id, r.repeat) for r in plan.runs]


def test_sequential_runs_all_repeats_of_a_cell_first(write_yaml):
    plan, runs = _runs(write_yaml, "sequential")
    ids = [c.id for c in plan.cells]
    assert runs == [(i, r) for i in ids for r in range(3)]


def test_interleave_runs_repeat_r_of_every_cell_before_r_plus_1(write_yaml):
    plan, runs = _runs(write_yaml, "interleave")
    ids = [c.id for c in plan.cells]
    assert runs == [(i, r) for r in range(3) for i in ids]


def test_shuffle_is_deterministic_by_seed_and_round_robin(write_yaml):
    plan, a = _runs(write_yaml, "shuffle", seed=1, name="a.yaml")
    _, b = _runs(write_yaml, "shuffle", seed=1, name="b.yaml")
    _, c = _runs(write_yaml, "shuffle", seed=2, name="c.yaml")
    assert a == b and a != c
    ids = {cell.id for cell in plan.cells}
    for r in range(3):  # every round is a permutation of all cells
        round_ids = [i for i, rep in a[8 * r:8 * (r + 1)]]
        assert {rep for _, rep in a[8 * r:8 * (r + 1)]} == {r} and set(round_ids) == ids
    assert [i for i, _ in a[:8]] != [cell.id for cell in plan.cells]
    assert [i for i, _ in a[:8]] != [i for i, _ in a[8:16]]  # a fresh order each round


def test_shuffle_does_not_depend_on_axis_order(write_yaml):
    one = load_plan(write_yaml("name: t\norder: shuffle\nseed: 5\nmatrix:\n  buffer: [4KiB, 8KiB]\n"
                               "  send_mode: [write, vmsplice, msg_zerocopy]\n", "1.yaml"))
    two = load_plan(write_yaml("name: t\norder: shuffle\nseed: 5\nmatrix:\n"
                               "  send_mode: [msg_zerocopy, write, vmsplice]\n  buffer: [8KiB, 4KiB]\n", "2.yaml"))
    assert [r.id for r in one.runs] == [r.id for r in two.runs]


# ---------------------------------------------------------------- ids

def test_id_is_the_documented_hash_of_canonical_params(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        params: {pipe_size: 1MiB, timeout: 1500ms, fsync: true, sink: /tmp/x.dat}
        matrix:
          send_cpu: [null, 0, 3]
          gift: [false]
          window: [auto, 4MiB]
          send_mode: [vmsplice]
    """))
    for cell in plan.cells:
        # every parameter, but those added later (ID_OMIT_AT_DEFAULT: sample_interval, streams, ...) at their
        # default (left out: see the next tests)
        assert cell.params["sample_interval"] == 1.0 and cell.params["streams"] == 1
        kept = {k: v for k, v in cell.params.items() if k not in ID_OMIT_AT_DEFAULT or v != ID_OMIT_AT_DEFAULT[k]}
        text = json.dumps(kept, sort_keys=True, separators=(",", ":"))
        assert canonical(cell.params) == text
        assert cell.id == hashlib.sha256(text.encode()).hexdigest()[:12] == cell_id(cell.params)
    assert len({c.id for c in plan.cells}) == 6


def test_ids_of_cells_with_later_parameters_at_their_default_values_are_those_of_before(write_yaml):
    # The result sets in tests/data were recorded before streams, uring_depth... existed: the same
    # experiments still expand to the very ids of their plan.json (so --resume, compare and history
    # match them), whether or not a file spells the defaults out.
    for name in ("quickstart-small", "filesystems-small"):
        d = os.path.join(os.path.dirname(__file__), "data", name)
        with open(os.path.join(d, "plan.json")) as f:
            stored = [(r["id"], r["repeat"]) for r in json.load(f)]
        assert [(r.id, r.repeat) for r in load_plan(os.path.join(d, "experiment.yaml")).runs] == stored
    plain = load_plan(write_yaml("name: t\nmatrix: {send_mode: [write, sendfile], source: [/x]}\n", "a.yaml"))
    spelled = load_plan(write_yaml("name: t\nparams: {streams: 1, uring_depth: 8, send_cpus: null}\n"
                                   "matrix: {send_mode: [write, sendfile], streams: [1], source: [/x]}\n", "b.yaml"))
    assert [c.id for c in plain.cells] == [c.id for c in spelled.cells]
    # any other value is a different cell, also as the matrix's inner (fast-path) axis
    varied = load_plan(write_yaml("name: t\nmatrix: {send_mode: [write], streams: [1, 2, 4], uring_depth: [8, 16]}\n",
                                  "c.yaml"))
    assert len({c.id for c in varied.cells}) == 6
    for cell in varied.cells:
        assert cell.id == cell_id(cell.params)
    # streams 1 and depth 8 are the defaults: that cell's id is the one without them
    first = varied.cells[0]
    assert (first.params["streams"], first.params["uring_depth"]) == (1, 8)
    assert first.id == cell_id({k: v for k, v in first.params.items() if k not in ("streams", "uring_depth")})


def test_parameters_added_later_keep_older_ids_at_their_default(write_yaml):
    # sample_interval came after result sets were recorded: at its default the id is the one of the same
    # cell planned without it (so --resume, compare and history still match older sets); elsewhere it counts.
    for axis in ("[1s, 250ms, null]", "[1s]"):
        for inner in (True, False):   # the planner's fast path builds ids differently for the last axis
            axes = [f"sample_interval: {axis}", "send_mode: [write, vmsplice]"]
            plan = load_plan(write_yaml("name: t\nmatrix:\n  " + "\n  ".join(axes if not inner else axes[::-1])
                                        + "\n"))
            for cell in plan.cells:
                assert cell.id == cell_id(cell.params)
                older = {k: v for k, v in cell.params.items() if k != "sample_interval"}
                same = hashlib.sha256(canonical(older).encode()).hexdigest()[:12] == cell.id
                assert same == (cell.params["sample_interval"] == 1.0), cell.params["sample_interval"]
            assert len({c.id for c in plan.cells}) == len(plan.cells)


def test_ids_are_stable_under_reordering_and_unrelated_edits(write_yaml):
    a = load_plan(write_yaml("""
        name: a
        params: {bytes: 1GiB, buffer: 64KiB, sink: /dev/null}
        matrix:
          send_mode: [write, vmsplice]
          window: [1MiB, auto]
    """, "a.yaml"))
    b = load_plan(write_yaml("""
        name: b
        repeats: 4
        order: shuffle
        matrix:
          window: [auto, 1048576, 2MiB]
          send_mode: [vmsplice, write, msg_zerocopy]
        params: {sink: /dev/null, buffer: 65536, bytes: 1024MiB}
    """, "b.yaml"))
    ids_a = {(c.params["send_mode"], c.params["window"]): c.id for c in a.cells}
    ids_b = {(c.params["send_mode"], c.params["window"]): c.id for c in b.cells}
    assert ids_a and all(ids_b[k] == v for k, v in ids_a.items())
    # an include giving the same parameters as a matrix cell has that cell's id (and is merged)
    c = load_plan(write_yaml("name: c\ninclude:\n  - {send_mode: write, window: 1MiB, buffer: 64KiB, "
                             "bytes: 1GiB}\n", "c.yaml"))
    assert c.cells[0].id == ids_a[("write", 1 << 20)]


def test_runs_of_a_cell_share_its_id(write_yaml):
    plan = load_plan(write_yaml("name: t\nrepeats: 3\nmatrix:\n  send_mode: [write, vmsplice]\n"))
    assert [(r.id, r.repeat) for r in plan.runs] == [(c.id, k) for c in plan.cells for k in range(3)]


# ---------------------------------------------------------------- cells the worker cannot run

@pytest.mark.parametrize("axes,needle", [
    ("recv_mode: [read, mmap]", "receive mode `mmap` needs a regular file as sink"),
    ("send_mode: [write, sendfile]", "send mode `sendfile` reads from a file; source `mem`"),
    ("send_mode: [write, splice]", "send mode `splice` reads from a file"),
    ("send_mode: [write, mmap]\n  source: [/dev/zero]", "send mode `mmap` cannot map /dev/zero"),
    ("gift: [false, true]", "`gift` (SPLICE_F_GIFT) only applies to the vmsplice modes"),
    ("subblocks: [1, 8192]\n  buffer: [4KiB]", "subblocks (8192) > buffer (4096 bytes)"),
    ("fsync: [false, true]", "`fsync` needs a regular file as sink, not /dev/null"),
    ("sink_state: [fresh, overwrite]", "sink_state `overwrite` needs a regular file as sink"),
])
def test_invalid_cells_are_errors_naming_the_cells(write_yaml, axes, needle):
    path = write_yaml(f"name: t\nmatrix:\n  {axes}\n")
    p = only_problem(path)
    assert at(p, path, 2, 1) and "matrix: 1 cell cannot run" in p and needle in p
    assert "skip_invalid: true" in p
    bad = [c for c in expand(load_experiment(write_yaml(f"name: t\nskip_invalid: true\nmatrix:\n  {axes}\n",
                                                        "skip.yaml"))).dropped]
    assert len(bad) == 1 and bad[0].reason.startswith("invalid: ") and needle in bad[0].reason
    assert f"[{bad[0].id}]" in p


def test_invalid_include_names_the_include_line(write_yaml):
    path = write_yaml("""
        name: t
        include:
          - {send_mode: write}
          - {recv_mode: mmap}
    """)
    p = only_problem(path)
    assert at(p, path, 4, 5) and "include[1]: 1 cell cannot run" in p and "recv_mode=mmap" in p


def test_many_invalid_cells_are_grouped_per_reason(write_yaml):
    path = write_yaml("""
        name: t
        matrix:
          send_mode: [sendfile, splice]
          buffer: [4KiB, 8KiB, 16KiB, 32KiB, 64KiB]
    """)
    problems = problems_of(path)
    assert len(problems) == 2
    assert "5 cells cannot run" in problems[0] and "and 0 more" not in problems[0]
    path = write_yaml("name: t\nmatrix:\n  send_mode: [sendfile]\n  buffer: [1, 2, 3, 4, 5, 6, 7, 8]\n", "m.yaml")
    assert "and 3 more" in only_problem(path)


def test_filesystem_placeholder_needs_a_filesystem_in_the_cell(write_yaml):
    path = write_yaml("""
        name: t
        skip_invalid: true
        filesystems:
          ext4-loop: {fs: ext4, loop: {size: 1GiB}}
        params: {sink: "{filesystem}/recv.dat"}
        matrix:
          filesystem: [ext4-loop]
        include:
          - {filesystem: null}
    """)
    p = only_problem(path)  # even with skip_invalid: a file error, not a cell the worker refuses
    assert at(p, path, 9, 5) and "uses {filesystem} but the cell has no `filesystem`" in p


def test_filesystem_sink_is_kept_as_written(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        filesystems:
          a: {fs: ext4, loop: {size: 1GiB}}
          b: {path: /mnt/b}
        params: {sink: "{filesystem}/recv.dat", recv_mode: mmap}
        matrix:
          filesystem: [a, b]
    """))
    assert [(r.params["filesystem"], r.params["sink"]) for r in plan.runs] == [
        ("a", "{filesystem}/recv.dat"), ("b", "{filesystem}/recv.dat")]


def test_everything_excluded_is_an_error(write_yaml):
    p = only_problem(write_yaml("name: t\nmatrix:\n  send_mode: [write]\nexclude:\n  - {send_mode: write}\n"))
    assert "no cell left to run" in p


# ---------------------------------------------------------------- estimate and `zcorch plan`

def test_estimate_from_stated_assumptions(write_yaml):
    plan = load_plan(write_yaml("""
        name: t
        repeats: 2
        params: {bytes: 2GiB, timeout: 1s}
        matrix:
          buffer: [64KiB, 1MiB]
          timeout: [1s, 10s]
        baselines:
          iperf3: {duration: 3s, omit: 1}
          dd: {bs: 1MiB, count: 512}
    """))
    est = estimate(plan, rate=1024 ** 3, overhead=0.5)
    # 4 cells x 2 repeats; 2 GiB at 1 GiB/s = 2 s, capped at 1 s for the 1 s timeout cells
    assert est.transfer_s == pytest.approx(2 * (1 + 2 + 1 + 2))
    assert est.overhead_s == pytest.approx(8 * 0.5)
    # iperf3: 2 buffer x window pairs x (plain, -Z) x (3 + 1 + 0.5); dd: write + read of 512 MiB
    assert est.tests("iperf3") == 4 and est.tests("dd") == 2 and est.tests("qperf") == 0
    assert est.baseline_s == pytest.approx(4 * 4.5 + 2 * (0.5 + 0.5))
    assert est.total_s == pytest.approx(est.transfer_s + est.overhead_s + est.baseline_s)
    assert "assumed 1GiB/s" in est.explain()


def test_plan_table(write_yaml):
    path = write_yaml("""
        name: table
        description: two modes
        skip_invalid: true
        params: {bytes: 64MiB}
        matrix:
          send_mode: [write, vmsplice, sendfile]
          buffer: [64KiB, 1MiB]
        repeats: 3
    """)
    text = render(load_plan(path))
    assert "send_mode" in text.splitlines()[4] and "buffer" in text.splitlines()[4]
    assert "64KiB" in text and "1MiB" in text
    assert "4 cells x 3 repeats = 12 runs, order sequential" in text
    assert "dropped 2 cells:" in text and "invalid: send mode `sendfile` reads from a file" in text
    assert "bytes=64MiB" in text  # fixed parameters, human-readable
    assert "estimated duration" in text and "assumed" in text


def test_cli_plan_and_json(write_yaml):
    path = write_yaml("name: t\nrepeats: 2\norder: interleave\nmatrix:\n  send_mode: [write, vmsplice]\n")
    r = zcorch_cli("plan", path)
    assert r.returncode == 0 and "2 cells x 2 repeats = 4 runs" in r.stdout
    r = zcorch_cli("plan", path, "--json")
    assert r.returncode == 0, r.stderr
    runs = json.loads(r.stdout)
    plan = load_plan(path)
    assert runs == runs_json(plan)
    assert [(x["id"], x["repeat"]) for x in runs] == [(rn.id, rn.repeat) for rn in plan.runs]
    assert set(runs[0]) == {"id", "repeat", "params"} and runs[0]["params"]["buffer"] == 131072


def test_cli_rejects_bad_rate(write_yaml):
    path = write_yaml("name: t\n")
    r = zcorch_cli("plan", path, "--rate", "fast")
    assert r.returncode == 2 and "--rate" in r.stderr and "Traceback" not in r.stderr
