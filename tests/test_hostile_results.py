"""A hostile result set under `zcorch report` and `zcorch history`.

Whoever made a result set controls every file in it; the commands often run as root. Real files, links,
a sparse 2 GiB runs.jsonl and the real CLI: nothing outside the set is written or read through a link,
memory stays bounded, what was skipped is said, and only http(s) and relative links are live."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from fixtures_analysis import ROOT, copy_result_set, zcorch_cli, zcorch_process
from test_history import READ, write_sweep
from zcorch.results import setfiles

SECRET = "TOP-SECRET-7f3a"


@pytest.fixture
def victim(tmp_path):
    d = tmp_path / "victim"
    d.mkdir()
    (d / "file").write_text("victim's own")
    secret = d / "secret"
    secret.write_text(f"password: {SECRET}\n")
    secret.chmod(0o600)
    return d


def _hrefs(html: str) -> "list[str]":
    return re.findall(r'(?:href|src)="([^"]*)"', html)


@pytest.mark.slow
def test_report_writes_through_no_planted_link(small_set, victim):
    """report.html, its old fixed temporary name and plots/ (the directory and a file in it) all linked to
    the victim: the victim is untouched and the report is a regular file."""
    (small_set / "report.html").symlink_to(victim / "file")
    (small_set / "report.html.tmp").symlink_to(victim / "file")
    res = zcorch_cli("report", small_set, "--no-plot-files")
    assert res.returncode == 0, res.stderr
    assert (victim / "file").read_text() == "victim's own"
    assert not (small_set / "report.html").is_symlink() and (small_set / "report.html").is_file()


@pytest.mark.slow
def test_plots_are_not_written_through_linked_files_or_a_linked_directory(small_set, victim, tmp_path):
    first = zcorch_cli("report", small_set)
    assert first.returncode == 0, first.stderr
    pngs = sorted(p.name for p in (small_set / "plots").iterdir())
    assert pngs
    for name in pngs:  # every plot file now a link to the victim
        (small_set / "plots" / name).unlink()
        (small_set / "plots" / name).symlink_to(victim / "file")
    res = zcorch_cli("report", small_set)
    assert res.returncode == 0, res.stderr
    assert (victim / "file").read_text() == "victim's own"
    assert all(not (small_set / "plots" / n).is_symlink() for n in pngs)
    # plots/ itself a link to the victim's directory: refused, nothing written there
    other = copy_result_set(small_set, tmp_path / "other")
    os.symlink(victim, other / "plots")
    res = zcorch_cli("report", other)
    assert res.returncode != 0 and "not followed" in res.stderr
    assert sorted(os.listdir(victim)) == ["file", "secret"]


@pytest.mark.slow
def test_a_linked_experiment_file_is_not_copied_into_the_report(small_set, victim):
    (small_set / "experiment.yaml").unlink()
    (small_set / "experiment.yaml").symlink_to(victim / "secret")
    res = zcorch_cli("report", small_set, "--no-plot-files")
    assert res.returncode == 0, res.stderr
    assert SECRET not in (small_set / "report.html").read_text()
    assert "symbolic link" in res.stderr
    # nor one the manifest names outside the set
    manifest = json.loads((small_set / "manifest.json").read_text())
    manifest["experiment_file"] = str(victim / "secret")
    (small_set / "manifest.json").write_text(json.dumps(manifest))
    res = zcorch_cli("report", small_set, "--no-plot-files")
    assert res.returncode == 0 and SECRET not in (small_set / "report.html").read_text()


@pytest.mark.slow
def test_a_linked_or_fifo_runs_file_is_refused(small_set, victim):
    (small_set / "runs.jsonl").rename(small_set / "real-runs.jsonl")
    (small_set / "runs.jsonl").symlink_to(small_set / "real-runs.jsonl")
    res = zcorch_cli("report", small_set, "--no-plot-files")
    assert res.returncode != 0 and "symbolic link" in res.stderr and "Traceback" not in res.stderr
    (small_set / "runs.jsonl").unlink()
    os.mkfifo(small_set / "runs.jsonl")  # would block a reader forever
    res = zcorch_process("report", small_set, "--no-plot-files", timeout=120)   # would hang: a process to time out
    assert res.returncode != 0 and "not a regular file" in res.stderr


def _peak_rss_mib_of(argv) -> "tuple[subprocess.CompletedProcess, float]":
    """Run argv; (its result, its peak resident memory in MiB) measured in a fresh child of its own."""
    probe = ("import resource, subprocess, sys, json\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "print(json.dumps({'rc': p.returncode, 'out': p.stdout, 'err': p.stderr,\n"
             "  'rss': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n")
    res = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=900,
                         cwd=ROOT)
    doc = json.loads(res.stdout)
    return subprocess.CompletedProcess(argv, doc["rc"], doc["out"], doc["err"]), doc["rss"]


@pytest.mark.slow   # a 2 GiB file read: the size is the hazard
def test_a_sparse_2gib_runs_file_costs_bounded_memory_and_is_reported(tmp_path):
    """The valid records before 2 GiB of NULs (one 'line', no newline) still load; the rest is
    skipped and said, and `history` stays far below the 2 GiB that holding the file would take."""
    root = tmp_path / "nightly"
    for night in range(3):
        write_sweep(root / f"n{night}" / "exp", "exp", night, [(READ, 10.0)])
    runs = root / "n2" / "exp" / "runs.jsonl"
    with open(runs, "r+b") as f:
        f.truncate(runs.stat().st_size + 2 * 1024 ** 3)  # sparse: no disk space used
    res, rss = _peak_rss_mib_of([sys.executable, "-m", "zcorch", "history", str(root)])
    assert res.returncode == 0, res.stderr
    assert "exp: 3 sweep(s)" in res.stdout
    assert "longer than" in res.stdout + res.stderr and "skipped" in res.stdout + res.stderr
    assert rss < 1024, f"peak RSS {rss:.0f} MiB"


def test_bounded_reader_limits_lines_and_records(tmp_path):
    (tmp_path / "f.jsonl").write_bytes(b'{"a": 1}\n' + b"x" * 100 + b"\n" + b'{"b": 2}\n' * 5)
    said = []
    got = list(setfiles.iter_lines(tmp_path, "f.jsonl", max_line=50, max_records=3, skipped=said.append))
    assert [n for n, _, _ in got] == [1, 3, 4]
    assert any("more than 3 records" in s for s in said) and any("longer than 50 bytes" in s for s in said)


def test_javascript_links_are_not_live_in_the_report_or_the_history_index(tmp_path):
    root = tmp_path / "nightly"
    for night in range(2):
        write_sweep(root / f"javascript:alert({night})" / "exp", "exp", night, [(READ, 10.0)])
    res = zcorch_cli("history", root)
    assert res.returncode == 0, res.stderr
    html = (root / "index.html").read_text()
    links = _hrefs(html)
    assert links and not [h for h in links if h.lower().startswith(("javascript:", "data:", "vbscript:"))], links
    assert any("javascript%3Aalert" in h for h in links)  # still a (relative) link to the directory


@pytest.mark.slow
def test_a_reference_url_must_be_http_and_never_becomes_a_javascript_link(write_yaml, small_set):
    from test_guards import refused
    path = write_yaml("""
        name: t
        reference:
          source: {title: x, url: "javascript:alert(1)"}
    """)
    problems = refused(path)
    assert len(problems) == 1 and f"{path}:3:" in problems[0] and "reference.source.url" in problems[0]
    # a stored set written before the rule: the page shows the text, not a link
    exp = (small_set / "experiment.yaml").read_text()
    (small_set / "experiment.yaml").write_text(exp + "\nreference:\n  source: {title: x, url: \"javascript:alert(1)\"}\n")
    res = zcorch_cli("report", small_set, "--no-plot-files")
    assert res.returncode == 0, res.stderr
    assert not [h for h in _hrefs((small_set / "report.html").read_text()) if "javascript" in h.lower()]
    from zcorch.analysis.links import href, path_href
    assert href("javascript:alert(1)") == "" and href(" JaVaScRiPt:x") == "" and href("https://a.b/c") == "https://a.b/c"
    assert href("//evil.example/x") == "" and href("data:text/html,x") == "" and href("rel/path") == ""
    assert path_href("javascript:x/") == "javascript%3Ax/" and path_href("/etc/passwd") == ""
