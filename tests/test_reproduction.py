"""The verdict engine (zcorch.analysis.reproduction) on synthetic frames: holds / does not hold /
inconclusive, normalisation to each setup's baseline, units."""
from __future__ import annotations

import os
import textwrap

import numpy as np
import pandas as pd
import pytest

from zcorch.analysis import reproduction as rp
from zcorch.config.experiment import reference_of
from zcorch.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REF = """\
reference:
  source: {title: T, author: A, date: "2006-11-16"}
  bytes: 1GiB
  level: 75%          # three runs decide here (the shipped studies keep the default, 90%: five runs)
  baselines:
    iperf3: {value: 8 Gbit/s, command: iperf -l 64K}
    dd_write: {value: 400-500 MB/s}
  figures:
    - {label: A, match: {send_mode: write}, metric: mb_s, value: 500 MB/s}
    - {label: S, match: {send_mode: splice}, metric: gbit_s, value: 6 Gbit/s}
    - {label: W, match: {send_mode: write}, metric: send_stime_us, value: 25.497 s}
    - {label: D, match: {send_mode: write}, metric: mb_s, value: 300 MB/s, baseline: dd_write}
    - {label: M, match: {send_mode: mmap}, metric: mb_s, value: 1 MB/s}
  claims:
    - {says: splice beats write, metric: mb_s, a: {send_mode: splice}, b: {send_mode: write}, holds_if: a > b}
    - {says: write beats splice, metric: mb_s, a: {send_mode: write}, b: {send_mode: splice}, holds_if: a > b}
    - {says: splice at least twice write, metric: mb_s, a: {send_mode: splice}, b: {send_mode: write},
       holds_if: a >= 2 * b}
    - {says: splice stime at most half, metric: send_stime_us, a: {send_mode: splice}, b: {send_mode: write},
       holds_if: a <= 0.5 * b}
    - {says: mmap slower, metric: mb_s, a: {send_mode: mmap}, b: {send_mode: write}, holds_if: a < b}
    - {says: vmsplice slower, metric: mb_s, a: {send_mode: vmsplice}, b: {send_mode: write}, holds_if: a < b}
"""


def runs(cell, mode, mb_s, stime_s, status="ok"):
    return [{"cell": cell, "repeat": i, "status": status, "send_mode": mode, "buffer": 65536.0, "window": np.nan,
             "mb_s": v, "gbit_s": v * 8 / 1000, "send_stime_us": s * 1e6, "bytes": 512 << 20} for i, (v, s) in enumerate(zip(mb_s, stime_s))]


@pytest.fixture
def frame():
    rows = (runs("w", "write", [400, 410, 420], [24, 25, 26])
            + runs("s", "splice", [1000, 1010, 1020], [9, 10, 11])
            + runs("m", "mmap", [405, 1, 500], [1, 1, 1])           # wide interval: overlaps write
            + runs("v", "vmsplice", [300], [1]))                     # one run: no interval
    return pd.DataFrame(rows)


@pytest.fixture
def baselines():
    return pd.DataFrame([
        {"kind": "iperf3", "status": "ok", "gbit_s": 10.0, "key_buffer": 65536, "key_window": None, "key_zerocopy": False},
        {"kind": "iperf3", "status": "ok", "gbit_s": 99.0, "key_buffer": 65536, "key_window": None, "key_zerocopy": True},
        {"kind": "iperf3", "status": "ok", "gbit_s": 50.0, "key_buffer": 8192, "key_window": None, "key_zerocopy": False},
        {"kind": "dd_write", "status": "ok", "gbit_s": 4.0},
        {"kind": "dd_write", "status": "failed", "gbit_s": 400.0},
    ])


@pytest.fixture
def ref():
    return reference_of(REF, "exp.yaml")


def test_verdicts_from_confidence_intervals(frame, ref):
    rows = {r.claim.says: r for r in rp.claims(frame, ref)}
    assert rows["splice beats write"].verdict == rp.HOLDS
    assert rows["write beats splice"].verdict == rp.FAILS
    assert rows["splice at least twice write"].verdict == rp.HOLDS          # 1000 > 2 × 420
    assert rows["splice stime at most half"].verdict == rp.HOLDS            # 11 s ≤ 0.5 × 24 s
    assert rows["mmap slower"].verdict == rp.INCONCLUSIVE
    assert "intervals overlap" in rows["mmap slower"].evidence
    assert rows["vmsplice slower"].verdict == rp.INCONCLUSIVE
    assert "one ok run: no interval" in rows["vmsplice slower"].evidence
    # the numbers are on the verdict's line, labelled as ours
    ev = rows["splice beats write"].evidence
    assert ev.startswith("measured (this run): a 1.01e+03 MB/s") or ev.startswith("measured (this run): a 1010 MB/s")
    assert "a/b = 2.46" in ev and "n=3" in ev
    assert rows["splice beats write"].published == "published: a 750 MB/s vs b 500 MB/s; a/b = 1.50"


def test_a_doubled_factor_can_fail(frame, ref):
    frame.loc[frame["cell"] == "s", "mb_s"] = [700, 710, 720]
    rows = {r.claim.says: r for r in rp.claims(frame, ref)}
    assert rows["splice at least twice write"].verdict == rp.FAILS         # 720 < 2 × 400
    assert rows["splice beats write"].verdict == rp.HOLDS


def test_missing_cells_and_failed_runs_are_inconclusive(frame, ref):
    frame.loc[frame["cell"] == "w", "status"] = "failed"
    rows = {r.claim.says: r for r in rp.claims(frame[frame["cell"] != "s"], ref)}
    assert rows["splice beats write"].verdict == rp.INCONCLUSIVE
    assert "a is not in this run" in rows["splice beats write"].evidence
    assert "all 3 runs failed" in rows["mmap slower"].evidence


def test_figures_are_normalised_to_their_own_baselines(frame, baselines, ref):
    a, s, w, d, m = rp.figures(frame, baselines, ref)
    # published: 500 MB/s = 4 Gbit/s over the study's iperf 8 Gbit/s
    assert a.published == (500, 500) and a.published_norm == pytest.approx((0.5, 0.5))
    # measured: median 410 MB/s = 3.28 Gbit/s over our plain iperf3 of the same buffer (10, not -Z's 99)
    assert a.measured.median == 410 and a.measured_baseline == 10.0
    assert a.measured_norm == pytest.approx(0.328)
    assert a.ratio == pytest.approx(0.82)
    assert s.unit == "Gbit/s" and s.measured.median == pytest.approx(8.08)
    # a time figure: converted to the metric's unit (µs), not normalised; a total, compared per byte
    assert w.published == (25497000.0, 25497000.0) and w.published_norm is None
    assert w.per_byte and w.ratio == pytest.approx((25 / (512 << 20)) / (25.497 / (1 << 30)))
    assert rp.figure_table([w])[0][7] == "1.96 per byte"
    frame["bytes"] = 1 << 30     # the study's amount: compared as it is
    w_same = rp.figures(frame, baselines, ref)[2]
    assert not w_same.per_byte and w_same.ratio == pytest.approx(25 / 25.497)
    # dd write range 400–500 MB/s: the normalised figure is a range too; our dd: the ok record only
    assert d.published_norm == pytest.approx((300 / 500, 300 / 400))
    assert d.measured_baseline == 4.0 and d.measured_norm == pytest.approx(3.28 / 4)
    table = rp.figure_table([a, d])
    assert table[0][3] == "500 MB/s" and table[0][4] == "0.50 × iperf3"
    assert table[0][5].startswith("410 MB/s (75% CI")  # three runs: min–max, at the 75% it has
    assert table[0][6] == "0.33 × iperf3 (iperf3 10 Gbit/s)"
    assert table[1][4] == "0.60–0.75 × dd write"


def test_markdown_labels_published_and_measured(frame, baselines, ref):
    text = rp.markdown(ref, frame, baselines, "t")
    assert text.startswith("## Reproduction: t")
    assert "| published as | cell | metric | published (study) |" in text
    assert "measured (this run)" in text
    assert "### Claims (3 holds, 1 does not hold, 2 inconclusive)" in text
    # the median of the plain tests, with how many and their range
    assert "| iperf3 | 8 Gbit/s | iperf -l 64K | 30 Gbit/s = 3750 MB/s (median of 2: 10–50 Gbit/s) |" in text


def test_show_picks_readable_units():
    assert rp.show(25497000.0, "µs") == "25.5 s"
    assert rp.show(512.0, "µs") == "512 µs"
    assert rp.show(5120077, "count") == "5120077"
    assert rp.show(float("nan"), "MB/s") == "–"
    assert rp.show(72690317.0, "ns") == "72.7 ms"
    assert rp.show_range(585.0, 13917.0, "µs") == "585 µs–13.9 ms"
    assert rp.show_range(1480.0, 7590.0, "µs") == "1.48–7.59 ms"


def test_reference_of_reports_problems_at_file_line():
    assert reference_of("name: x\n") is None
    with pytest.raises(ConfigError, match=r"exp.yaml:3:\d+: reference.figures\[0\]: missing `match:`"):
        reference_of(textwrap.dedent("""\
            reference:
              source: {title: T}
              figures: [{metric: mb_s, value: 1 MB/s}]
            """), "exp.yaml")


def test_a_zero_denominator_reads_as_infinity(ref):
    rows = runs("w", "write", [400, 410, 420], [0, 0, 0]) + runs("s", "splice", [1000, 1010, 1020], [9, 10, 11])
    claim = {r.claim.says: r for r in rp.claims(pd.DataFrame(rows), ref)}["splice stime at most half"]
    assert claim.verdict == rp.FAILS and "a/b = ∞" in claim.evidence


def test_a_total_of_a_cell_the_run_left_out_is_not_run_not_bytes_missing(frame, baselines):
    # `--set send_mode=vmsplice` on the zero-copy study: its write figures give the study's bytes
    # (reference.bytes), so the ratio column says the cell was not run, not that the bytes are missing
    text = open(f"{REPO}/experiments/zero-copy-output-2011.yaml").read()
    ref = reference_of(text, "zero-copy-output-2011.yaml")
    only_vmsplice = frame[frame["cell"] == "v"].assign(bytes=65536000000)
    rows = {r[0]: r for r in rp.figure_table(rp.figures(only_vmsplice, baselines, ref))}
    left_out = rows["xmit send(): sys"]
    assert left_out[5] == "not in this run" and left_out[7] == "– (not run in this set)"
    assert "bytes are not given" not in " ".join(" ".join(r) for r in rows.values())
    ran = rows["xmit vmsplice() -> splice(): sys"]
    assert ran[7] == "0.15"             # 1 s of the study's 6.864 s, the same bytes: compared as they are
    # a study that gives no bytes, for a cell that did run: then (and only then) the bytes are missing
    no_bytes = reference_of(text.replace("  bytes: 65536000000        # per transfer", "  # (no bytes)"), "z.yaml")
    ran = {r[0]: r for r in rp.figure_table(rp.figures(frame, baselines, no_bytes))}
    assert ran["xmit vmsplice() -> splice(): sys"][7] == "– (a total: the study's bytes are not given)"


def test_a_claim_on_two_runs_is_inconclusive_needing_five(frame):
    # the shipped studies' default: a 90% interval, which the median of fewer than five runs cannot have
    study = reference_of(REF.replace("  level: 75%", "  # default level"), "exp.yaml")
    assert study.level == 0.90
    rows = runs("w", "write", [400, 410], [24, 25]) + runs("s", "splice", [1000, 1010], [9, 10])
    first = rp.claims(pd.DataFrame(rows), study)[0]
    assert first.verdict == rp.INCONCLUSIVE and first.verdict_text == "inconclusive: needs 5 runs"
    assert "needs 5 runs (a 90% interval; a has 2 ok)" in first.evidence
    # the same separation on five runs a side decides
    rows = (runs("w", "write", [400, 410, 420, 405, 415], [24] * 5)
            + runs("s", "splice", [1000, 1010, 1020, 1005, 1015], [9] * 5))
    assert rp.claims(pd.DataFrame(rows), study)[0].verdict == rp.HOLDS
    # a study may ask for more: 95% needs six
    strict = reference_of(REF.replace("  level: 75%", "  level: 95%"), "exp.yaml")
    assert rp.claims(pd.DataFrame(rows), strict)[0].verdict_text == "inconclusive: needs 6 runs"


@pytest.mark.parametrize("level, words", [("50", "between 50% and 99.9%"), ("100%", "between 50% and 99.9%"),
                                          ("most", "not a confidence level")])
def test_a_bad_level_names_file_line_and_key(level, words):
    with pytest.raises(ConfigError) as info:
        reference_of(REF.replace("level: 75%", f"level: {level}"), "exp.yaml")
    assert "exp.yaml:4:" in str(info.value) and "reference.level" in str(info.value) and words in str(info.value)


# ---------------------------------------------------------------- like with like: per page, at two sizes

def _fault_claim_at(size: str, tmp_path) -> "rp.ClaimRow":
    """The splice-write study's fault claim on a real localhost run of its two one-sub-block cells at `size`."""
    import zcorch
    from zcorch.analysis.frames import read_meta
    from fixtures_analysis import zcorch_cli
    out = tmp_path / size
    res = zcorch_cli("-q", "run", f"{REPO}/experiments/splice-write-benchmark.yaml", "-o", out, "--set",
                     f"bytes={size}", "--set", "subblocks=1", "--set", "repeats=5", "--set", "sample_interval=null",
                     "--set", "baselines.iperf3=false")
    assert res.returncode == 0, res.stderr
    ref = reference_of(open(f"{REPO}/experiments/splice-write-benchmark.yaml").read(), "splice.yaml")
    rows = rp.claims(zcorch.load(out), ref, zcorch.load_baselines(out), rp.host_facts(read_meta(out)))
    return next(r for r in rows if "faults every page" in r.claim.says)


@pytest.mark.slow   # ten 1 GiB transfers: the size is the claim
def test_the_fault_claim_gives_one_verdict_at_64_mib_and_1_gib(tmp_path):
    small, large = _fault_claim_at("64MiB", tmp_path), _fault_claim_at("1GiB", tmp_path)
    print(small.evidence, large.evidence, sep="\n")
    # a gifted buffer faults once a page at any size: the per-page rule decides the same, and decides
    assert small.verdict == large.verdict == rp.HOLDS
    assert 0.9 <= small.a.median <= 1.1 and 0.9 <= large.a.median <= 1.1


def test_a_total_against_a_constant_is_refused():
    text = REF.replace("  claims:\n", "  claims:\n    - {says: faults, metric: send_minflt, a: {send_mode: splice}, "
                                      "holds_if: a >= 256}\n")
    with pytest.raises(ConfigError) as info:
        reference_of(text, "exp.yaml")
    assert "exp.yaml:" in str(info.value) and "reference.claims[0].holds_if" in str(info.value)
    assert "a total that grows with the bytes moved" in str(info.value)
    ok = reference_of(text.replace("send_minflt,", "send_minflt_per_page,").replace("256", "0.9"), "exp.yaml")
    assert ok.claims[0].b is None and ok.claims[0].condition == "a >= 0.9"
