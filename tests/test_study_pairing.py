"""Each shipped study's published figures paired with the cell or baseline of the matching configuration:
the figures and claims of experiments/*.yaml, evaluated on real result sets
(tests/data/filesystems-small: four loop-device filesystems with a dd baseline on each, recorded as root) or
checked against the study's expanded plan. What is asserted is *which* measurement stands next to each
published number, not that the number appears."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from zcorch.analysis import reproduction as rp
from zcorch.analysis.frames import load_baselines
from zcorch.analysis.load import load
from zcorch.config.experiment import load_experiment, parse_experiment, reference_of
from zcorch.errors import ConfigError
from zcorch.plan import expand
from conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent
EXT4 = ROOT / "experiments" / "ext4-nodelalloc-2011.yaml"


def reference_section(path: Path) -> str:
    text = path.read_text()
    return text[text.index("\nreference:"):]


def with_study_reference(result_set: Path, study: Path) -> Path:
    exp = result_set / "experiment.yaml"
    exp.write_text(exp.read_text() + reference_section(study))
    return result_set


def dd_write_mb_s(result_set: Path) -> "dict[str, float]":
    """Each filesystem's dd_write, read straight from baselines.jsonl (independently of the analysis)."""
    out = {}
    for line in (result_set / "baselines.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["kind"] == "dd_write" and rec["status"] == "ok":
            out[rec["key"]["filesystem"]] = rec["result"]["bytes"] / rec["result"]["wall_s"] / 1e6
    return out


def test_ext4_dd_figures_are_paired_with_dd_on_their_own_filesystem(fs_set):
    result_set = with_study_reference(fs_set, EXT4)
    ref = reference_of((result_set / "experiment.yaml").read_text(), "experiment.yaml")
    df, baselines = load(result_set), load_baselines(result_set)
    dd = dd_write_mb_s(result_set)
    assert len(set(dd.values())) == len(dd) >= 3       # the filesystems' dd differ: a wrong pairing shows
    every = rp.figures(df, baselines, ref)
    rows = [r for r in every if r.figure.of == "dd_write"]
    assert [r.figure.match.describe() for r in rows] == [
        "filesystem=ext4-delalloc", "filesystem=ext4-nodelalloc", "filesystem=xfs"]
    # the same page figures again beside our dd with conv=fdatasync: rows of their own (this set has none)
    synced = [r for r in every if r.figure.of == "dd_fdatasync"]
    assert [r.figure.match.describe() for r in synced] == [r.figure.match.describe() for r in rows]
    assert all(r.measured.n == 0 for r in synced)
    for r, fs in zip(rows, ("ext4-delalloc", "ext4-nodelalloc", "xfs")):
        assert r.figure.of == "dd_write"
        assert r.measured.median == pytest.approx(dd[fs], rel=1e-9), fs   # that filesystem's dd, no other
        assert r.measured.n == 1 and r.measured.cell == f"dd write on filesystem={fs}"
        assert r.published_norm is None                 # a filesystem's dd is no share of the network's iperf
    table = rp.figure_table(rows)
    assert table[0][1] == "dd write of filesystem=ext4-delalloc" and table[0][3] == "278 MB/s"
    assert table[1][3] == "392 MB/s"


def test_ext4_claims_pair_dd_with_dd_and_the_network_claim_with_transfer_cells(fs_set):
    result_set = with_study_reference(fs_set, EXT4)
    ref = reference_of((result_set / "experiment.yaml").read_text(), "experiment.yaml")
    df, baselines = load(result_set), load_baselines(result_set)
    dd = dd_write_mb_s(result_set)
    nodelalloc, xfs, network = rp.claims(df, ref, baselines)
    assert nodelalloc.a.median == pytest.approx(dd["ext4-nodelalloc"])
    assert nodelalloc.b.median == pytest.approx(dd["ext4-delalloc"])
    assert xfs.a.median == pytest.approx(dd["xfs"]) and xfs.b.median == pytest.approx(dd["ext4-delalloc"])
    # one dd per filesystem: no interval, so no verdict either way
    assert nodelalloc.verdict == rp.INCONCLUSIVE and "one record: no interval" in nodelalloc.evidence
    assert nodelalloc.published.startswith("published: a 392 MB/s vs b 278 MB/s")
    # the transfer claim: the read cells of the two ext4 filesystems, not their dd
    ok = df[df["status"] == "ok"]
    for side, fs in ((network.a, "ext4-nodelalloc"), (network.b, "ext4-delalloc")):
        cell = ok[(ok["filesystem"] == fs) & (ok["recv_mode"] == "read")]
        assert side.median == pytest.approx(cell["mb_s"].median()) and side.n == len(cell) == 3
    assert network.published == ""                     # the page gives no transfer figure per filesystem


def test_a_dd_baseline_row_per_filesystem_never_a_median_across_them(fs_set):
    text = (fs_set / "experiment.yaml").read_text() + """
reference:
  source: {title: t}
  baselines:
    dd_write: {value: 278 MB/s}
"""
    ref = reference_of(text, "experiment.yaml")
    dd = dd_write_mb_s(fs_set)
    rows = {r[0]: r[3] for r in rp.baseline_table(ref, load_baselines(fs_set))}
    assert set(rows) == {f"dd write on filesystem={fs}" for fs in dd}
    for fs, mb_s in dd.items():
        assert rows[f"dd write on filesystem={fs}"].endswith(f"= {rp.show(mb_s, 'MB/s')}")
        assert "median of" not in rows[f"dd write on filesystem={fs}"]


def test_a_cell_figure_normalised_by_dd_takes_its_own_filesystem_s_dd_or_none(fs_set):
    text = (fs_set / "experiment.yaml").read_text() + """
reference:
  source: {title: t}
  baselines:
    dd_write: {value: 300 MB/s}
  figures:
    - {match: {filesystem: xfs, recv_mode: read}, metric: mb_s, value: 250 MB/s, baseline: dd_write}
"""
    ref = reference_of(text, "experiment.yaml")
    df, baselines = load(fs_set), load_baselines(fs_set)
    dd = dd_write_mb_s(fs_set)
    (row,) = rp.figures(df, baselines, ref)
    assert row.measured_baseline == pytest.approx(dd["xfs"] * 8 / 1000)
    # without a dd of xfs, another filesystem's dd does not stand in for it
    (row,) = rp.figures(df, baselines[baselines["key_filesystem"] != "xfs"], ref)
    assert row.measured_baseline != row.measured_baseline    # NaN


def test_ext4_study_plan_pairs_every_figure_with_its_filesystem_only():
    exp = load_experiment(EXT4, unknown_hosts=True)
    plan = expand(exp)
    assert exp.name == "ext4-nodelalloc-2011" and not plan.warnings
    cells = [c.params for c in plan.cells]
    for f in exp.reference.figures:
        hits = [c for c in cells if f.match.selects(c)]
        assert hits and {c["filesystem"] for c in hits} == {f.match.conditions[0].values[0]}
    # the filesystems are mounted as on the page: nobarrier on ext4
    for name in ("ext4-delalloc", "ext4-nodelalloc"):
        assert "nobarrier" in exp.filesystems[name].mount_options


def test_an_of_match_must_name_one_configuration_of_the_kind():
    # a dd figure whose match selects cells of three filesystems stands for none of them
    text = EXT4.read_text().replace("match: {filesystem: xfs}}", "match: {recv_mode: read}}")
    with pytest.raises(ConfigError, match=r"selects cells of different `filesystem`: `of: dd_write` needs one"):
        expand(parse_experiment(text, "ext4.yaml", unknown_hosts=True))


# ---------------------------------------------------------------- Schutt 2006: a real small localhost run

SCHUTT = ROOT / "experiments" / "schutt-2006.yaml"
# The shipped file, shrunk to run on localhost in seconds: only sizes, hosts and the MTU change
SCHUTT_SMALL = ["hosts=localhost", "network=null", "bytes=4MiB", "repeats=2", "baselines.iperf3=false",
                "timeout=30s"]   # (dd follows bytes: `count: cells`)


@pytest.fixture(scope="module")
def schutt_set(tmp_path_factory) -> Path:
    from zcorch.sweep.pipeline import run_sweep

    out = tmp_path_factory.mktemp("schutt") / "schutt-small"
    result = run_sweep(str(SCHUTT), output=str(out), command=["test"], overrides=SCHUTT_SMALL)
    assert result.exit_status == 0, [r.get("reason") for r in result.records if r.get("status") != "ok"]
    return out


def cell_params(result_set: Path) -> "dict[str, dict]":
    return {rec["cell"]: rec["params"] for rec in map(json.loads, (result_set / "runs.jsonl").read_text().splitlines())}


@pytest.mark.slow
def test_schutt_figures_are_paired_with_the_cell_of_their_row(schutt_set):
    ref = reference_of((schutt_set / "experiment.yaml").read_text(), "experiment.yaml")
    params = cell_params(schutt_set)
    rows = {r.figure.label: r for r in rp.figures(load(schutt_set), load_baselines(schutt_set), ref)}
    file_ = "{scratch}/schutt-source.dat"
    recv_file = "{scratch}/schutt-recv.dat"
    want = {  # his row -> (send, receive, source, sink, fsync)
        "A) from /dev/zero -> 1) to /dev/null": ("write", "read", "/dev/zero", "/dev/null", False),
        "A) from file -> 1) to /dev/null": ("write", "read", file_, "/dev/null", False),
        "B) from file -> 1) to /dev/null": ("mmap", "read", file_, "/dev/null", False),
        "C) from file -> 1) to /dev/null": ("splice", "read", file_, "/dev/null", False),
        "A) from /dev/zero -> 1) to file": ("write", "read", "/dev/zero", recv_file, True),
        "A) from /dev/zero -> 2) to file": ("write", "mmap", "/dev/zero", recv_file, True),
        "A) from /dev/zero -> 3) to file": ("write", "vmsplice", "/dev/zero", recv_file, True),
    }
    assert set(rows) == set(want)
    for label, (send, recv, source, sink, fsync) in want.items():
        p = params[rows[label].measured.cell]
        assert (p["send_mode"], p["recv_mode"], p["source"], p["sink"], p["fsync"]) == (send, recv, source, sink,
                                                                                       fsync), label
        assert rows[label].measured.n == 2
    # the "to file" rows, fsynced inside the timing, stand next to his dd (with its sync) and ours
    for label in [k for k in want if k.endswith("to file")]:
        assert rows[label].figure.baseline == "dd_write" and rows[label].measured_norm > 0


def test_schutt_splice_is_tested_against_every_other_send_mode(schutt_set):
    ref = reference_of((schutt_set / "experiment.yaml").read_text(), "experiment.yaml")
    params = cell_params(schutt_set)
    fastest = [r for r in rp.claims(load(schutt_set), ref, load_baselines(schutt_set))
               if r.claim.says.startswith("splice is the fastest way to send a file")]
    assert {params[r.a.cell]["send_mode"] for r in fastest} == {"splice"}
    others = {p["send_mode"] for p in params.values()} - {"splice"}
    assert {params[r.b.cell]["send_mode"] for r in fastest} == others == {"write", "mmap"}
    for r in fastest:   # each from a file into /dev/null, as his rows A/B/C
        assert params[r.b.cell]["source"] != "/dev/zero" and params[r.b.cell]["sink"] == "/dev/null"


def test_schutt_records_the_page_cache_against_the_data_and_runs_at_mtu_9000():
    # what decides whether his "to file" rows reached a disk: the receiver's RAM (meta.json) against `bytes`
    exp = load_experiment(SCHUTT, unknown_hosts=True)
    cells = [c.params for c in expand(exp).cells]
    assert {c["network"] for c in cells} == {"jumbo"} and exp.networks["jumbo"].mtu == 9000
    assert all(c["fsync"] == (c["sink"] != "/dev/null") for c in cells)


def test_schutt_small_run_records_ram_and_bytes(schutt_set):
    meta = json.loads((schutt_set / "meta.json").read_text())
    assert meta["hosts"]["receiver"]["mem_total_bytes"] > 0
    assert {p["bytes"] for p in cell_params(schutt_set).values()} == {4 << 20}


def test_schutt_dd_writes_what_a_transfer_moves_at_any_bytes(schutt_set):
    # his dd wrote what a transfer moved (bs=32k count=512k: 16 GiB); `--set bytes=4MiB` shrinks it too
    dd = [json.loads(x) for x in (schutt_set / "baselines.jsonl").read_text().splitlines()]
    written = [r for r in dd if r["kind"] == "dd_write"]
    assert written and all(r["status"] == "ok" for r in written), written
    assert {(r["key"]["bs"], r["key"]["count"], r["result"]["bytes"]) for r in written} == {(32 << 10, 128, 4 << 20)}
    assert all("; sync" in r["result"]["timed"] for r in written)     # his `time { dd ...; sync; }`
    for size, count in (("16GiB", 512 << 10), ("256MiB", 8192), ("1000000", 31)):   # 31 blocks: rounded up
        exp = load_experiment(SCHUTT, ["hosts=localhost", "network=null", f"bytes={size}"])
        assert (exp.baselines.dd.bs, exp.baselines.dd.count) == (32 << 10, count), size
        assert exp.baselines.dd.cells


# ---------------------------------------------------------------- the experiment keeps its name (a real run)

NAMED = """\
name: named-study
hosts: localhost
params: {bytes: 1MiB, buffer: 64KiB, source: /dev/zero, sink: "{scratch}/named-study.dat", timeout: 30s}
matrix:
  send_mode: [write]
repeats: 1
baselines:
  iperf3: false
  dd: false
  commands:
    - name: nc
      receiver: [nc, -l, "{address}", "{port}"]
      sender: [nc, -N, "{address}", "{port}"]
      stdin: source
      stdout: sink
reference:
  source: {title: a study with a command baseline}
  baselines:
    "command:nc": {value: 502.77 MiB/s, command: lftp get}
  figures:
    - {match: {send_mode: write}, metric: mb_s, value: 500 MB/s}
"""


@pytest.mark.slow
def test_a_reference_command_baseline_leaves_the_name_to_the_experiment(tmp_path, monkeypatch):
    # `reference:` with `baselines.commands` once named the experiment after the command (`nc`): its
    # manifest, its default result directory, its report title and its history group
    from zcorch.analysis.history import find_result_sets, open_sweep
    from zcorch.analysis.report import build_report
    from zcorch.sweep.pipeline import run_sweep

    if shutil.which("nc") is None:
        pytest.skip("needs nc (netcat-openbsd)")
    (tmp_path / "named.yaml").write_text(NAMED)
    monkeypatch.chdir(tmp_path)
    result = run_sweep("named.yaml", command=["test"])       # the default directory: results/<name>-<time>
    assert result.exit_status == 0, [r.get("reason") for r in result.records if r.get("status") != "ok"]
    (made,) = (tmp_path / "results").iterdir()
    assert made.name.startswith("named-study-")
    assert json.loads((made / "manifest.json").read_text())["name"] == "named-study"
    assert [json.loads(x)["key"]["name"] for x in (made / "baselines.jsonl").read_text().splitlines()] == ["nc"]
    assert "named-study" in build_report(made).split("</title>")[0]
    assert [open_sweep(p).name for p in find_result_sets(tmp_path / "results")] == ["named-study"]


# ---------------------------------------------------------------- ext4 2011: a real small run on loop devices

EXT4_SMALL = ["hosts=localhost", "network=null", "bytes=2MiB", "repeats=2", "baselines.iperf3=false",
              "baselines.commands=[]", "timeout=30s",
              "filesystems.ext4-delalloc.loop.size=64MiB", "filesystems.ext4-nodelalloc.loop.size=64MiB",
              "filesystems.xfs.loop.size=320MiB"]   # (mkfs.xfs's minimum is 300MiB)


@pytest.mark.root
def test_ext4_study_s_dd_claims_rest_on_repeated_dd_of_each_filesystem(tmp_path):
    # the shipped file, shrunk: its dd runs `repeats` times per filesystem (the file says 5), so a claim
    # about the page's dd figures has an interval made of that filesystem's own records
    from zcorch.sweep.pipeline import run_sweep

    require_tool("mkfs.xfs")
    out = tmp_path / "ext4-small"
    result = run_sweep(str(EXT4), output=str(out), command=["test"], overrides=EXT4_SMALL)
    assert result.exit_status == 0, [r.get("reason") for r in result.records if r.get("status") != "ok"]
    records = [json.loads(x) for x in (out / "baselines.jsonl").read_text().splitlines()]
    by_fs: "dict[str, list[float]]" = {}
    for rec in records:
        if rec["kind"] == "dd_write" and rec["status"] == "ok":
            by_fs.setdefault(rec["key"]["filesystem"], []).append(rec["result"]["bytes"] / rec["result"]["wall_s"] / 1e6)
    assert {fs: len(v) for fs, v in by_fs.items()} == {"ext4-delalloc": 5, "ext4-nodelalloc": 5, "xfs": 5}
    assert sorted(r["repeat"] for r in records if r["kind"] == "dd_write") == sorted(list(range(5)) * 3)
    # dd as the page ran it: alone (no sync timed), 2 MiB as the transfers (`count: cells`), after one warm-up
    # write into each fresh filesystem (its own record, repeat 0); and a conv=fdatasync write of its own each time
    for rec in records:
        assert rec["status"] == "ok", rec
        assert rec["key"]["sync"] is False and rec["key"]["count"] == 2 and rec["result"]["bytes"] == 2 << 20
    kinds = [(r["key"]["filesystem"], r["kind"], r["repeat"]) for r in records]
    for fs in ("ext4-delalloc", "ext4-nodelalloc", "xfs"):
        mine = [(k, rep) for f, k, rep in kinds if f == fs]
        assert mine[:4] == [("dd_warmup", 0), ("dd_write", 0), ("dd_read", 0), ("dd_fdatasync", 0)], mine
        assert [k for k, _ in mine].count("dd_warmup") == 1 and [k for k, _ in mine].count("dd_fdatasync") == 5
    write = next(r for r in records if r["kind"] == "dd_write")["result"]
    synced = next(r for r in records if r["kind"] == "dd_fdatasync")["result"]
    assert "sync" not in write["timed"].split("(")[0] and "conv=fdatasync" in synced["timed"]
    ref = reference_of((out / "experiment.yaml").read_text(), "experiment.yaml")
    nodelalloc, xfs, _ = rp.claims(load(out), ref, load_baselines(out))
    for side, fs in ((nodelalloc.a, "ext4-nodelalloc"), (nodelalloc.b, "ext4-delalloc"), (xfs.a, "xfs")):
        assert side.n == 5 and side.median == pytest.approx(sorted(by_fs[fs])[2]) and side.has_ci, fs
    assert "one record" not in nodelalloc.evidence


# ---------------------------------------------------------------- Morton 2001: sendfile() of the whole file

MORTON = ROOT / "experiments" / "sendfile-pinning-2001.yaml"
WHOLE = 1 << 30     # the whole-file rows' call: the file's size at the study's 1 GiB (the worker's largest call)


def test_morton_plan_has_whole_file_sendfile_rows_and_his_figures_stand_beside_them():
    # "sendfile() sends the entire file": one call whose count is the file's size, in every pinning case
    exp = load_experiment(MORTON)
    plan = expand(exp)
    cells = [c.params for c in plan.cells]
    whole = [c for c in cells if c["send_mode"] == "sendfile" and c["send_buffer"] == WHOLE]
    assert len(whole) == 3 and all(c["send_buffer"] >= c["bytes"] for c in whole)
    assert {(c["send_cpu"], c["recv_cpu"]) for c in whole} == {(None, None), (0, 1), (0, 0)}
    assert [c for c in cells if c["send_mode"] == "sendfile" and c["send_buffer"] is None]   # 64 KiB calls too
    for f in exp.reference.figures:
        (hit,) = [c for c in cells if f.match.selects(c)]
        assert (hit["send_buffer"] == WHOLE) == (hit["send_mode"] == "sendfile"), f.label
    for claim in exp.reference.claims:
        for side in (claim.a, claim.b):
            (hit,) = [c for c in cells if side.selects(c)]
            assert hit["send_mode"] != "sendfile" or hit["send_buffer"] == WHOLE, claim.says


@pytest.mark.slow
def test_morton_whole_file_sendfile_runs_on_localhost(tmp_path):
    # the shipped file, shrunk: the whole 4 MiB file in one sendfile() call, beside the 64 KiB calls
    from zcorch.sweep.pipeline import run_sweep
    out = tmp_path / "morton-small"
    result = run_sweep(str(MORTON), output=str(out), command=["test"],
                       overrides=["bytes=4MiB", "repeats=2", "baselines.iperf3=false", "timeout=30s"])
    assert result.exit_status == 0, [r.get("reason") for r in result.records if r.get("status") != "ok"]
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    whole = [r for r in runs if r["params"]["send_mode"] == "sendfile" and r["params"]["send_buffer"] == WHOLE]
    assert len(whole) == 6 and all(r["status"] == "ok" for r in whole)
    for r in whole:
        assert r["sender"]["bytes"] == r["receiver"]["bytes"] == 4 << 20
        assert r["sender"]["params"]["buffer"] == WHOLE      # the sender's call: the whole file at once
    ref = reference_of((out / "experiment.yaml").read_text(), "experiment.yaml")
    rows = rp.figures(load(out), load_baselines(out), ref)
    for row in rows[:3]:                                    # his sendfile() rows: the whole-file cells
        assert cell_params(out)[row.measured.cell]["send_buffer"] == WHOLE and row.measured.n == 2
