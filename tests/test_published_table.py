"""docs/reproductions.md's generator (`zcorch reproductions`, zcorch.analysis.published) on the small real result sets
of the five studies shipped under tests/data/reproductions/ (recorded by `FIXTURE=1 scripts/reproductions`:
4 MiB transfers, two runs a cell, Schutt and ext4 between the two hosts of a lab).

The committed tests/data/reproductions/expected.md is what the command made of them; a change to the tables
regenerates it with the command the failure names. The real docs/reproductions.md comes from the big runs."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

import zcorch
from zcorch.analysis import published
from zcorch.analysis import reproduction as rp
from zcorch.config.sections import reference_of
from zcorch.errors import ConfigError

from fixtures_analysis import GENERATED, copy_result_set, zcorch_cli

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "reproductions"
EXPECTED = DATA / "expected.md"
STUDIES = ("ext4-nodelalloc-2011", "schutt-2006", "sendfile-pinning-2001", "splice-write-benchmark",
           "zero-copy-output-2011")
REGENERATE = ("zcorch reproductions tests/data/reproductions/*/ -o tests/data/reproductions/expected.md "
              "(from the checkout)")


def shipped() -> "list[Path]":
    dirs = sorted(p for p in DATA.iterdir() if p.is_dir())
    assert [d.name for d in dirs] == list(STUDIES)
    return dirs


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> "tuple[list[Path], subprocess.CompletedProcess, str]":
    """(private copies of the shipped sets under their own names (loading writes a cache into a set),
    `zcorch reproductions COPIES -o FILE`, the FILE it wrote): made once for the module's tests that read it."""
    tmp = tmp_path_factory.mktemp("made")
    copies = [copy_result_set(d, tmp / "sets" / d.name) for d in shipped()]
    out = tmp / "reproductions.md"
    res = zcorch_cli("reproductions", *map(str, copies), "-o", str(out))
    return copies, res, out.read_text(encoding="utf-8") if out.exists() else ""


def test_the_shipped_sets_are_small():
    total = sum(f.stat().st_size for d in shipped() for f in d.iterdir() if f.name not in GENERATED)
    assert total < 1_000_000, f"{total} bytes: the shipped result sets should stay kilobytes"


@pytest.mark.slow
def test_the_document_is_what_the_command_makes_of_the_shipped_sets(made):
    copies, res, written = made
    assert res.returncode == 0, res.stderr
    assert written == EXPECTED.read_text(encoding="utf-8"), f"stale: {REGENERATE}"
    printed = zcorch_cli("reproductions", *map(str, copies))
    assert printed.returncode == 0 and printed.stdout == EXPECTED.read_text(encoding="utf-8")


def _section(doc: str, name: str) -> str:
    start = doc.index(f"\n## {name}: ")
    nxt = doc.find("\n## ", start + 1)
    return doc[start:nxt if nxt > 0 else len(doc)]


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES)
def test_each_published_figure_stands_beside_the_cell_that_produced_ours(study, tmp_path):
    """Per study: every figure's row carries the published value and, in its configuration column, the cell id
    of the one cell its match selects in that result set (or the baseline configuration for `of:` figures)."""
    d = copy_result_set(DATA / study, tmp_path / study)
    doc = EXPECTED.read_text(encoding="utf-8")
    section = _section(doc, study)
    text = (d / "experiment.yaml").read_text()
    ref = reference_of(text, str(d / "experiment.yaml"))
    df = zcorch.load(d)
    rows = [ln for ln in section.split("### Published figures and ours")[1].split("\n\n")[1].splitlines()[2:]]
    assert len(rows) == len(ref.figures)
    for fig, fig_row, line in zip(ref.figures, rp.figures(df, zcorch.load_baselines(d), ref), rows):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == (fig.label or "–").replace("|", "\\|")
        assert cells[1] == rp.show_range(*fig_row.published, fig_row.unit)
        if getattr(fig, "of", None):
            assert cells[4].startswith(rp.baseline_word(fig.of))
        else:
            cell = str(rp.cell_rows(df, fig.match)["cell"].iloc[0])
            assert cells[4].endswith(f"(cell {cell})"), (fig.label, cells[4])
            assert cells[2].startswith(rp.show(fig_row.measured.median, fig_row.unit))


def test_each_claim_shows_its_verdict_and_conditions():
    doc = EXPECTED.read_text(encoding="utf-8")
    for study in STUDIES:
        d = DATA / study
        ref = reference_of((d / "experiment.yaml").read_text(), "experiment.yaml")
        section = _section(doc, study)
        for claim in ref.claims:
            line = next(ln for ln in section.splitlines() if ln.startswith(f"| {claim.says.replace('|', chr(92) + '|')} |"))
            verdict = line.split(" | ")[1]
            assert verdict.split(": ")[0] in rp.VERDICTS
            if claim.needs:
                assert all(f" {name}: " in line for name, _ in claim.needs)
    morton = _section(doc, "sendfile-pinning-2001")
    assert "idle_hosts:" in morton and "cpus:" in morton


def test_the_summary_lists_every_claim_that_does_not_hold_here():
    doc = EXPECTED.read_text(encoding="utf-8")
    differ = doc.split("## Where the verdicts differ from the studies' text")[1].split("\n## ")[0]
    n_not_holding = sum(doc.count(f"| {v} |") + doc.count(f"| {v}: ") for v in (rp.FAILS, rp.INCONCLUSIVE, rp.UNTESTABLE))
    assert differ.count("\n- **") == n_not_holding


def test_a_result_set_without_a_reference_is_refused(small_set, tmp_path):
    res = zcorch_cli("reproductions", str(small_set))
    assert res.returncode == 2 and "no `reference:` section" in res.stderr


def test_the_document_replaces_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "doc.md"
    os.symlink(victim, out)
    copy = copy_result_set(DATA / "sendfile-pinning-2001", tmp_path / "sendfile-pinning-2001")
    published.write_reproductions([copy], out)
    assert victim.read_text() == "keep me" and not out.is_symlink()
    assert out.read_text(encoding="utf-8").startswith(published.TITLE)


def test_notes_are_put_after_the_summary(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("### Why\n\nBecause the machine was busy.\n")
    copy = copy_result_set(DATA / "sendfile-pinning-2001", tmp_path / "sendfile-pinning-2001")
    doc = published.reproductions_markdown([copy], published.read_notes(notes))
    assert doc.index("Because the machine was busy.") < doc.index("\n## sendfile-pinning-2001: ")
    with pytest.raises(ConfigError, match="cannot read the notes"):
        published.read_notes(tmp_path / "missing.md")


def test_the_notes_cannot_carry_a_figure(tmp_path):
    # the shipped notes: no number at all (every figure of the document is generated from its sets)
    shipped_notes = ROOT / "docs/reproductions-notes.md"
    assert published.notes_figures(shipped_notes.read_text(encoding="utf-8")) == []
    assert published.read_notes(shipped_notes)
    notes = tmp_path / "notes.md"
    notes.write_text("## Why\n\nsendfile-pinning-2001 on ext4 and RAID-5: words only.\n"
                     "sendfile moved 353 against 401 MB/s, with `--set bytes=1GiB`.\n")
    with pytest.raises(ConfigError) as info:
        published.read_notes(notes)
    text = str(info.value)
    assert f"{notes}:4: `353`" in text and f"{notes}:4: `401`" in text and f"{notes}:4: `1GiB`" in text, text
    assert "sendfile-pinning-2001" not in text and "`4`" not in text and "RAID" not in text


def test_the_document_states_how_its_sets_were_made_and_the_studys_units(made):
    copies, res, doc = made
    assert res.returncode == 0, res.stderr
    how = doc.split("## How these sets were made")[1].split("\n## ")[0]
    for d in copies:
        row = next(line for line in how.splitlines() if line.startswith(f"| {d.name} |"))
        assert "| 4MiB |" in row and "| 2 |" in row and "--set bytes=4MiB" in row   # the fixtures' own size and runs
    # the unit Morton's table mislabels is said in the document itself, under his setup
    morton = reference_of((ROOT / "experiments/sendfile-pinning-2001.yaml").read_text(), "morton.yaml")
    d = next(d for d in copies if d.name == "sendfile-pinning-2001")
    section = rp.markdown(morton, zcorch.load(d), zcorch.load_baselines(d), "morton")
    units = next(line for line in section.splitlines() if line.startswith("**The study's units:**"))
    assert "Mbyte/s" in units and "KB/s" in units
