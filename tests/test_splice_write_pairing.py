"""experiments/splice-write-benchmark.yaml pairs every published figure with the cell of the README row's own
configuration, checked on a small real localhost run of the shipped file (shrunk with --set).

The configuration of each row is read here from the row's name as the README writes it ("1M mmap, 64x16k
blocks splice": one mapping per buffer, a splice per sub-block), independently of the file's `match:`es,
and compared with the parameters of the cell each figure was measured in. The README's system times are
copied here from its text, so the published ratio of each claim is checked against the rows its cells are.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import zcorch
from zcorch.analysis import reproduction as rp
from zcorch.config.experiment import reference_of
from zcorch.sweep.pipeline import run_sweep

from fixtures_worker import needs_native

pytestmark = needs_native

ROOT = Path(__file__).resolve().parent.parent
EXPERIMENT = ROOT / "experiments" / "splice-write-benchmark.yaml"
SMALL = ["bytes=16MiB", "repeats=2", "baselines.iperf3=false", "timeout=60s"]

# The README's rows and their system time (s), in its order.
README_SYSTEM_S = {
    "Single 1M block splice": 7.61, "64x16k blocks mmap, 1M splice": 9.85, "1M mmap, 64x16k blocks splice": 8.01,
    "64x16k blocks mmap and splice": 10.50, "256x4k blocks mmap, 1M splice": 13.95,
    "1M mmap, 256x4k blocks splice": 9.26, "256x4k blocks mmap and splice": 17.03, "Single 1M block write": 2.67,
    "64x16k blocks write": 3.03, "256x4k blocks write": 5.08,
}
BLOCKS = r"(\d+)x\d+k blocks"


def row_configuration(row: str) -> dict:
    """The parameters a README row name stands for (the README: LARGE_MMAP / LARGE_VECIO, write with memset)."""
    if row == "Single 1M block write":
        return {"send_mode": "write", "refill": True, "subblocks": 1}
    if row == "Single 1M block splice":   # one sub-block: the mapping and the splice are of the whole buffer
        return {"send_mode": "vmsplice", "gift": True, "subblocks": 1}
    if m := re.fullmatch(rf"{BLOCKS} write", row):
        return {"send_mode": "write", "refill": True, "subblocks": int(m[1])}
    for pattern, mmap_grain, splice_grain in ((rf"{BLOCKS} mmap, 1M splice", "subblock", "whole"),
                                              (rf"1M mmap, {BLOCKS} splice", "whole", "subblock"),
                                              (rf"{BLOCKS} mmap and splice", "subblock", "subblock")):
        if m := re.fullmatch(pattern, row):
            return {"send_mode": "vmsplice", "gift": True, "subblocks": int(m[1]), "mmap_grain": mmap_grain,
                    "splice_grain": splice_grain}
    raise AssertionError(f"not a row of the README: {row!r}")


def test_row_names_read_as_the_readme_means_them():
    assert row_configuration("1M mmap, 256x4k blocks splice")["mmap_grain"] == "whole"
    assert row_configuration("64x16k blocks mmap, 1M splice")["splice_grain"] == "whole"
    with pytest.raises(AssertionError):
        row_configuration("64x16k blocks splice")


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("splice-write") / "set"
    result = run_sweep(str(EXPERIMENT), output=str(out), command=["test"], overrides=SMALL)
    assert result.exit_status == 0, [r.get("reason") for r in result.records]
    df = zcorch.load(out)
    ref = reference_of((out / "experiment.yaml").read_text())
    return df, zcorch.load_baselines(out), ref


def cell_params(df, cell: str) -> dict:
    row = df[df["cell"] == cell].iloc[0]
    out = {k: row[k] for k in ("send_mode", "mmap_grain", "splice_grain")}
    return dict(out, gift=bool(row["gift"]), refill=bool(row["refill"]), subblocks=int(row["subblocks"]))


@pytest.mark.slow
def test_every_published_figure_stands_next_to_its_rows_cell(small_run):
    df, baselines, ref = small_run
    rows = rp.figures(df, baselines, ref)
    seen: "dict[str, set[str]]" = {}
    for r in rows:
        row = r.figure.label.partition(": ")[0]
        seen.setdefault(row, set()).add(r.figure.metric)
        assert r.measured.cell is not None and r.measured.n == 2, r.figure.label
        have = cell_params(df, r.measured.cell)
        want = row_configuration(row)
        assert {k: have[k] for k in want} == want, (r.figure.label, have)
        assert have["send_mode"] == "write" or have["refill"] is False
    # all ten rows, each with its system, user and fault figures
    assert set(seen) == set(README_SYSTEM_S)
    assert all({"send_stime_us", "send_utime_us", "send_minflt"} <= m for m in seen.values()), seen
    system = {r.figure.label.partition(": ")[0]: r.published[0] for r in rows if r.figure.metric == "send_stime_us"}
    assert system == pytest.approx({k: v * 1e6 for k, v in README_SYSTEM_S.items()})
    # the seven splice rows are seven different cells, the three write rows three more
    cells = {r.figure.label.partition(": ")[0]: r.measured.cell for r in rows}
    assert len(set(cells.values())) == 10


@pytest.mark.slow
def test_each_claim_shows_the_ratio_of_its_own_rows(small_run):
    df, _, ref = small_run
    by_config = {}
    for row in README_SYSTEM_S:
        want = row_configuration(row)
        hits = {c for c in df["cell"].unique() if {k: cell_params(df, c)[k] for k in want} == want}
        if row.startswith("Single 1M block splice"):
            hits = {c for c in hits if cell_params(df, c)["splice_grain"] == "whole"}
        (cell,) = hits
        by_config[cell] = row
    claims = rp.claims(df, ref)
    stime = [c for c in claims if c.claim.metric == "send_stime_us"]
    assert len(stime) >= 6
    for c in stime:
        a, b = by_config[c.a.cell], by_config[c.b.cell]
        ratio = README_SYSTEM_S[a] / README_SYSTEM_S[b]
        assert f"a/b = {ratio:.2f}" in c.published, (c.claim.says, a, b, c.published)
        for number in (README_SYSTEM_S[a], README_SYSTEM_S[b]):   # the claim's words quote its own rows
            assert f"{number:.2f} s" in c.claim.says, (c.claim.says, a, b)
    # the README's "more, smaller splice calls" with zcorch's former pairing read 17.03 / 7.61 = 2.24
    smaller = next(c for c in stime if c.claim.says.startswith("more, smaller splice calls"))
    assert (by_config[smaller.a.cell], by_config[smaller.b.cell]) == ("1M mmap, 256x4k blocks splice",
                                                                      "Single 1M block splice")
    assert "a/b = 1.22" in smaller.published
