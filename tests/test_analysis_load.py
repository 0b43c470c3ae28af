"""zcorch.load / load_baselines / load_meta / summarize on the small real result set."""
import json
import os

import numpy as np
import pandas as pd
import pytest

import zcorch
from zcorch.analysis import cache, frames
from zcorch.errors import ResultsError

from fixtures_analysis import copy_result_set, raw_runs, zcorch_cli


def test_one_row_per_run_with_params_metrics_and_derived_columns(small_set):
    df = zcorch.load(small_set)
    records = raw_runs(small_set)
    assert len(df) == len(records) == 39
    assert list(df.columns[:4]) == ["sweep", "cell", "repeat", "status"]
    assert set(df["sweep"]) == {"quickstart-small"}
    for col in ("send_mode", "recv_mode", "bytes", "buffer", "window", "source", "sink",
                "send_bytes", "send_wall_ns", "send_utime_us", "recv_stime_us", "recv_tcp_rtt_us",
                "gbit_s", "mb_s", "send_cpu_s_per_gib", "recv_cpu_s_per_gib", "send_sys_share"):
        assert col in df, col
    assert "send_mode" in df and "send_params" not in df and "send_side" not in df
    assert set(df["buffer"]) == {64 * 1024, 256 * 1024}  # sizes in bytes
    assert set(df["bytes"]) == {64 * 1024 * 1024}
    assert str(df["started"].dtype).startswith("datetime64")
    # derived columns recomputed from the records as written
    by_key = {(r["cell"], r["repeat"]): r for r in records}
    for _, row in df[df["status"] == "ok"].iterrows():
        rec = by_key[(row["cell"], row["repeat"])]
        recv, send = rec["receiver"], rec["sender"]
        assert row["mb_s"] == pytest.approx(recv["bytes"] / (recv["wall_ns"] / 1e9) / 1e6)
        assert row["gbit_s"] == pytest.approx(recv["bytes"] * 8 / (recv["wall_ns"] / 1e9) / 1e9)
        assert row["send_cpu_s_per_gib"] == pytest.approx(
            (send["utime_us"] + send["stime_us"]) / 1e6 / (send["bytes"] / 2 ** 30))
        assert row["recv_cpu_s_per_gib"] == pytest.approx(
            (recv["utime_us"] + recv["stime_us"]) / 1e6 / (recv["bytes"] / 2 ** 30))
        assert row["send_sys_share"] == pytest.approx(send["stime_us"] / (send["utime_us"] + send["stime_us"]))


def test_failed_runs_keep_their_reason_and_have_no_throughput(small_set):
    df = zcorch.load(small_set)
    failed = df[df["status"] != "ok"]
    assert len(failed) == 3 and set(failed["send_cpu"]) == {4095}
    assert failed["reason"].str.contains("out of range").all()
    assert failed["gbit_s"].isna().all()


def test_cache_is_used_and_invalidated_by_a_change_of_runs_jsonl(small_set, monkeypatch):
    cold = zcorch.load(small_set, cache=False)
    first = zcorch.load(small_set)
    assert (small_set / cache.CACHE_NAME).exists()
    pd.testing.assert_frame_equal(first, cold)

    calls = []
    real_parse = frames.parse_runs
    monkeypatch.setattr(frames, "parse_runs", lambda path: calls.append(path) or real_parse(path))
    warm = zcorch.load(small_set)
    assert calls == []  # served from the cache
    pd.testing.assert_frame_equal(warm, cold)

    line = (small_set / "runs.jsonl").read_bytes().splitlines()[0]
    with open(small_set / "runs.jsonl", "ab") as f:  # a torn final line: size changes
        f.write(line[: len(line) // 2])
    torn = zcorch.load(small_set)
    assert len(calls) == 1  # re-parsed
    pd.testing.assert_frame_equal(torn, cold)  # and the torn line skipped


def test_a_foreign_or_stale_cache_is_never_trusted(small_set):
    cold = zcorch.load(small_set, cache=False)
    (small_set / cache.CACHE_NAME).write_bytes(b"not a numpy file")
    pd.testing.assert_frame_equal(zcorch.load(small_set), cold)
    os.utime(small_set / "runs.jsonl", ns=(1, 1))  # mtime changed: the cache written above is stale
    pd.testing.assert_frame_equal(zcorch.load(small_set), cold)


@pytest.mark.slow
def test_newest_record_of_a_resumed_run_wins(small_set):
    before = zcorch.load(small_set, cache=False)
    res = zcorch_cli("run", "--resume", small_set)
    assert res.returncode in (0, 1), res.stderr
    records = raw_runs(small_set)
    assert len(records) == 42  # the 3 failed runs were run again and appended
    after = zcorch.load(small_set)
    assert len(after) == 39
    failed_cell = before.loc[before["status"] != "ok", "cell"].iloc[0]
    newest = {r["repeat"]: r["started"] for r in records if r["cell"] == failed_cell}  # last one wins
    got = after[after["cell"] == failed_cell].set_index("repeat")["started"]
    for repeat, started in newest.items():
        assert got[repeat] == pd.Timestamp(started)
        assert got[repeat] > before[(before["cell"] == failed_cell) & (before["repeat"] == repeat)]["started"].iloc[0]


@pytest.mark.parametrize("version", [0, 2, "1"])
def test_unsupported_format_versions_fail_naming_the_version(small_set, version):
    manifest = json.loads((small_set / "manifest.json").read_text())
    manifest["format_version"] = version
    (small_set / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ResultsError, match=f"format version {version!r}"):
        zcorch.load(small_set)
    res = zcorch_cli("report", small_set)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"format version {version!r}" in res.stderr


def test_not_a_result_set(tmp_path):
    with pytest.raises(ResultsError, match="not found"):
        zcorch.load(tmp_path / "nope")
    with pytest.raises(ResultsError, match="no manifest.json"):
        zcorch.load(tmp_path)


def test_corruption_in_the_middle_is_an_error_naming_the_line(small_set):
    lines = (small_set / "runs.jsonl").read_bytes().splitlines(keepends=True)
    lines[5] = lines[5][:40] + b"\n"
    (small_set / "runs.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(ResultsError, match=r"runs.jsonl:6"):
        zcorch.load(small_set)


def test_several_result_sets_concatenate_with_a_sweep_column(small_set, tmp_path):
    other = copy_result_set(small_set, tmp_path / "nightly-2")
    df = zcorch.load([small_set, other])
    assert len(df) == 78
    assert df.groupby("sweep").size().to_dict() == {"quickstart-small": 39, "nightly-2": 39}
    same_name = copy_result_set(small_set, tmp_path / "x" / "quickstart-small")
    df = zcorch.load([small_set, same_name])
    assert set(df["sweep"]) == {str(small_set), str(same_name)}
    s = zcorch.summarize(df)
    assert list(s.columns[:2]) == ["sweep", "cell"] and len(s) == 26


def test_load_baselines(small_set):
    b = zcorch.load_baselines(small_set)
    raw = [json.loads(line) for line in (small_set / "baselines.jsonl").read_text().splitlines()]
    assert len(b) == len(raw) and set(b["kind"]) == {"iperf3", "dd_write", "dd_read"}
    for (_, row), rec in zip(b.iterrows(), raw):
        assert row["status"] == rec["status"] == "ok"
        if rec["kind"] == "iperf3":
            assert row["gbit_s"] == pytest.approx(rec["result"]["bits_per_second"] / 1e9)
            assert row["key_zerocopy"] == rec["key"]["zerocopy"]
        else:
            assert row["mb_s"] == pytest.approx(rec["result"]["MB_per_s"])


def test_load_meta(small_set):
    meta = zcorch.load_meta(small_set)
    assert set(meta["role"]) >= {"controller", "sender", "receiver"}
    receiver = meta[meta["role"] == "receiver"].iloc[0]
    # What the file recorded, flattened: never a fact of the machine that runs the test.
    recorded = json.loads((small_set / "meta.json").read_text())["hosts"]["receiver"]
    assert receiver["kernel.release"] == recorded["kernel"]["release"]
    assert receiver["sweep"] == "quickstart-small"


def test_summarize_real_runs(small_set):
    df = zcorch.load(small_set)
    s = zcorch.summarize(df)
    assert len(s) == df["cell"].nunique() == 13
    assert (s["n"] + s["n_failed"]).tolist() == [3] * 13
    broken = s[s["send_cpu"] == 4095].iloc[0]
    assert (broken["n"], broken["n_failed"]) == (0, 3) and np.isnan(broken["gbit_s_median"])
    ok = s[s["n"] == 3]
    assert (ok["gbit_s_min"] <= ok["gbit_s_median"]).all() and (ok["gbit_s_median"] <= ok["gbit_s_max"]).all()
    assert (ok["gbit_s_ci_low"] <= ok["gbit_s_median"]).all() and (ok["gbit_s_median"] <= ok["gbit_s_ci_high"]).all()
    by_mode = zcorch.summarize(df, by=["send_mode", "recv_mode"])
    assert len(by_mode) == 6 and by_mode["n"].sum() == 36
