"""Repeat until stable: `repeats: {min, max, target_ci}`.

The decision is pure (zcorch.results.convergence, zcorch.sweep.adaptive) and tested on values; the sweep is
tested with real localhost runs. Whether a real cell converges depends on this machine's noise, which a
test must not assert, so the real sweeps use targets no cell can miss (100000%: the loop must stop at the
first run with a 95% interval, the 6th) or can meet (0.001%: no two runs agree that closely, so every
cell runs to max): they test when the loop stops, what it records and who shows it, not the machine.
"""
import json
import math
import re
import os
import shutil
import signal
import uuid

import pytest

import zcorch
from fixtures_analysis import zcorch_cli
from fixtures_run import start_zcorch, stall_a_run, tagged_worker_pids, wait_no_workers, wait_records
from fixtures_run import zcorch as zcorch_run
from zcorch.analysis.compare import compare_frames
from zcorch.analysis.gate import completeness
from zcorch.analysis.report import build_report
from zcorch.cli.plan import render
from zcorch.config.experiment import load_experiment
from zcorch.errors import ConfigError
from zcorch.plan import estimate, expand, runs_json
from zcorch.results.convergence import RepeatPolicy, cell_state, incomplete_cells, run_value
from zcorch.results.store import latest_runs, read_jsonl
from zcorch.sweep.adaptive import Convergence

EXP = """name: {name}
params:
  bytes: {bytes}
  timeout: 30s
matrix:
  buffer: [64KiB, 128KiB]
repeats: {repeats}
order: interleave
baselines: false
"""
LOOSE = "{min: 3, max: 10, target_ci: 100000%}"      # every cell converges at its 6th ok run
TIGHT = "{min: 3, max: 8, target_ci: 0.001%}"        # no cell converges: each runs max times


def write_exp(path, repeats, name="t", bytes="1MiB"):
    path.write_text(EXP.format(name=name, repeats=repeats, bytes=bytes))
    return path


def ok_record(cell, repeat, gbit, status="ok"):
    """A run record with the receiver's bytes and wall time for `gbit` Gbit/s."""
    nbytes = 1 << 20
    rec = {"cell": cell, "repeat": repeat, "status": status,
           "receiver": {"bytes": nbytes, "wall_ns": int(nbytes * 8 / gbit)} if status == "ok" else None}
    return rec


# ---------------------------------------------------------------------------------------------
# The decision (pure)

POLICY = RepeatPolicy(min=3, max=10, target_ci=2.0)


def test_a_cell_converges_only_with_a_95_percent_interval_within_the_target_and_min_runs():
    stable = [10.0, 10.05, 9.98, 10.02, 9.99, 10.01]
    assert cell_state(stable[:5], POLICY).converged is False           # 5 runs: no 95% interval yet
    assert math.isinf(cell_state(stable[:5], POLICY).width_pct)
    state = cell_state(stable, POLICY)
    assert state.converged and state.n == 6 and 0 < state.width_pct <= 2.0
    assert cell_state(stable, RepeatPolicy(8, 10, 2.0)).converged is False   # min 8 not reached
    assert cell_state(stable, RepeatPolicy(3, 10, 0.1)).converged is False   # wider than 0.1%
    noisy = [10.0, 14.0, 7.0, 12.0, 8.0, 11.0]
    assert cell_state(noisy, POLICY).converged is False and cell_state(noisy, POLICY).width_pct > 2
    assert cell_state(stable, None).converged is False                  # a fixed `repeats: N` never stops early
    assert state.as_record() == {"n": 6, "width_pct": round(state.width_pct, 4), "converged": True}
    assert cell_state(stable[:2], POLICY).as_record()["width_pct"] is None


def test_failed_runs_do_not_count_and_cells_stop_independently():
    conv = Convergence(POLICY, [{"id": c, "repeat": r} for r in range(10) for c in ("a", "b")])
    noisy = [10.0, 14.0, 7.0, 12.0, 8.0, 11.0, 13.0]
    for r in range(7):
        for cell, value in (("a", 10.0 + 0.01 * (r % 3)), ("b", noisy[r])):
            if conv.wants(cell):
                rec = ok_record(cell, r, value)
                conv.observe(rec)
                assert rec["convergence"]["n"] == len([v for v in conv._values[cell].values()])
    assert not conv.wants("a") and conv.wants("b")                      # a stopped after 6, b goes on
    assert conv.state("a").n == 6 and conv.state("b").n == 7
    failed = ok_record("b", 7, 0, status="failed")
    conv.observe(failed)
    assert failed["convergence"] == {"n": 7, "width_pct": failed["convergence"]["width_pct"], "converged": False}
    assert run_value(failed) is None and run_value({"status": "ok", "receiver": {"bytes": 0}}) is None


def test_the_runs_still_expected_leave_out_converged_cells():
    """The progress total and the ETA count the runs still expected, not those up to max: a converged cell's
    remaining runs drop out, the others' all count (they may still run to max)."""
    conv = Convergence(POLICY, [{"id": c, "repeat": r} for r in range(10) for c in ("a", "b")])
    ahead = {"a": 10, "b": 10}
    assert conv.expected(ahead) == 20
    for r in range(6):
        for cell, value in (("a", 10.0 + 0.01 * (r % 3)), ("b", [10.0, 14.0, 7.0, 12.0, 8.0, 11.0][r])):
            conv.observe(ok_record(cell, r, value))
            ahead[cell] -= 1
    assert not conv.wants("a") and conv.wants("b")
    assert conv.expected(ahead) == 4                # b's 4 runs to max; a's 4 are not expected
    assert conv.expected({"a": 4, "b": 0}) == 0


def test_resume_state_comes_from_the_newest_ok_records():
    plan = [{"id": "a", "repeat": r} for r in range(8)]
    records = [ok_record("a", r, 10.0) for r in range(5)] + [ok_record("a", 5, 0, status="failed")]
    conv = Convergence(POLICY, plan, records)
    assert conv.state("a").n == 5 and conv.wants("a")
    conv = Convergence(POLICY, plan, records + [ok_record("a", 5, 10.0)])   # the re-run of repeat 5 won
    assert conv.state("a").n == 6 and not conv.wants("a")


def test_incomplete_cells_fixed_and_adaptive():
    plan = [{"id": c, "repeat": r} for r in range(8) for c in ("conv", "maxed", "short")]
    recs = [ok_record("conv", r, 10.0) for r in range(6)]                       # converged at 6 of 8
    recs += [ok_record("maxed", r, v) for r, v in enumerate([5, 15, 9, 20, 2, 11, 7, 30])]   # all 8 ok
    recs += [ok_record("short", r, v) for r, v in enumerate([5, 15, 9, 20, 2, 11, 7])]
    recs += [ok_record("short", 7, 0, status="failed")]
    latest = latest_runs(recs)
    assert incomplete_cells(plan, latest, POLICY) == {"short": 1}
    # the same records as a fixed `repeats: 8`: every cell short of 8 ok runs is incomplete
    assert incomplete_cells(plan, latest, None) == {"conv": 2, "short": 1}


# ---------------------------------------------------------------------------------------------
# The file, --set and the plan

def test_repeats_mapping_is_validated_at_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: t\nrepeats:\n  min: 0\n  max: 3\n  target_ci: 2\n  extra: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_experiment(bad)
    assert exc.value.problems == [
        f"{bad}:3:8: repeats.min: expected an integer between 1 and 10000, got 0",
        f"{bad}:5:14: repeats.target_ci: expected a percentage of the median such as `2%`, got `2`",
        f"{bad}:6:3: repeats.extra: unknown key `extra` (expected the repeat policy: min, max, target_ci)",
    ]
    bad.write_text("name: t\nrepeats: {min: 5, max: 3, target_ci: 0%}\n")
    with pytest.raises(ConfigError) as exc:
        load_experiment(bad)
    assert exc.value.problems == [f"{bad}:2:24: repeats.max: 3 is below repeats.min (5)",
                                  f"{bad}:2:38: repeats.target_ci: expected a percentage above 0%, got 0%"]
    bad.write_text("name: t\nrepeats: {max: 30}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2:10: repeats: missing `min`, `target_ci`"):
        load_experiment(bad)
    bad.write_text("name: t\nrepeats: {min: 3, max: 10001, target_ci: 2%}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2:\d+: repeats.max: expected an integer between 1 and 10000"):
        load_experiment(bad)


def test_set_changes_the_policy_or_makes_it_a_count(tmp_path):
    path = write_exp(tmp_path / "t.yaml", "{min: 3, max: 30, target_ci: 2%}")
    exp = load_experiment(path)
    assert exp.repeat_policy == RepeatPolicy(3, 30, 2.0) and exp.repeats == 30
    exp = load_experiment(path, ["repeats.max=12", "repeats.target_ci=5%"])
    assert exp.repeat_policy == RepeatPolicy(3, 12, 5.0) and exp.repeats == 12
    exp = load_experiment(path, ["repeats=5"])
    assert exp.repeat_policy is None and exp.repeats == 5
    exp = load_experiment(write_exp(tmp_path / "n.yaml", "4"), ["repeats={min: 2, max: 9, target_ci: 1.5%}"])
    assert exp.repeat_policy == RepeatPolicy(2, 9, 1.5) and exp.repeats == 9
    with pytest.raises(ConfigError, match=r"--set repeats.target_ci=5: repeats.target_ci: expected a percentage"):
        load_experiment(path, ["repeats.target_ci=5"])
    with pytest.raises(ConfigError, match=r"--set repeats.max=2: repeats.max: 2 is below repeats.min \(3\)"):
        load_experiment(path, ["repeats.max=2"])
    with pytest.raises(ConfigError, match=r"`repeats` is `4`, not a mapping: set it whole"):
        load_experiment(tmp_path / "n.yaml", ["repeats.max=9"])


def test_plan_lists_runs_up_to_max_and_estimates_a_range(tmp_path):
    plan = expand(load_experiment(write_exp(tmp_path / "t.yaml", "{min: 3, max: 10, target_ci: 2%}")))
    assert len(plan.runs) == 20 and plan.fewest_repeats() == 6
    assert [r.repeat for r in plan.runs[:4]] == [0, 0, 1, 1]           # interleaved: round r of every cell
    est = estimate(plan, overhead=1.0)
    assert (est.runs_min, est.runs) == (12, 20) and est.is_range
    assert est.total_min_s < est.total_s
    assert "estimated duration" in est.explain() and "12..20 runs" in est.explain()
    runs = runs_json(plan)
    assert [bool(r.get("optional")) for r in runs] == [r["repeat"] >= 6 for r in runs]
    text = render(plan)
    assert "2 cells x 6..10 repeats = 12..20 runs, order interleave" in text
    assert "within ±2% of the median, at least 3 and at most 10 times (a 95% interval needs 6 ok runs: no " \
           "cell stops before 6)" in text
    # min above 6 is the floor itself; max below 6 cannot converge, and the plan says so
    plan = expand(load_experiment(tmp_path / "t.yaml", ["repeats={min: 8, max: 10, target_ci: 2%}"]))
    assert plan.fewest_repeats() == 8 and "2 cells x 8..10 repeats = 16..20 runs" in render(plan)
    plan = expand(load_experiment(tmp_path / "t.yaml", ["repeats.max=4"]))
    assert plan.fewest_repeats() == 4 and "2 cells x 4 repeats = 8 runs" in render(plan)
    assert any("repeats.max 4 is below 6" in w and "no cell can converge" in w for w in plan.warnings)
    # an integer keeps its meaning: exactly N, no range, no optional runs
    plan = expand(load_experiment(tmp_path / "t.yaml", ["repeats=3"]))
    assert not estimate(plan).is_range and all("optional" not in r for r in runs_json(plan))
    assert "2 cells x 3 repeats = 6 runs" in render(plan)


# ---------------------------------------------------------------------------------------------
# Real sweeps

@pytest.fixture(scope="module")
def sweeps(tmp_path_factory):
    """Two real sweeps of the same two cells: one whose cells converge (LOOSE), one whose do not (TIGHT)."""
    tag = uuid.uuid4().hex
    base = tmp_path_factory.mktemp("repeats")
    out = {}
    for name, repeats in (("loose", LOOSE), ("tight", TIGHT)):
        res = zcorch_run(tag, "run", write_exp(base / f"{name}.yaml", repeats), "-o", base / name)
        out[name] = (base / name, res)
    assert wait_no_workers(tag, 2.0) == []
    return out


@pytest.mark.slow
def test_converging_cells_stop_at_six_interleaved(sweeps):
    out, res = sweeps["loose"]
    assert res.returncode == 0, res.stderr
    runs = read_jsonl(str(out / "runs.jsonl"))
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan) == 20                                              # the plan lists up to max
    cells = list(dict.fromkeys(p["id"] for p in plan))
    assert [(r["cell"], r["repeat"]) for r in runs] == [(c, k) for k in range(6) for c in cells]
    assert all(r["status"] == "ok" for r in runs)
    for cell in cells:
        states = [r["convergence"] for r in runs if r["cell"] == cell]
        assert [s["n"] for s in states] == [1, 2, 3, 4, 5, 6]
        assert [s["converged"] for s in states] == [False] * 5 + [True]
        assert [s["width_pct"] is None for s in states] == [True] * 5 + [False]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["repeats"] == {"min": 3, "max": 10, "target_ci": 100000.0}
    assert {c: s["converged"] for c, s in manifest["convergence"].items()} == {c: True for c in cells}
    rows = {line.split()[0]: line for line in res.stdout.splitlines() if line.strip()}
    assert rows["cell"].rstrip().endswith("converged")
    assert all(" yes (±" in rows[c] for c in cells) and "0 of 2 cells did not converge" in res.stdout
    # the progress lines count to the runs expected: the max (20) until a cell converges, then fewer
    progress = [re.match(r"^\[(\d+)/(\d+)\] .* ETA (\S+) ", ln) for ln in res.stderr.splitlines()]
    progress = [m.groups() for m in progress if m]
    assert [(int(d), int(t)) for d, t, _ in progress] == [(k, 20) for k in range(1, 11)] + [(11, 16), (12, 12)]
    assert progress[-1][2] == "0m00s"
    comp = completeness(out)                                            # 6 of 10: not missing runs
    assert comp.complete and comp.ok == 12 and comp.planned == 20 and comp.describe("base") == ""
    s = zcorch.summarize(zcorch.load(out))
    assert list(s["converged"]) == [True, True] and list(s["n"]) == [6, 6]


@pytest.mark.slow
def test_cells_that_do_not_converge_run_to_max_and_say_so_everywhere(sweeps, tmp_path):
    out, res = sweeps["tight"]
    assert res.returncode == 0, res.stderr
    runs = read_jsonl(str(out / "runs.jsonl"))
    assert len(runs) == 16 and all(r["status"] == "ok" for r in runs)
    assert all(r["convergence"]["converged"] is False for r in runs)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["convergence"]) == 2
    for state in manifest["convergence"].values():
        assert state["converged"] is False and state["n"] == 8 and state["width_pct"] > 0.001
    rows = [line for line in res.stdout.splitlines() if line.split() and line.split()[0] in manifest["convergence"]]
    assert len(rows) == 2 and all(" no (±" in line for line in rows)
    assert "2 of 2 cells did not converge" in res.stdout
    s = zcorch.summarize(zcorch.load(out))
    assert list(s["converged"]) == [False, False] and (s["width_pct"] > 0.001).all()
    html = build_report(out)
    assert "converged (95% CI ±)" in html and html.count("<td>no (±") == 2
    assert completeness(out).complete                                   # every cell has its max ok runs
    # A set without `repeats: {...}` has no such columns
    assert "converged" not in zcorch.summarize(zcorch.load(sweeps["loose"][0]).drop(columns=["convergence"]))

    # The gate: a cell neither converged nor at max is missing runs, a converged cell never is
    short = tmp_path / "short"
    shutil.copytree(out, short)
    kept = runs[:-1]                                                     # the last cell's 8th run is gone
    (short / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    if (short / "runs.parquet").exists():
        os.remove(short / "runs.parquet")                                # the load cache of the full set
    comp = completeness(short)
    assert not comp.complete and comp.cells_short == (runs[-1]["cell"],)
    assert "1 of 2 cells neither converged nor with all 8 repeats ok (15 runs ok)" in comp.describe("candidate")
    res = zcorch_cli("compare", out, short)
    assert res.returncode == 3 and "1 of 2 cells neither converged" in res.stdout.splitlines()[-1]


def test_compare_takes_cells_with_different_numbers_of_runs(sweeps):
    loose, tight = sweeps["loose"][0], sweeps["tight"][0]
    table = compare_frames(zcorch.load(loose), zcorch.load(tight))
    assert list(table["n_base"]) == [6, 6] and list(table["n_cand"]) == [8, 8]
    assert table["p_value"].notna().all()
    res = zcorch_cli("compare", loose, tight)
    last = res.stdout.splitlines()[-1]
    # complete on both sides: never short of runs; a 3 only for cells too noisy to see the threshold, said so
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    assert "planned runs ok" not in last and "status" not in last and "only in" not in last, last
    if res.returncode == 3:
        assert last.startswith("zcorch compare: cannot tell: ") and "runs a side" in last, last


@pytest.mark.slow
def test_resume_in_the_middle_continues_only_unconverged_cells(tmp_path):
    tag = uuid.uuid4().hex
    # Runs long enough to be stalled (the kill must land mid-sweep); LOOSE: each cell stops at 6 ok runs.
    exp = write_exp(tmp_path / "r.yaml", LOOSE, name="r", bytes="256MiB")
    out = tmp_path / "rs"
    p = start_zcorch(tag, "run", exp, "-o", out)
    try:
        wait_records(out / "runs.jsonl", 11)                             # the first cell has its 6th
        rx, _ = stall_a_run(lambda: tagged_worker_pids(tag))
        p.kill()
        p.wait()
        try:  # the worker server, seeing its controller gone, SIGKILLs its runs (this one too, stopped or not)
            os.kill(rx, signal.SIGCONT)
        except ProcessLookupError:
            pass
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert wait_no_workers(tag, 5.0) == []
    before = read_jsonl(str(out / "runs.jsonl"))
    assert 11 <= len(before) < 12, "the kill landed after the sweep ended"
    done_before = {c for c, st in {r["cell"]: r["convergence"] for r in before}.items() if st["converged"]}
    assert len(done_before) == 1

    res = zcorch_run(tag, "run", "--resume", out)
    assert res.returncode == 0, res.stderr
    after = read_jsonl(str(out / "runs.jsonl"))
    assert after[:len(before)] == before                                 # nothing rewritten
    added = after[len(before):]
    assert added and not {r["cell"] for r in added} & done_before        # the converged cell got no run
    ok = [(r["cell"], r["repeat"]) for r in after if r["status"] == "ok"]
    assert len(ok) == len(set(ok)) == 12                                 # no run repeated, each cell 6 ok
    assert all(state["converged"] for state in json.loads((out / "manifest.json").read_text())["convergence"].values())
    assert completeness(out).complete
    assert wait_no_workers(tag, 2.0) == []
