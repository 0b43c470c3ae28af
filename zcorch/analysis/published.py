"""The published table of reproductions (`zcorch reproductions DIR...`, docs/reproductions.md): per result set with a
`reference:`, the study's figures next to ours and its claims' verdicts (zcorch.analysis.reproduction's rows). The
same sets give the same bytes (no clock, no absolute path)."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterable, Optional

from zcorch.analysis import reproduction as rp
from zcorch.analysis.frames import load_baselines, read_experiment_text, read_manifest, read_meta, result_dir
from zcorch.analysis.load import load
import numpy as np
import pandas as pd

from zcorch.analysis.stats import CI, min_runs_for, varying_params
from zcorch.config.reference import LEVEL
from zcorch.config.sections import reference_of
from zcorch.errors import ConfigError
from zcorch.params import format_value
from zcorch.results import setfiles

TITLE = "# Reproductions: published figures next to ours"
# The figure columns of the report (reproduction.FIGURE_HEADER) this table keeps, in its order.
FIGURE_COLUMNS = ("published as", "published (study)", "measured (this run)", "measured ÷ published", "cell")
CLAIM_COLUMNS = ("claim (published finding)", "verdict", "conditions here", "evidence")
FIGURE_HEADERS_CELL = rp.FIGURE_HEADER.index("cell")
_HEADS = {"cell": "configuration (the cell that produced ours)", "measured (this run)": "ours (median, interval, n)",
          "measured ÷ published": "ours ÷ published"}


def _pick(header: "list[str]", rows: "list[list[str]]", columns: "tuple[str, ...]") -> "list[list[str]]":
    idx = [header.index(c) for c in columns]
    return [[r[i] for i in idx] for r in rows]


def _configuration(df, row: "rp.FigureRow") -> str:
    """What produced our number: the cell's varied parameters, bytes (or duration) and id; else the figure's match."""
    what = rp.figure_table([row])[0][FIGURE_HEADERS_CELL]
    cell = row.measured.cell
    if cell is None or df.empty or getattr(row.figure, "of", None):
        return what
    first = df[df["cell"] == cell].iloc[0]
    keys = [k for k in varying_params(df) if k in first.index]
    keys += [k for k in ("bytes", "duration") if k in first.index and k not in keys
             and format_value(k, first[k]) not in ("none", "")]
    return ", ".join(f"{k}={format_value(k, first[k])}" for k in keys) + f" (cell {cell})"


def _hosts_line(meta: dict) -> str:
    hosts = meta.get("hosts") or {}
    parts = []
    for role in ("sender", "receiver"):
        h = hosts.get(role) or {}
        if not h:
            continue
        kernel = (h.get("kernel") or {}).get("release") if isinstance(h.get("kernel"), dict) else h.get("kernel")
        mem = h.get("mem_total_bytes")
        iface = h.get("interface") or {}
        memory = f", {mem / 2**30:.0f} GiB" if mem else ""
        parts.append(f"{role}: {h.get('cpu_count') or '?'} CPUs{memory}, kernel {kernel or '?'}, "
                     f"link {iface.get('kind') or '?'} (MTU {iface.get('mtu') or '?'})")
    same = meta.get("same_host")
    return "; ".join(parts) + ("; one machine (both ends on one kernel)" if same else "")


def study_section(path) -> "tuple[str, list[rp.ClaimRow], str]":
    """(Markdown section, claim rows, study title) of one result set; ConfigError when it has no `reference:`."""
    d = result_dir(path)
    manifest = read_manifest(d)
    exp_file, text = read_experiment_text(d, manifest)
    ref = reference_of(text or "", str(exp_file))
    if ref is None:
        raise ConfigError(f"{d}: its experiment has no `reference:` section: no published study to table")
    df, baselines, meta = load(d), load_baselines(d), read_meta(d)
    hosts = rp.host_facts(meta)
    name = manifest.get("name") or d.name
    s = ref.source
    cite = ", ".join(x for x in (s.author, f"“{s.title}”", s.venue, s.date) if x)
    overrides = manifest.get("overrides") or []
    lines = [f"## {name}: {s.title}", "", f"Published: {cite}" + (f" — <{s.url}>" if s.url.startswith("http") else "")
             + ".", ""]
    if ref.setup:
        lines += [f"**The study's setup:** {' '.join(ref.setup.split())}", ""]
    if ref.units:
        lines += [f"**The study's units:** {' '.join(ref.units.split())}", ""]
    ok = int((df["status"] == "ok").sum()) if len(df) else 0
    lines += [f"**Ours:** result set `{d.name}` ({manifest.get('status')}, zcorch {manifest.get('zcorch_version')}), "
              f"{ok} of {len(df)} runs ok over {df['cell'].nunique() if len(df) else 0} cells"
              + (f", run with {' '.join(f'`--set {o}`' for o in overrides)}" if overrides else ", as the file says")
              + f". Hosts: {_hosts_line(meta) or 'not recorded'}.", ""]
    figs = rp.figures(df, baselines, ref) if len(df) and ref.figures else []
    if figs:
        table = rp.figure_table(figs)
        for row, fig in zip(table, figs):
            row[FIGURE_HEADERS_CELL] = _configuration(df, fig)
        lines += ["### Published figures and ours", ""] + rp.markdown_table(
            [_HEADS.get(c, c) for c in FIGURE_COLUMNS], _pick(rp.FIGURE_HEADER, table, FIGURE_COLUMNS))
    claims = rp.claims(df, ref, baselines, hosts) if len(df) else []
    if claims:
        lines += [f"### Claims ({rp.verdict_counts(claims)})", ""] + rp.markdown_table(
            list(CLAIM_COLUMNS), _pick(rp.CLAIM_HEADER, rp.claim_table(claims), CLAIM_COLUMNS))
    return "\n".join(lines), claims, name


def _size(nbytes) -> str:
    return format_value("bytes", int(nbytes)) if nbytes else "–"


def runs_row(path) -> "list[str]":
    """How a set was made, from the set itself: a row of RUNS_HEADER."""
    d = result_dir(path)
    manifest = read_manifest(d)
    _, text = read_experiment_text(d, manifest)
    ref = reference_of(text or "", "experiment.yaml")
    df = load(d)
    name = manifest.get("name") or d.name
    sizes = sorted({int(b) for b in df["bytes"].dropna()}) if "bytes" in df and len(df) else []
    here = ", ".join(_size(b) for b in sizes) or "–"
    ok = df[df["status"] == "ok"] if len(df) else df
    per_cell = ok.groupby("cell").size() if len(ok) else None
    runs = "–" if per_cell is None or per_cell.empty else (
        f"{per_cell.min()}" if per_cell.min() == per_cell.max() else f"{per_cell.min()}–{per_cell.max()}")
    idle = [v for side in ("send_host_idle_before", "recv_host_idle_before") if side in ok
            for v in pd.to_numeric(ok[side], errors="coerce").dropna()]
    busy = f"{(1 - float(np.median(idle))):.0%} busy (median of {len(idle)} probes)" if idle else "not probed"
    command = " ".join(str(a) for a in (manifest.get("command") or [])[1:])
    return [name, here, _size(ref.bytes) if ref is not None else "–", runs, busy, f"`zcorch {command}`" if command else "–"]


RUNS_HEADER = ["study", "bytes a transfer (here)", "the study's own", "ok runs a cell", "hosts before the runs",
               "command"]


def reproductions_markdown(paths: "Iterable[os.PathLike | str]", notes: str = "") -> str:
    """The whole document: a line per study, where verdicts differ, `notes`, then a section per result set."""
    sections, summary, differ, made = [], [], [], []
    paths = list(paths)
    for path in paths:
        made.append(runs_row(path))
        text, claims, name = study_section(path)
        sections.append(text)
        summary.append([name, result_dir(path).name, rp.verdict_counts(claims) if claims else "no claims"])
        differ += [f"- **{name}**: “{c.claim.says}” — {c.verdict_text}" for c in claims if c.verdict != rp.HOLDS]
    lines = [TITLE, "",
             "Generated by `zcorch reproductions` from the result sets named below (scripts/reproductions runs the "
             "studies and regenerates it); do not edit by hand. *Published* numbers are the studies', on their "
             "hardware; *ours* are medians of this machine's runs with order-statistic confidence intervals at the "
             f"level they really have (three runs: 75%; {CI:.0%} needs six). A claim holds or does not hold only "
             "when the two intervals are separated and each has at least the level its study declares "
             f"({LEVEL:.0%} unless it says otherwise: {min_runs_for(LEVEL)} runs a side); fewer runs leave it "
             "*inconclusive: needs N runs*. *Untestable here* means a condition of the study's setting or of the "
             "claim (zcorch/conditions.py: quiet hosts, one kernel, the link's kind, data against memory, md RAID, "
             "a source read from disk, the CPUs it pins) was not met by these runs (✓ met, ✗ not met, ? not "
             "recorded); a study's conditions apply to all of its claims.", ""]
    lines += ["| study | result set | verdicts |", "|---|---|---|"] + [f"| {a} | `{b}` | {c} |" for a, b, c in summary]
    lines += ["", "## Where the verdicts differ from the studies' text", "",
              "Each study says its claims hold; these do not, here:", ""] + (differ or ["- none"]) + [""]
    lines += ["## How these sets were made", "",
              "Generated from each set (its runs, manifest and hosts' records); the hosts' CPU before the runs is "
              "the workers' `idle_probe` just before each one started.", ""]
    lines += rp.markdown_table(RUNS_HEADER, made)
    if notes.strip():
        lines += [notes.strip(), ""]
    return "\n".join(lines + sections).rstrip("\n") + "\n"


# A number in prose: a token that begins with a digit (353, 1GiB, 0.87x, 2.6.33). Digits inside a word (ext4,
# RAID-5, sendfile-pinning-2001) name things and are allowed; every other figure comes from the sets.
_NUMBER = re.compile(r"(?<![\w-])\d[\w.,/%×–-]*")


def notes_figures(text: str) -> "list[tuple[int, str]]":
    """(line, token) of every number in hand-written notes: none is allowed (figures are generated)."""
    return [(i, m.group(0)) for i, line in enumerate(text.splitlines(), 1) for m in _NUMBER.finditer(line)]


def read_notes(path: "os.PathLike | str") -> str:
    """The hand-written notes file; ConfigError when it cannot be read or quotes a figure (only generated text may)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the notes: {exc}") from None
    found = notes_figures(text)
    if found:
        raise ConfigError([f"{path}:{line}: `{token}`: the notes may not quote a figure (every number of the "
                           "document is generated from the result sets it is given; say it in words)"
                           for line, token in found])
    return text


def write_reproductions(paths: "Iterable[os.PathLike | str]", out: "os.PathLike | str",
                        notes_file: "Optional[os.PathLike | str]" = None) -> Path:
    """Write the document to `out` through an exclusive temporary (never through a link at `out`)."""
    notes = read_notes(notes_file) if notes_file else ""
    text = reproductions_markdown(list(paths), notes)
    out = Path(out)   # its directory resolved, not the file: a link at `out` is replaced, never written through
    return setfiles.write_inside(out.parent.resolve(), out.name, text.encode("utf-8"))
