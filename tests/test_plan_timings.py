"""`zcorch plan --timings DIR`: the estimate from what an earlier result set took (zcorch.results.timings)."""
import json
from datetime import datetime, timedelta, timezone

import pytest

from zcorch.errors import ConfigError
from zcorch.plan import Timings, estimate, load_plan, switch_keys
from zcorch.results.timings import learn

from fixtures_analysis import record_sweep, zcorch_cli

T0 = datetime(2026, 11, 28, 20, 0, tzinfo=timezone.utc)


def test_switch_keys_make_a_filesystem_once_release_it_after_its_last_run_and_switch_networks():
    runs = [{"filesystem": "a"}, {"filesystem": "b"}, {"filesystem": "a"}, {"filesystem": "b"},
            {"filesystem": "c", "network": "n1"}, {"filesystem": "c", "network": "n2"}]
    assert switch_keys(runs) == ["", "filesystem=b", "", "release filesystem=a", "filesystem=c", "network=n2"]
    assert switch_keys([{}, {}, {"network": "x"}, {"network": "x"}, {}]) == ["", "", "network=x", "", "network=None"]


def _fake_set(path, runs, created_to_first=5.0, after=1.0):
    """A result set whose records say when each run started and how long it took (what a sweep writes)."""
    path.mkdir()
    t, lines = T0 + timedelta(seconds=created_to_first), []
    for params, wall, gap in runs:
        lines.append(json.dumps({"cell": "c", "repeat": 0, "status": "ok", "started": t.isoformat(), "wall_s": wall,
                                 "params": {"bytes": 1 << 30, **params}, "receiver": {"bytes": 1 << 30}}))
        t += timedelta(seconds=wall + gap)
    (path / "runs.jsonl").write_text("\n".join(lines) + "\n")
    last_end = t - timedelta(seconds=runs[-1][2])
    (path / "manifest.json").write_text(json.dumps({
        "format": "zcorch-results", "format_version": 1, "name": "x", "status": "complete",
        "created": T0.isoformat(), "finished": (last_end + timedelta(seconds=after)).isoformat()}))
    return path


def test_learn_reads_the_rate_the_time_between_runs_and_each_configurations_set_up(tmp_path):
    runs = [({"filesystem": "a"}, 2.0, 0.5), ({"filesystem": "b"}, 2.0, 0.5), ({"filesystem": "a"}, 2.0, 0.5),
            ({"filesystem": "b"}, 2.0, 0.5)]
    # gaps before runs 1..3: b made (0.5 + 3 s), a again (0.5), a released (0.5 + 1 s)
    runs[0] = (runs[0][0], 2.0, 3.5)
    runs[2] = (runs[2][0], 2.0, 1.5)
    t = learn(str(_fake_set(tmp_path / "rs", runs)))
    assert t.rate == pytest.approx((1 << 30) / 2.0) and t.per_run == pytest.approx(0.5)
    assert t.setup == pytest.approx({"filesystem=b": 3.0, "release filesystem=a": 1.0})
    assert t.before == pytest.approx(5.0) and t.after == pytest.approx(1.0) and t.first == ("filesystem=a",)
    assert t.cost("filesystem=z") == 3.0          # an unseen filesystem costs what the seen ones did
    assert t.cost("network=n") == 0.0             # no network was switched: nothing learned, nothing added


def test_an_estimate_from_timings_adds_what_the_plan_will_make_switch_and_release(tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\nparams: {bytes: 1GiB, timeout: 60s}\nmatrix: {send_mode: [write, vmsplice]}\n"
                   "repeats: 3\nbaselines: {iperf3: false, dd: false}\n")
    plan = load_plan(str(exp))
    t = Timings(source="x", rate=float(1 << 30), per_run=0.5, setup={}, before=4.0, after=1.0)
    est = estimate(plan, timings=t)
    assert est.total_s == pytest.approx(6 * 1.0 + 5 * 0.5 + 4.0 + 1.0)
    assert "from what x took" in est.explain()
    assert estimate(plan).total_s != est.total_s   # the assumptions are not what was learned


def test_a_real_sweeps_timings_estimate_its_own_plan_and_the_cli_says_where_from(tmp_path):
    text = ("name: t\nparams: {bytes: 64MiB, timeout: 60s, source: mem}\nmatrix: {send_mode: [write, vmsplice]}\n"
            "repeats: 3\nbaselines: {iperf3: false, dd: false}\n")
    rs = record_sweep(tmp_path, "t", text)
    m = json.loads((rs / "manifest.json").read_text())
    span = (datetime.fromisoformat(m["finished"]) - datetime.fromisoformat(m["created"])).total_seconds()
    est = estimate(load_plan(str(tmp_path / "t.yaml")), timings=learn(str(rs)))
    # medians stand for every run: the sweep's own span, not to the tick (a shared machine's runs vary)
    assert 0.5 * span <= est.total_s <= 2.0 * span, (est, span)
    r = zcorch_cli("plan", tmp_path / "t.yaml", "--timings", rs)
    assert r.returncode == 0 and f"from what {rs} took" in r.stdout, r.stdout + r.stderr


def test_timings_from_a_set_with_too_few_runs_or_no_set_is_a_clear_error(tmp_path):
    _fake_set(tmp_path / "one", [({}, 1.0, 0.1)])
    with pytest.raises(ConfigError, match="fewer than 2 runs"):
        learn(str(tmp_path / "one"))
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\nparams: {bytes: 1MiB}\nmatrix: {send_mode: [write]}\n")
    r = zcorch_cli("plan", exp, "--timings", tmp_path / "nothing")
    assert r.returncode == 2 and "not a zcorch result set" in r.stderr, r.stdout + r.stderr
