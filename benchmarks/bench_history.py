"""`zcorch history` of a lab's year through DuckDB: 50 pairs x 365 nights x 24 cells (budget,
docs/performance.md: the index and `--check` each under 15 s and 1 GiB of memory).

The dataset is synthesized in exactly the layout `zcorch export` writes: a real small result set (default
tests/data/quickstart-small, written by a real `zcorch run`) is exported with zcorch.analysis.export, and its
exported rows are the templates: every synthetic row is a copy of an exported one (same columns, same
types) with its set id, pair, cell, repeat and metric replaced. One part file per night per table (a nightly
`zcorch export` after a fleet run writes one per night), dataset.json listing every set. The throughput is a
seeded noise around a level per pair and cell; a few series get a step (so the detector has something to find).

Measured, each in a child process (wall time, CPU time and peak RSS from os.wait4's rusage of that child: on a
machine loaded by other work the wall time grows with the load, the CPU time much less):
  index   zcorch history DATASET -o OUT                 the page (per-cell trend plots included)
  check   zcorch history DATASET -o OUT --check         the gate (writes the page too)
  query   the DuckDB part alone: Dataset(...).sweeps() and ok_table() of every set
  peer    python -c "import pandas, duckdb, matplotlib": the imports any such command pays first
Printed: medians of --repeat runs, each against the budget (15 s, 1 GiB) and as a ratio to the peer.

    python benchmarks/bench_history.py [--pairs 50] [--nights 365] [--cells 24] [--repeats 5]
                                       [--repeat 1] [--source DIR] [--dir WORKDIR] [--keep]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from zcorch.analysis import dataset as layout  # noqa: E402
from zcorch.analysis.export import export_results  # noqa: E402

TARGET_S = 15.0
TARGET_RSS = 1 << 30
T0 = dt.datetime(2026, 1, 1, 3, 0, tzinfo=dt.timezone.utc)


def _read_table(dest: Path, table: str) -> pa.Table:
    return pa.concat_tables([pq.read_table(f, partitioning=None) for f in layout.Dataset(dest).files(table)])


def synthesize(source: Path, out: Path, pairs: int, nights: int, cells: int, repeats: int) -> None:
    """The dataset at `out` (module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        shutil.copytree(source, root / source.name,
                        ignore=lambda d, names: [n for n in names if n in ("runs.parquet", "report.html", "plots")])
        template_dir = Path(tmp) / "template"
        export_results(root, template_dir)
        doc = layout.read_manifest(template_dir)
        tpl = {t: _read_table(template_dir, t) for t in layout.TABLES}
    ok = tpl["runs"].filter(pc.equal(tpl["runs"].column("status"), "ok")).slice(0, 1)
    run_row, set_row, host_rows, base_rows = ok, tpl["sets"], tpl["hosts"], tpl["baselines"]
    manifest = json.loads(set_row.column("manifest")[0].as_py())
    experiment = manifest["name"]
    cell_ids = [f"c{c:02d}{'0' * 10}"[:12] for c in range(cells)]
    rng = np.random.default_rng(7)
    level = rng.uniform(5, 40, size=(pairs, cells))
    step_at = np.where(rng.random((pairs, cells)) < 0.05, rng.integers(nights // 2, nights, size=(pairs, cells)), nights + 1)
    per_night = pairs * cells * repeats
    sets_doc = {}
    out.mkdir(parents=True)
    part = "part-bench.parquet"

    def put(table: pa.Table, name: str, value) -> pa.Table:
        i = table.schema.get_field_index(name)
        return table.set_column(i, table.schema.field(i), pa.array(value, type=table.schema.field(i).type))

    for night in range(nights):
        created = T0 + dt.timedelta(days=night)
        partition = f"experiment={experiment}/date={created:%Y-%m-%d}"
        set_ids = [f"{p:04d}{night:04d}{'0' * 8}" for p in range(pairs)]
        pair_names = [f"pair{p:02d}" for p in range(pairs)]
        # runs: pairs x cells x repeats copies of one exported ok run
        runs = run_row.take(np.zeros(per_night, dtype=int))
        p_idx = np.repeat(np.arange(pairs), cells * repeats)
        c_idx = np.tile(np.repeat(np.arange(cells), repeats), pairs)
        lv = level[p_idx, c_idx] * np.where(night >= step_at[p_idx, c_idx], 0.9, 1.0)
        runs = put(runs, "set_id", [set_ids[p] for p in p_idx])
        runs = put(runs, "pair", [pair_names[p] for p in p_idx])
        runs = put(runs, "cell", [cell_ids[c] for c in c_idx])
        runs = put(runs, "repeat", np.tile(np.arange(repeats), pairs * cells))
        runs = put(runs, "gbit_s", lv * (1 + 0.01 * rng.standard_normal(per_night)))
        # sets: one per pair, the exported row with its manifest, plan and counts made this set's
        rows = []
        for p in range(pairs):
            m = dict(manifest, created=created.isoformat(), finished=(created + dt.timedelta(minutes=20)).isoformat(),
                     status="complete", inventory={"path": "/etc/zcorch/lab.yaml", "sha256": "0" * 64,
                                                   "pair": pair_names[p]})
            row = {k: v[0] for k, v in set_row.to_pydict().items()}
            row.update(set_id=set_ids[p], pair=pair_names[p], path=f"/srv/nightly/{created:%Y%m%d}/{pair_names[p]}",
                       status="complete", created=created, finished=created + dt.timedelta(minutes=20),
                       hosts=f"{pair_names[p]} (lab.yaml)", n_ok=cells * repeats, n_failed=0,
                       planned=cells * repeats, planned_ok=cells * repeats, cells_planned=cell_ids, cells_short=[],
                       manifest=json.dumps(m), linked_axes="{}")
            rows.append(row)
            sets_doc[set_ids[p]] = {"path": row["path"], "sha256": "0" * 64, "partition": partition, "part": part}
        sets = pa.Table.from_pylist(rows, schema=set_row.schema)
        hosts = host_rows.take(np.tile(np.arange(len(host_rows)), pairs))
        hosts = put(hosts, "set_id", np.repeat(set_ids, len(host_rows)))
        hosts = put(hosts, "pair", np.repeat(pair_names, len(host_rows)))
        base = base_rows.take(np.tile(np.arange(len(base_rows)), pairs))
        base = put(base, "set_id", np.repeat(set_ids, len(base_rows)))
        base = put(base, "pair", np.repeat(pair_names, len(base_rows)))
        for name, table in (("runs", runs), ("sets", sets), ("hosts", hosts), ("baselines", base)):
            (out / name / partition).mkdir(parents=True, exist_ok=True)
            pq.write_table(table, out / name / partition / part, compression="zstd")
    doc["sets"] = sets_doc
    layout.write_manifest(out, doc)


def measure(argv: list) -> "tuple[float, float, int, int, str]":
    """(wall s, CPU s (user + system), peak RSS bytes, exit code, last line) of a child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = "", ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = (out.strip().splitlines() or err.strip().splitlines() or [""])[-1]
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, proc.returncode, last


QUERY = """import sys, time
t = time.perf_counter()
from zcorch.analysis.dataset import Dataset
d = Dataset(sys.argv[1]); s = d.sweeps(); v = d.ok_table("gbit_s", [x.set_id for x in s])
print(f"{len(s)} sets, {v.num_rows} (set, cell) groups, {sum(v.column('n').to_pylist())} ok runs")
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--nights", type=int, default=365)
    ap.add_argument("--cells", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=5, help="runs per cell and night")
    ap.add_argument("--repeat", type=int, default=1, help="measurements of each command")
    ap.add_argument("--source", type=Path, default=ROOT / "tests" / "data" / "quickstart-small")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic dataset for the next invocation")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="bench-history-"))
    data = work / f"dataset-{args.pairs}x{args.nights}x{args.cells}x{args.repeats}"
    if not (data / layout.MANIFEST).exists():
        t = time.perf_counter()
        synthesize(args.source, data, args.pairs, args.nights, args.cells, args.repeats)
        size = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
        print(f"synthesized {args.pairs} pairs x {args.nights} nights x {args.cells} cells x {args.repeats} runs "
              f"= {args.pairs * args.nights * args.cells * args.repeats:,} runs, {size / 1e6:.0f} MB, in "
              f"{time.perf_counter() - t:.0f} s: {data}")
    zcorch = [sys.executable, "-m", "zcorch"]
    cases = {"peer": [sys.executable, "-c", "import pandas, duckdb, matplotlib.pyplot"],
             "query": [sys.executable, "-c", QUERY, str(data)],
             "index": zcorch + ["history", str(data), "-o", str(work / "site")],
             "check": zcorch + ["history", str(data), "-o", str(work / "site"), "--check"]}
    seen = {k: [] for k in cases}
    for _ in range(args.repeat):
        for name, argv in cases.items():   # interleaved
            wall, cpu, rss, code, last = measure(argv)
            seen[name].append((wall, cpu, rss))
            print(f"  {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {rss / 2**20:.0f} MiB, exit {code}: "
                  f"{last[:150]}", flush=True)
    print(f"\nmedians of {args.repeat} (the machine may be loaded by other work; load average now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs):")
    peer = statistics.median(w for w, _, _ in seen["peer"])
    for name, values in seen.items():
        wall = statistics.median(w for w, _, _ in values)
        cpu = statistics.median(c for _, c, _ in values)
        rss = statistics.median(r for _, _, r in values)
        print(f"  {name:6s} {wall:7.1f} s wall ({wall / TARGET_S:.2f}x the 15 s budget, {wall / peer:.1f}x the peer), "
              f"{cpu:5.1f} s CPU "
              f"({cpu / TARGET_S:.2f}x)   {rss / 2**20:6.0f} MiB ({rss / TARGET_RSS:.2f}x the 1 GiB target)")
    if not args.keep and args.dir is None:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
